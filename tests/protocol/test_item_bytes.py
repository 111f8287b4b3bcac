"""``Items.nbytes``: the wire bytes of received items, which rsnet's clients size their demand by.

Exact for BATCH frames and for NEXT frames that end with the received data, whatever the
chunking; never below the true size when NEXT frames of one stream are followed by another
stream's frames in the same data (those bytes then count for both).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsnet.protocol import Connection, Items

from .support import PROPERTY, subscribed


def sent_by_stream(sends: list[tuple[int, str, list[bytes]]]) -> tuple[bytes, dict[int, int], Connection]:
    """Have a server publish ``sends`` ((0 or 1 for the first or second stream, "next" or
    "batch", items)) to a client; returns the wire bytes, the true bytes per stream (by stream
    id) and the client, which has received nothing of them yet."""
    client, server, first = subscribed(demand=10**6)
    second = client.send_subscribe("other", initial_demand=10**6)
    server.receive_data(bytes(client.data_to_send()))
    server.send_accept(second)
    client.receive_data(bytes(server.data_to_send()))
    client.events_received()
    ids = (first, second)
    wire = bytearray()
    true: dict[int, int] = {first: 0, second: 0}
    for which, kind, items in sends:
        stream_id = ids[which]
        if kind == "next":
            for item in items:
                server.send_next(stream_id, item)
        else:
            server.send_batch(stream_id, items)
        frames = bytes(server.data_to_send())
        wire += frames
        true[stream_id] += len(frames)
    return bytes(wire), true, client


def received(client: Connection, wire: bytes, cuts: list[int]) -> dict[int, int]:
    """Feed ``wire`` to ``client`` cut at ``cuts``; the nbytes of its Items events per stream."""
    totals: dict[int, int] = {}
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        client.receive_data(wire[start:end])
        for event in client.events_received():
            assert isinstance(event, Items)
            totals[event.stream_id] = totals.get(event.stream_id, 0) + event.nbytes
    return totals


def cuts_of(wire_length: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, max(1, wire_length - 1)), max_size=8).map(sorted)


items = st.lists(st.binary(max_size=300), min_size=1, max_size=5)
one_stream = st.lists(st.tuples(st.just(0), st.sampled_from(["next", "batch"]), items), min_size=1, max_size=8)
two_streams = st.lists(st.tuples(st.sampled_from([0, 1]), st.sampled_from(["next", "batch"]), items), max_size=10)


@PROPERTY
@given(one_stream, st.data())
def test_one_streams_items_count_exactly_their_frames_however_the_bytes_are_cut(sends, data) -> None:
    wire, true, client = sent_by_stream(sends)
    totals = received(client, wire, data.draw(cuts_of(len(wire))))
    assert sum(totals.values()) == len(wire) == sum(true.values())


@PROPERTY
@given(two_streams, st.data())
def test_interleaved_streams_are_never_counted_below_their_frames(sends, data) -> None:
    wire, true, client = sent_by_stream(sends)
    totals = received(client, wire, data.draw(cuts_of(len(wire))))
    for stream_id, size in true.items():
        assert totals.get(stream_id, 0) >= size


def test_batch_frames_of_interleaved_streams_count_exactly() -> None:
    big, small = [b"x" * 100_000], [b"y"] * 50
    wire, true, client = sent_by_stream([(0, "batch", big), (1, "batch", small), (0, "batch", big)])
    totals = received(client, wire, [len(wire) // 3])
    assert totals == true
    assert min(totals.values()) < 200  # the 50 small items were not charged for the large ones
