"""``rsnet demo``: backpressure through the broker, live.

An embedded broker (in memory) hosts the topic ``sensors.kitchen`` under the
``backpressure`` policy with a lag bound of 500 records. A producer publishes as fast as the
broker asks it to; three subscribers read at different speeds: a fast one over TCP, a medium
one over WebSocket (2 ms per record) and a slow one over TCP (25 ms per record). Every half
second the demo prints what the producer has had stored and what each subscriber consumed,
with the broker's lag (records not yet sent to the subscriber furthest behind; the
subscribers' own prefetch buffers are not part of it, so "read" counts may trail by up to the
prefetch more). The producer runs at the pace of the slowest subscriber, whose lag stays within
the bound; when the slow subscriber leaves, the producer speeds up at once.
"""

from __future__ import annotations

import itertools

import trio

from ..broker.broker import Broker, TopicSettings
from ..broker.client import publish
from ..broker.topic import SlowPolicy
from ..net.client import connect
from ..net.server import Server

TOPIC = "sensors.kitchen"
MAX_LAG = 500
SPEEDS = {"fast": 0.0, "medium": 0.002, "slow": 0.025}


async def run_demo(seconds: float) -> None:
    broker = Broker(settings_for=lambda name: TopicSettings(policy=SlowPolicy.BACKPRESSURE, max_lag=MAX_LAG))
    server = Server(host=broker)
    consumed = {who: 0 for who in SPEEDS}
    produced = 0

    async def readings():
        nonlocal produced
        for seq in itertools.count():
            produced = seq + 1
            yield {"seq": seq, "celsius": 20 + (seq * 7 % 50) / 10}

    async def subscriber(url: str, who: str, scope: trio.CancelScope) -> None:
        with scope:
            async with connect(url) as conn:
                async for _ in conn.subscribe(TOPIC, {"from": "earliest"}, prefetch=64):
                    consumed[who] += 1
                    if SPEEDS[who]:
                        await trio.sleep(SPEEDS[who])

    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        broker.topic(TOPIC, create=True)  # the subscribers come first; only publishing would create it
        tcp = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        ws = await nursery.start(server.serve_websocket, "127.0.0.1", 0)
        urls = {"fast": f"tcp://127.0.0.1:{tcp}", "medium": f"ws://127.0.0.1:{ws}/", "slow": f"tcp://127.0.0.1:{tcp}"}
        print(
            f"broker on tcp://127.0.0.1:{tcp} and ws://127.0.0.1:{ws}/, topic {TOPIC!r}: "
            f"backpressure, at most {MAX_LAG} records of lag"
        )
        print("subscribers: fast (TCP), medium (WebSocket, 2 ms/record), slow (TCP, 25 ms/record)")
        print(
            "columns: records stored; records each subscriber has read; 'unsent': the broker's lag, "
            f"records stored but not yet sent to the subscriber furthest behind (bound {MAX_LAG}; "
            "each subscriber also holds up to 64 sent and not yet read: its prefetch)\n"
        )
        scopes = {who: trio.CancelScope() for who in SPEEDS}
        for who in SPEEDS:
            nursery.start_soon(subscriber, urls[who], who, scopes[who])
        while TOPIC not in broker.topics or len(broker.topics[TOPIC].readers) < len(SPEEDS):
            await trio.sleep(0.01)

        async def producer() -> None:
            async with connect(urls["fast"]) as conn:
                await publish(conn, TOPIC, readings(), producer="kitchen-sensor")

        nursery.start_soon(producer)
        topic = broker.topics[TOPIC]
        leave_at = int(seconds)  # half-ticks: the slow subscriber leaves half way
        last_stored = 0
        for tick in range(1, int(seconds * 2) + 1):
            await trio.sleep(0.5)
            if tick == leave_at:
                scopes["slow"].cancel()
                print("          --- the slow subscriber leaves ---")
            stored = topic.log.next_offset
            lags = sorted((reader.lag(topic) for reader in topic.readers), reverse=True)
            print(
                f"t={tick / 2:4.1f}s  stored {stored:>8,} (+{(stored - last_stored) * 2:>7,}/s)   "
                + "  ".join(f"{who} {consumed[who]:>8,}" for who in SPEEDS)
                + f"   unsent {lags[0] if lags else 0:>4}"
            )
            last_stored = stored
        nursery.cancel_scope.cancel()
    print(
        f"\nWhile the slow subscriber read, the producer ran at its pace and no subscriber "
        f"fell more than {MAX_LAG} records behind: the broker pulled from the producer only "
        f"what it could deliver. Once it left, the producer was asked for more at once."
    )
