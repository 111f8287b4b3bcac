"""An embedded broker on 127.0.0.1 for tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

import rsnet
from rsnet.broker.broker import Broker


@asynccontextmanager
async def broker_serving(broker: Broker, **server_settings: Any) -> AsyncIterator[tuple[str, rsnet.Server]]:
    """Run ``broker`` behind an rsnet server; yields its tcp:// URL and the server."""
    server = rsnet.Server(host=broker, **server_settings)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        port = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        try:
            yield f"tcp://127.0.0.1:{port}", server
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def broker_running(broker: Broker, **server_settings: Any) -> AsyncIterator[str]:
    """Run ``broker`` behind an rsnet server; yields its tcp:// URL."""
    async with broker_serving(broker, **server_settings) as (url, _):
        yield url


async def take(conn, name: str, count: int, /, **params: Any) -> list[dict]:
    """The first ``count`` items of a subscription to ``name``."""
    records = []
    async with conn.subscribe(name, params) as items:
        async for record in items:
            records.append(record)
            if len(records) == count:
                break
    return records


async def start_daemon(*args: str, announces: bytes) -> tuple[trio.Process, str]:
    """Start ``rsnet broker *args`` in a child process; return it and what it printed on
    stderr up to the line containing ``announces``."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "rsnet.cli", "broker", *args], stderr=subprocess.PIPE
    )
    printed = b""
    with trio.fail_after(20):
        while announces not in printed:
            data = await process.stderr.receive_some(4096)
            assert data, f"the broker exited: {printed.decode()}"
            printed += data
    return process, printed.decode()


def served_url(printed: str) -> str:
    """The URL of the first "serving ..." line the daemon printed."""
    return printed.split("serving ", 1)[1].split()[0]
