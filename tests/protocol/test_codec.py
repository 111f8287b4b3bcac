"""Framing and encoding (SPEC "Framing", "Encoding"): round trips, chunking, the size limit."""

from __future__ import annotations

import sys
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsnet.protocol import (
    MIN_MAX_FRAME_SIZE,
    Connection,
    ErrorCode,
    FrameDecoder,
    LocalProtocolError,
    Next,
    RemoteProtocolError,
    encode_frame,
    parse_frame,
)
from rsnet.protocol.codec import MAX_IDLE_SCRATCH, PACKER_KEEP, SCRATCH_KEEP, scratch_packer
from rsnet.protocol.events import Items

from .strategies import frames
from .support import PROPERTY, subscribed, transfer


def decode_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[Any]:
    return [parse_frame(fields) for chunk in chunks for fields in decoder.frames(chunk)]


@PROPERTY
@given(frames)
def test_every_frame_type_round_trips(frame: Any) -> None:
    assert decode_all(FrameDecoder(), [encode_frame(frame)]) == [frame]


@PROPERTY
@given(st.lists(frames, min_size=1, max_size=8), st.data())
def test_frames_survive_any_split_of_the_byte_stream(sequence: list[Any], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(f) for f in sequence)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=False)]
    decoder = FrameDecoder()
    assert decode_all(decoder, chunks) == sequence
    assert decoder.buffered == 0


def test_a_frame_of_exactly_max_frame_size_is_accepted() -> None:
    limit = MIN_MAX_FRAME_SIZE
    overhead = len(encode_frame(Next(1, "")))
    frame = encode_frame(Next(1, "x" * (limit - overhead - 2)))  # str8 -> str16 adds 2 header bytes
    assert len(frame) == limit
    assert decode_all(FrameDecoder(limit), [frame[:100], frame[100:]]) == [Next(1, "x" * (limit - overhead - 2))]


def test_a_frame_one_byte_over_max_frame_size_is_too_large() -> None:
    limit = MIN_MAX_FRAME_SIZE
    frame = encode_frame(Next(1, "x" * (limit - len(encode_frame(Next(1, ""))) - 1)))
    assert len(frame) == limit + 1
    decoder = FrameDecoder(limit)
    with pytest.raises(RemoteProtocolError) as caught:
        decode_all(decoder, [frame])
    assert caught.value.code == ErrorCode.FRAME_TOO_LARGE


def test_frames_before_a_fault_are_delivered() -> None:
    decoder = FrameDecoder()
    got = []
    with pytest.raises(RemoteProtocolError) as caught:
        for fields in decoder.frames(encode_frame(Next(1, 1)) + b"\xc1"):
            got.append(fields)
    assert got == [[21, 1, 1]]
    assert caught.value.code == ErrorCode.PROTOCOL_ERROR


def test_decoder_never_holds_more_than_max_frame_size_of_an_unfinished_frame() -> None:
    # An array of 16383 two-byte ints is a legal header but a 32 KiB frame. Fed in socket-sized
    # chunks, the decoder must fail at the limit, having held less than the limit and allocated
    # a small multiple of it, never the whole 4 MiB stream.
    limit = MIN_MAX_FRAME_SIZE
    decoder = FrameDecoder(limit)
    stream = [b"\x93\x15\x01\xdc\x3f\xff"] + [b"\xcc\x01" * 2048] * 1024
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError) as caught:
            for chunk in stream:
                for _ in decoder.frames(chunk):
                    pass
                assert decoder.buffered < limit
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.code == ErrorCode.FRAME_TOO_LARGE
    assert peak < 16 * limit


def test_map_keys_other_than_strings_and_binary_are_refused() -> None:
    # Integer keys would let a peer choose hash collisions and make decoding quadratic.
    with pytest.raises(RemoteProtocolError) as caught:
        list(FrameDecoder().frames(msgpack.packb([21, 1, {1: "x"}])))
    assert caught.value.code == ErrorCode.PROTOCOL_ERROR
    # In the protocol's words, not msgpack's option name (attack round 6).
    assert str(caught.value).endswith("a map key that is not a string or binary (int; SPEC 3)"), str(caught.value)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xc1", "a byte no msgpack value starts with (0xc1 is never used)"),
        (b"\x91" * 100_000, "values nested deeper than the decoder's stack of 1,024 levels (SPEC 3 allows 512)"),
    ],
)
def test_bytes_that_are_not_msgpack_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    # msgpack's own exceptions for these say nothing: the CONN_ERROR message must.
    with pytest.raises(RemoteProtocolError) as caught:
        list(FrameDecoder().frames(data))
    assert (caught.value.code, caught.value.message) == (
        ErrorCode.PROTOCOL_ERROR,
        f"bytes are not a msgpack value: {reason}",
    )


