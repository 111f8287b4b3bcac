"""Hostile input: random and mutated byte streams (SPEC "Errors": a receiver never crashes).

Whatever arrives, ``Connection.receive_data`` returns normally, writes only well-formed frames,
and ends in a defined state; the decoder raises nothing but RemoteProtocolError and never
holds an unfinished frame of max_frame_size bytes or more. Termination is the "never hangs"
property: each example runs in milliseconds and pytest's timeout guards the suite.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rsnet.protocol import (
    MIN_MAX_FRAME_SIZE,
    Connection,
    FrameDecoder,
    Hello,
    LocalProtocolError,
    Offer,
    RemoteProtocolError,
    Request,
    Role,
    State,
    Subscribe,
    Welcome,
)

from .support import PROPERTY, decode, load

CONVERSATIONS = load("conversations.json")


def received(side: str) -> list[list[bytes]]:
    """Per conversation, the chunks ``side`` received, one per step: seeds for mutation.

    Fed one step at a time with the application answering in between, a seed drives the
    connection as deep as the recorded conversation went (streams open, demand granted).
    """
    seeds = [
        [bytes.fromhex(s["hex"]) for s in v["steps"] if s["step"] == "receive" and s["side"] == side]
        for v in CONVERSATIONS
    ]
    return [seed for seed in seeds if seed]


def app(conn: Connection) -> None:
    """A permissive application: accept the handshake and every stream, serve all demand."""
    for event in conn.events_received():
        if conn.state is State.CLOSED:
            return
        try:
            if isinstance(event, Hello):
                conn.send_welcome()
            elif isinstance(event, Welcome):
                for _ in range(3):
                    conn.send_subscribe("fuzz", initial_demand=2**63 - 1)
            elif isinstance(event, (Subscribe, Offer)):
                conn.send_accept(event.stream_id)
                if isinstance(event, Offer):
                    conn.send_request(event.stream_id, 10)
            elif isinstance(event, Request):
                for i in range(min(conn.outstanding_demand(event.stream_id), 5)):
                    conn.send_next(event.stream_id, i)
        except LocalProtocolError as exc:  # only "the peer's limits forbid it" may happen here
            assert exc.code in (4, 9, 10), exc


def feed(conn: Connection, chunks: list[bytes]) -> None:
    for chunk in chunks:
        conn.receive_data(chunk)
        app(conn)
    conn.receive_eof()
    app(conn)
    assert conn.state is State.CLOSED
    decode(bytes(conn.data_to_send()))  # everything we wrote is whole, valid frames


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.integers(0), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0), st.integers(1, 8)),
    st.tuples(st.just("truncate"), st.integers(0), st.just(0)),
    st.tuples(st.just("repeat"), st.integers(0), st.integers(1, 32)),
)


def mutate(data: bytes, mutations: list[tuple[str, int, Any]]) -> bytes:
    buf = bytearray(data)
    for kind, position, arg in mutations:
        at = position % (len(buf) + 1)
        if kind == "flip" and at < len(buf):
            buf[at] ^= arg
        elif kind == "insert":
            buf[at:at] = arg
        elif kind == "delete":
            del buf[at : at + arg]
        elif kind == "truncate":
            del buf[at:]
        elif kind == "repeat":
            buf[at:at] = buf[at : at + arg]
    return bytes(buf)


def client() -> Connection:
    conn = Connection(Role.CLIENT, max_frame_size=MIN_MAX_FRAME_SIZE)
    conn.data_to_send()
    return conn


def server() -> Connection:
    return Connection(Role.SERVER, max_frame_size=MIN_MAX_FRAME_SIZE, max_streams=4)


ENDS: dict[str, Callable[[], Connection]] = {"client": client, "server": server}


@PROPERTY
@given(st.sampled_from(["client", "server"]), st.data(), st.binary(max_size=300))
def test_random_bytes_in_any_state_never_escape_receive_data(side: str, data: st.DataObject, noise: bytes) -> None:
    seed = data.draw(st.sampled_from(received(side)))
    feed(ENDS[side](), [*seed[: data.draw(st.integers(0, len(seed)))], noise])


@PROPERTY
@given(st.sampled_from(["client", "server"]), st.data(), st.lists(mutation, min_size=1, max_size=4))
def test_mutated_conversations_never_escape_receive_data(
    side: str, data: st.DataObject, mutations: list[tuple[str, int, Any]]
) -> None:
    chunks = list(data.draw(st.sampled_from(received(side))))
    at = data.draw(st.integers(0, len(chunks) - 1))
    chunks[at] = mutate(chunks[at], mutations)
    feed(ENDS[side](), chunks)


@PROPERTY
@given(st.data(), st.lists(mutation, max_size=6), st.lists(st.integers(0), max_size=6))
def test_decoder_raises_only_protocol_errors_and_stays_bounded(
    data: st.DataObject, mutations: list[tuple[str, int, Any]], cuts: list[int]
) -> None:
    seed = data.draw(st.sampled_from(received("client") + received("server")))
    stream = mutate(b"".join(seed) * 3, mutations)
    decoder = FrameDecoder(MIN_MAX_FRAME_SIZE)
    bounds = sorted({0, len(stream), *[c % (len(stream) + 1) for c in cuts]})
    try:
        for a, b in itertools.pairwise(bounds):
            for _ in decoder.frames(stream[a:b]):
                pass
            assert decoder.buffered < MIN_MAX_FRAME_SIZE
    except RemoteProtocolError:
        pass
