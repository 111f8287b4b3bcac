"""One producer's offers are stored in the order it sent them (protocol/BROKER.md,
"Publishing"): deduplication keeps a producer's highest stored sequence, so a later offer
stored before an earlier one would make the earlier one's records duplicates, dropped and
acknowledged without being stored."""

from __future__ import annotations

from typing import Any

import pytest

import rsnet
from rsnet.broker.broker import DEFAULT_MAX_RECORD_BYTES, Broker
from rsnet.broker.client import publish
from rsnet.protocol import Complete, Error, ErrorCode, Next, Offer, Request

from .support import RawClient, broker_running


async def stored(conn: rsnet.Client, topic: str) -> list[Any]:
    end = {t["topic"]: t async for t in conn.subscribe("$topics")}[topic]["next_offset"]
    values = []
    async with conn.subscribe(topic, {"from": "earliest", "items": "arrays"}, prefetch=4096) as records:
        async for offset, _, value in records:
            values.append(value)
            if offset == end - 1:
                break
    return values


async def acknowledged(conn: rsnet.Client, topic: str, producer: str, sequence: int) -> None:
    """Returns once ``$acks`` says the producer's records up to ``sequence`` are stored."""
    async with conn.subscribe("$acks", {"producer": producer, "topic": topic}) as acks:
        async for ack in acks:
            if ack["sequence"] >= sequence:
                return


async def offer_eagerly(client: RawClient, offers: dict[int, list[Any]], complete: bool = True) -> dict[int, Any]:
    """Send each offer's records as soon as it has demand, whichever offer it is for (as a
    client sharing its connection between tasks does), then COMPLETE unless not ``complete``;
    returns how each offer ended: "complete", or the broker's ERROR."""
    ended: dict[int, Any] = {}
    while len(ended) < len(offers):
        frame = await client.next_frame()
        assert frame is not None
        if isinstance(frame, Request):
            records = offers[frame.stream_id]
            batch, offers[frame.stream_id] = records[: frame.n], records[frame.n :]
            frames: list[Any] = [Next(frame.stream_id, record) for record in batch]
            if complete and not offers[frame.stream_id]:
                frames.append(Complete(frame.stream_id))
                ended[frame.stream_id] = "complete"
            await client.send(*frames)
        elif isinstance(frame, Error):
            ended[frame.stream_id] = frame
    return ended


async def test_pipelined_offers_of_one_producer_are_stored_in_the_order_they_were_offered():
    # Attack round 4's re-check: offers of one producer sent one right after the other, the
    # first longer than what one grant lets through. The second had demand at once; its
    # records (2000..2009) were stored while the first's 1024..1999 were still on their way,
    # which were then dropped as duplicates and acknowledged.
    broker = Broker(sink_window=1024)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        client = await RawClient.connect(url)
        await client.send(
            Offer(1, "t", {"producer": "p", "sequence": 0}, {}),
            Offer(3, "t", {"producer": "p", "sequence": 2000}, {}),
        )
        ended = await offer_eagerly(client, {1: list(range(2000)), 3: list(range(2000, 2010))})
        assert ended == {1: "complete", 3: "complete"}
        await acknowledged(conn, "t", "p", 2009)
        assert await stored(conn, "t") == list(range(2010))
        await client.aclose()


async def test_offers_of_different_producers_on_one_connection_do_not_wait_for_each_other():
    broker = Broker(sink_window=16)
    async with broker_running(broker) as url:
        client = await RawClient.connect(url)
        await client.send(Offer(1, "t", {"producer": "p"}, {}), Offer(3, "t", {"producer": "q"}, {}))
        granted = {(await client.frame_of(Request, 1)).stream_id, (await client.frame_of(Request, 3)).stream_id}
        assert granted == {1, 3}
        await client.aclose()


async def test_an_offer_of_the_same_producer_on_another_connection_is_not_held_back():
    # A producer that reconnects while its old connection is not yet known dead (up to three
    # keepalive intervals) must not wait for it; two attempts of one task (a Spark retry)
    # send the same records under the same keys, deduplicated whichever is first.
    broker = Broker(sink_window=16)
    async with broker_running(broker) as url:
        old, new = await RawClient.connect(url), await RawClient.connect(url)
        await old.send(Offer(1, "t", {"producer": "p"}, {}))
        await old.frame_of(Request, 1)
        await new.send(Offer(1, "t", {"producer": "p"}, {}))
        assert isinstance(await new.frame_of(Request, 1), Request)
        await old.aclose()
        await new.aclose()


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
async def test_an_offer_pipelined_after_a_refused_record_is_refused_so_the_resend_is_stored(tmp_path, durable):
    # An offer refused for a record it cannot store (too large) stored nothing from that
    # record on; an offer pipelined after it, stored, would have made the resend duplicates.
    broker = Broker(data_dir=tmp_path if durable else None)
    too_large = b"x" * (DEFAULT_MAX_RECORD_BYTES - 10)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        client = await RawClient.connect(url)
        await client.send(
            Offer(1, "t", {"producer": "p", "sequence": 0}, {}),
            Offer(3, "t", {"producer": "p", "sequence": 3}, {}),
        )
        ended = await offer_eagerly(client, {1: [0, 1, too_large], 3: [3, 4]}, complete=False)
        assert ended[1].code == ended[3].code == ErrorCode.REJECTED
        resume = ended[3].data["sequence"]  # 0 or 2: whether 0 and 1 were stored before it
        assert ended[3].data == {"topic": "t", "producer": "p", "sequence": resume} and resume in (0, 2)
        await client.aclose()
        values = [0, 1, 2, 3, 4]
        await publish(conn, "t", values[resume:], producer="p", first_sequence=resume)  # the resend
        assert await stored(conn, "t") == values


async def test_an_offer_past_a_refused_producers_resume_point_is_refused_before_a_record_is_asked_for():
    """Found by a client written from the documents alone: such an offer was ACCEPTed and given
    demand, and refused only once its records came, so a producer that sent its records and
    COMPLETE at once never saw that offer's refusal (it came after the stream had closed).
    The refusal of an unstorable record now says where to resume, too."""
    too_large = b"x" * (DEFAULT_MAX_RECORD_BYTES - 10)
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        client = await RawClient.connect(url)
        await client.send(Offer(1, "t", {"producer": "p", "sequence": 0}, {}))
        ended = await offer_eagerly(client, {1: [0, 1, too_large]}, complete=False)
        resume = ended[1].data["sequence"]  # 0 or 2: whether 0 and 1 were stored in a batch before it
        assert ended[1].code == ErrorCode.REJECTED and ended[1].data == {
            "topic": "t",
            "producer": "p",
            "sequence": resume,
        }
        await client.send(Offer(3, "t", {"producer": "p", "sequence": resume + 1}, {}))
        refused = await client.next_frame()  # not ACCEPT, not REQUEST: the answer to the OFFER
        assert isinstance(refused, Error) and refused.stream_id == 3 and refused.code == ErrorCode.REJECTED
        assert refused.data == {"topic": "t", "producer": "p", "sequence": resume}
        assert f"offer again from sequence {resume}, not {resume + 1}" in refused.message
        await client.aclose()
        await publish(conn, "t", [0, 1, 2][resume:], producer="p", first_sequence=resume)  # the resend
        assert await stored(conn, "t") == [0, 1, 2]