def test_a_length_header_that_cannot_fit_is_too_large_at_once() -> None:
    # An array header of 2**31 elements: refused before anything is allocated for it.
    with pytest.raises(RemoteProtocolError) as caught:
        list(FrameDecoder(MIN_MAX_FRAME_SIZE).frames(b"\x93\x15\x01\xdd\x7f\xff\xff\xff"))
    assert caught.value.code == ErrorCode.FRAME_TOO_LARGE


def test_an_idle_decoder_holds_a_small_buffer_and_grows_only_for_large_frames():
    """Every connection has a decoder: msgpack would allocate max_frame_size (1 MiB) up front
    for each, idle or not (1,000 connections: 2 GB in one process with both ends)."""
    import tracemalloc

    from rsnet.protocol import FrameDecoder, encode_frame
    from rsnet.protocol.frames import Next

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        decoders = [FrameDecoder(1 << 20) for _ in range(20)]
        per_decoder = (tracemalloc.get_traced_memory()[0] - before) / len(decoders)
    finally:
        tracemalloc.stop()
    assert per_decoder < 96 * 1024, f"{per_decoder / 1024:.0f} KiB per idle decoder"
    big = encode_frame(Next(1, b"x" * 900_000))
    assert len(list(decoders[0].frames(big))) == 1  # the buffer grows for the frame that needs it


def test_decoders_taking_turns_count_their_own_stream_positions() -> None:
    """A decoder's unpacker goes back to the process's idle ones between frames, so the next
    decoder to receive bytes takes it: each still counts positions in its own byte stream."""
    first, second = FrameDecoder(), FrameDecoder()
    chunk = b"".join(encode_frame(Next(1, i)) for i in range(3))
    assert [f[2] for f in first.frames(chunk)] == [0, 1, 2]
    frame = encode_frame(Next(3, "x" * 100))
    assert list(second.frames(frame[:10])) == []
    assert second.position == 0 and second.buffered == 10
    assert list(first.frames(chunk)) != []  # the first decoder goes on meanwhile
    assert list(second.frames(frame[10:])) == [[21, 3, "x" * 100]]
    assert (second.position, second.buffered) == (len(frame), 0)
    assert (first.position, first.buffered) == (2 * len(chunk), 0)


def test_a_connection_keeps_no_packer_buffer_a_large_frame_grew() -> None:
    """A packer keeps the buffer of the largest value it packed, and a connection keeps its
    packer for life: 4 MiB of items sent in one BATCH call (packed whole, then split to fit
    the frame limit) stayed allocated per connection after they were sent (an attack's 8
    connections held 32 MB that no budget counted). Past PACKER_KEEP, a connection takes a
    new packer."""
    item = b"x" * 500_000

    def kept_after(send: Callable[[Connection, int], None]) -> int:
        """Bytes still allocated by 10 connections once each sent 8 items and its output was taken."""
        pairs = [subscribed(demand=8) for _ in range(10)]
        before = tracemalloc.get_traced_memory()[0]
        for _, server, stream_id in pairs:
            send(server, stream_id)
            server.data_to_send()
        return tracemalloc.get_traced_memory()[0] - before

    def one_at_a_time(server: Connection, stream_id: int) -> None:
        for _ in range(8):
            server.send_next(stream_id, item)

    tracemalloc.start()
    try:
        for send in (lambda server, stream_id: server.send_batch(stream_id, [item] * 8), one_at_a_time):
            kept = kept_after(send)
            assert kept < 10 * 2 * PACKER_KEEP, f"{kept / 1024:.0f} KiB kept by 10 connections"
    finally:
        tracemalloc.stop()


