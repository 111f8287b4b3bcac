"""Built-in demo publishers, hosted by ``rsnet serve --demo``.

- ``range`` (``start``, ``count``): ``count`` consecutive integers from ``start``.
- ``ticks`` (``interval`` seconds, default 1.0): an endless counter, one tick per interval.
- ``fail`` (``n``, default 0): emits ``0 .. n-1``, then fails with an application error.
"""

from __future__ import annotations

import itertools

import pydantic
import trio

from .. import streams
from ..errors import StreamError
from ..net.server import Server
from ..net.session import StreamContext
from ..protocol import ErrorCode


class RangeParams(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    start: int = 0
    count: pydantic.NonNegativeInt


class TicksParams(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    interval: pydantic.PositiveFloat = 1.0


class FailParams(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    n: pydantic.NonNegativeInt = 0


def range_publisher(params: RangeParams, ctx: StreamContext) -> streams.Publisher[int]:
    return streams.range_(params.start, params.count)


def ticks_publisher(params: TicksParams, ctx: StreamContext) -> streams.Publisher[int]:
    async def ticks():
        for tick in itertools.count():
            yield tick
            await trio.sleep(params.interval)

    return streams.from_async_iterable(ticks, nursery=ctx.nursery)


def fail_publisher(params: FailParams, ctx: StreamContext) -> streams.Publisher[int]:
    message = f"failed after {params.n} item{'' if params.n == 1 else 's'}, as asked"
    return streams.ops.concat(
        streams.range_(0, params.n),
        streams.error(lambda: StreamError(ErrorCode.APPLICATION_ERROR, message)),
    )


def add_demo_publishers(server: Server) -> Server:
    """Register ``range``, ``ticks`` and ``fail`` on ``server``."""
    server.add_publisher("range", range_publisher, params=RangeParams)
    server.add_publisher("ticks", ticks_publisher, params=TicksParams)
    server.add_publisher("fail", fail_publisher, params=FailParams)
    return server
