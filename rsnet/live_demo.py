"""``rsnet demo``: backpressure across the network, live.

One server hosts ``sensor``, a producer that would run as fast as the CPU allows. Two clients
subscribe: a fast one over TCP and a slow one over WebSocket that takes 0.2 s per reading.
Every half second the demo prints, for each subscription, how many readings its producer has
produced and how many the client has consumed: the producer of the slow subscription stays
within its client's prefetch, because demand crosses the network and the producer only runs
when asked.
"""

from __future__ import annotations

import itertools

import trio

from . import streams
from .client import connect
from .server import Server

FAST_PREFETCH = 256
SLOW_PREFETCH = 8


async def run_demo(seconds: float) -> None:
    produced: dict[str, int] = {}
    consumed: dict[str, int] = {"fast": 0, "slow": 0}
    server = Server()

    @server.publisher("sensor")
    def sensor(params, ctx):
        who = params["who"]

        async def readings():
            for seq in itertools.count():
                produced[who] = seq + 1
                yield {"seq": seq, "celsius": 20 + (seq * 7 % 50) / 10}

        return streams.from_async_iterable(readings, nursery=ctx.nursery)

    async def consume(url: str, who: str, prefetch: int, delay: float) -> None:
        async with connect(url) as conn:
            async for _ in conn.subscribe("sensor", prefetch=prefetch, who=who):
                consumed[who] += 1
                if delay:
                    await trio.sleep(delay)
                else:
                    await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        tcp = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        ws = await nursery.start(server.serve_websocket, "127.0.0.1", 0)
        print(f"server on tcp://127.0.0.1:{tcp} and ws://127.0.0.1:{ws}/ hosting 'sensor'")
        print(f"fast client: TCP, prefetch {FAST_PREFETCH}; slow client: WebSocket, prefetch {SLOW_PREFETCH}, 0.2 s per item\n")
        async with trio.open_nursery() as clients:
            clients.start_soon(consume, f"tcp://127.0.0.1:{tcp}", "fast", FAST_PREFETCH, 0.0)
            clients.start_soon(consume, f"ws://127.0.0.1:{ws}/", "slow", SLOW_PREFETCH, 0.2)
            worst = 0
            for tick in range(1, int(seconds * 2) + 1):
                await trio.sleep(0.5)
                lines = []
                for who, prefetch in (("fast", FAST_PREFETCH), ("slow", SLOW_PREFETCH)):
                    ahead = produced.get(who, 0) - consumed[who]
                    if who == "slow":
                        worst = max(worst, ahead)
                    lines.append(
                        f"{who}: consumed {consumed[who]:>9,}  produced {produced.get(who, 0):>9,}  "
                        f"ahead {ahead:>4} (prefetch {prefetch})"
                    )
                print(f"t={tick / 2:4.1f}s  " + "   |   ".join(lines), flush=True)
            clients.cancel_scope.cancel()
        await server.shutdown(grace=1)
        nursery.cancel_scope.cancel()
    print(
        f"\nThe slow subscriber's producer was never more than {worst} readings ahead of its "
        f"consumer (prefetch {SLOW_PREFETCH}): demand crossed the network, the producer ran only when asked."
    )