def received_items(client: Connection, server: Connection) -> list[Any]:
    return [item for event in transfer(server, client) if isinstance(event, Items) for item in event.items]


def test_a_batch_refused_halfway_leaves_nothing_in_the_scratch_packer() -> None:
    """A batch is packed whole in a scratch packer before any byte of it is written: a value
    msgpack refuses halfway through writes nothing, and the bytes packed before it must not
    lead the next batch, which takes the same packer."""
    client, server, stream_id = subscribed(demand=10)
    with pytest.raises(LocalProtocolError, match="not encodable as msgpack") as refused:
        server.send_batch(stream_id, [b"before", object(), b"after"])
    assert refused.value.code == ErrorCode.APPLICATION_ERROR
    assert server.buffered == 0
    server.send_batch(stream_id, [1, 2, 3])
    assert received_items(client, server) == [1, 2, 3]


def test_scratch_packers_are_bounded_and_none_keeps_a_grown_buffer() -> None:
    """Batches are packed in scratch packers shared by the process's connections: at most
    MAX_IDLE_SCRATCH of them are kept, each with a buffer of at most twice SCRATCH_KEEP (msgpack
    doubles a buffer it grows); a batch too large for one frame grows its packer past that, and
    that packer is dropped."""
    item = b"x" * 200_000
    _, server, stream_id = subscribed(demand=1_000, max_frame_size=8 << 20)
    _, server_small, small_id = subscribed(demand=1_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        taken = [scratch_packer() for _ in range(2 * MAX_IDLE_SCRATCH)]  # as many threads at once
        for scratch in taken:
            with scratch.pack([item] * 5) as view:  # 1 MB, within SCRATCH_KEEP: kept
                size = len(view)
            scratch.release(size)
        del taken, scratch  # beyond MAX_IDLE_SCRATCH, released ones are let go
        server.send_batch(stream_id, [item] * 20)  # 4 MB in one frame: its packer is dropped
        server_small.send_batch(small_id, [item] * 20)  # in frames of 1 MiB at most
        server.data_to_send(), server_small.data_to_send()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept <= MAX_IDLE_SCRATCH * 2 * SCRATCH_KEEP, f"{kept / 1024:.0f} KiB kept"


def test_threads_never_share_a_scratch_packer() -> None:
    """Connections in several threads (the blocking client's) pack batches at once: each
    take-pack-copy-release holds its packer alone, however the threads interleave."""
    errors: list[str] = []

    def sender(tag: int) -> None:
        client, server, stream_id = subscribed(demand=1_000_000)
        for round_ in range(300):
            batch = [f"{tag}-{round_}-{n}" for n in range(8)]
            server.send_batch(stream_id, batch)
            got = received_items(client, server)
            if got != batch:
                errors.append(f"thread {tag}, round {round_}: {got[:3]}")
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=sender, args=(tag,)) for tag in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


def test_idle_unpackers_are_bounded_and_none_keeps_a_grown_buffer() -> None:
    """Unpackers kept between frames (MAX_IDLE_UNPACKERS per frame size limit) hold their
    41 KiB parse stack and their initial buffer, never a buffer a large frame grew."""

    def kept_after(frame: bytes) -> int:
        """Bytes still allocated once 50 decoders, each in the middle of ``frame`` at once
        (so each holds an unpacker of its own), finished it and were dropped."""
        before = tracemalloc.get_traced_memory()[0]
        decoders = [FrameDecoder(1 << 20) for _ in range(50)]
        for decoder in decoders:
            assert list(decoder.frames(frame[: len(frame) // 2])) == []
        for decoder in decoders:
            assert len(list(decoder.frames(frame[len(frame) // 2 :]))) == 1
        del decoders
        return tracemalloc.get_traced_memory()[0] - before

    tracemalloc.start()
    try:
        after_big = kept_after(encode_frame(Next(1, b"x" * 900_000)))
        after_small = kept_after(encode_frame(Next(1, b"x" * 1000)))
    finally:
        tracemalloc.stop()
    assert after_big < 256 * 1024, f"{after_big / 1024:.0f} KiB kept after large frames"
    assert after_small < 16 * 64 * 1024, f"{after_small / 1024:.0f} KiB kept after small frames"
