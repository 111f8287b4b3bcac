"""A record is stored only if every subscriber can be sent it: SPEC 3 lets a frame nest at most
512 levels (receivers may refuse deeper ones, and the JavaScript client does, ending its
connection), and the broker delivers a value three levels down (frame, item list, record).

Found by attacking a real broker: a producer's NEXT frame of 511 levels (within the limit) was
stored, and every JavaScript subscriber of the topic, the browser's live view among them, then
lost its connection to "values nest deeper than 512 levels".
"""

from __future__ import annotations

from typing import Any

import pytest

import rsnet
from rsnet.broker.broker import Broker
from rsnet.broker.client import publish
from rsnet.broker.storage.records import MAX_VALUE_LEVELS
from rsnet.protocol import Error, ErrorCode, Next, Offer, Request, Subscribe
from rsnet.protocol.frames import Batch, frame_fields

from ..broker.support import RawClient, broker_running, take

SPEC_MAX_LEVELS = 512
"""SPEC 3: values nest at most this deep, the frame's own array counting as one."""


def nested(levels: int) -> Any:
    """A value of ``levels`` levels: lists around an integer (which is a level, as SPEC counts)."""
    value: Any = 1
    for _ in range(levels - 1):
        value = [value]
    return value


def levels(value: Any) -> int:
    """How deep ``value`` nests, a scalar counting as one level (iteratively: values are deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
        elif isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
    return deepest


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
async def test_a_record_too_deep_to_deliver_is_rejected_and_the_acknowledged_ones_are_kept(tmp_path, durable):
    assert levels([21, 1, nested(MAX_VALUE_LEVELS + 1)]) < SPEC_MAX_LEVELS  # the producer breaks no rule
    async with broker_running(Broker(data_dir=tmp_path if durable else None)) as url:
        producer = await RawClient.connect(url)
        await producer.send(Subscribe(1, "$acks", {"producer": "p", "topic": "deep"}, 10, {}))
        await producer.send(Offer(3, "deep", {"producer": "p"}, {}))
        assert (await producer.frame_of(Request, 3)).n >= 2
        await producer.send(Next(3, nested(MAX_VALUE_LEVELS)))
        ack = await producer.frame_of((Next, Batch), 1)
        assert (ack.items if isinstance(ack, Batch) else [ack.item]) == [
            {"topic": "deep", "producer": "p", "sequence": 0}
        ]
        await producer.send(Next(3, nested(MAX_VALUE_LEVELS + 1)))
        refused = await producer.frame_of(Error, 3)
        assert refused.code == ErrorCode.REJECTED
        assert f"nests deeper than {MAX_VALUE_LEVELS} levels" in refused.message
        assert refused.data == {"topic": "deep", "producer": "p", "sequence": 1}  # where it resumes

        # The deepest record that can be delivered was stored, and reaches a subscriber in
        # frames within the spec's limit, in every shape of item.
        for shape in ("maps", "arrays", "stored"):
            reader = await RawClient.connect(url)
            await reader.send(Subscribe(1, "deep", {"from": "earliest", "items": shape}, 10, {}))
            delivered = await reader.frame_of(Batch, 1)
            assert len(delivered.items) == 1
            assert levels(frame_fields(delivered)) == SPEC_MAX_LEVELS
            await reader.aclose()

        # The topic and the broker carry on: another producer stores after it.
        async with rsnet.connect(url) as conn:
            assert await publish(conn, "deep", ["next"], producer="q") == 1
            records = await take(conn, "deep", 2, **{"from": "earliest"})
            assert [r["value"] for r in records] == [nested(MAX_VALUE_LEVELS), "next"]
        await producer.aclose()


async def test_a_deep_map_is_measured_as_a_list_is():
    value: Any = "leaf"
    for _ in range(MAX_VALUE_LEVELS):  # MAX_VALUE_LEVELS maps around a string: one level too many
        value = {"k": value}
    async with broker_running(Broker()) as url:
        producer = await RawClient.connect(url)
        await producer.send(Offer(1, "deep", {"producer": "p"}, {}))
        await producer.frame_of(Request, 1)
        await producer.send(Next(1, value))
        refused = await producer.frame_of(Error, 1)
        assert refused.code == ErrorCode.REJECTED
        await producer.aclose()
