"""Type-checked by ``make test`` (mypy, pyproject's ``files``), never run: the public API used as
the README and docstrings show it, so a type that contradicts its documentation fails the build
(an outside check: ``aclosing(follow(...))``, when ``follow`` was an async generator, and a
blocking ``subscribe(...).close()`` were errors under mypy)."""

from __future__ import annotations

from typing import Any

import rsnet
import rsnet.sync
from rsnet.broker.client import commit, follow, publish


async def trio_client(url: str) -> list[Any]:
    async with rsnet.connect(url) as conn:
        taken = [item async for item in conn.subscribe("range", {"count": 3}, prefetch=8)]
        await publish(conn, "orders", [{"id": 1}], producer="shop")
        await commit(conn, "orders", "billing", 1)
    async with follow(url, "orders", start="earliest", cursor="billing") as records:
        async for record in records:
            taken.append(record["value"])
            break
    return taken


def blocking_client(url: str) -> list[Any]:
    with rsnet.sync.connect(url) as client:
        items = client.subscribe("range", {"count": 10})
        first = [next(items), next(items)]
        items.close()  # cancels the stream (its docstring says so)
        return first


def errors(error: rsnet.RsnetError) -> str:
    if isinstance(error, rsnet.StreamError):
        return f"{error.code} {error.code_name} {error.message} {error.data}"
    if isinstance(error, rsnet.ConnectionLost):
        return f"{error.code}"
    return str(error)
