"""Over-the-wire fuzzing: thousands of mutated frames from protocol/vectors/ against a real server.

Each case opens its own connection and sends the mutated bytes as its first bytes, in the same
write as a valid HELLO, or after the WELCOME; then it half-closes and reads until the server
closes. The sans-I/O
``Connection`` fed the same bytes is the oracle: where it detects a connection-level
violation, the real server must deliver CONN_ERROR with that code as its last frame and then
close with a FIN (not a reset); where it detects none, the server sends no CONN_ERROR. Meanwhile
a well-behaved client on another connection keeps subscribing and must never wait long, and the
server must still serve a fresh connection at the end (issue 10: "the server never dies, never
hangs a well-behaved client on another connection").

Deterministic: a fixed seed picks every mutation. About 2,000 cases in a few seconds.
"""

from __future__ import annotations

import json
import pathlib
import random
from typing import Any

import msgpack
import trio

import rsnet
from rsnet.protocol import Connection, ConnectionClosed, ConnError, Hello, Role

from .wire import WAIT, hello, serving, tcp_exchange, ws_exchange

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "protocol" / "vectors"
CASES = 2000
PARALLEL = 16
SEED = 20261122

INTERESTING_BYTES = [
    0x00,
    0x01,
    0x7F,
    0x80,
    0x90,
    0x9F,
    0xC0,
    0xC1,
    0xC2,
    0xC3,
    0xCC,
    0xCF,
    0xD3,
    0xDB,
    0xDD,
    0xDF,
    0xFF,
]
INTERESTING_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    2**63 - 1,
    2**64 - 1,
    -(2**63),
    1.5,
    "",
    "x" * 300,
    b"\x00",
    [],
    [None],
    {},
    {"k": None},
    {1: 2},
    [[[[[[]]]]]],
]


def seeds() -> list[bytes]:
    """Every single frame of frames.json, and every chunk a side receives in the conversations."""
    frames = [bytes.fromhex(v["hex"]) for v in json.loads((VECTORS / "frames.json").read_text())["vectors"]]
    chunks = [
        bytes.fromhex(step["hex"])
        for name in ("conversations.json", "invalid.json")
        for vector in json.loads((VECTORS / name).read_text())["vectors"]
        for step in vector["steps"]
        if step["step"] == "receive"
    ]
    return frames + chunks


def mutate(rng: random.Random, pool: list[bytes]) -> bytes:
    data = bytearray(rng.choice(pool))
    kind = rng.randrange(7)
    if kind == 0 and data:  # flip bits
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1 and data:  # an interesting byte somewhere
        data[rng.randrange(len(data))] = rng.choice(INTERESTING_BYTES)
    elif kind == 2:  # cut short
        del data[rng.randrange(len(data) + 1) :]
    elif kind == 3:  # bytes inserted
        at = rng.randrange(len(data) + 1)
        data[at:at] = bytes(rng.choice(INTERESTING_BYTES) for _ in range(rng.randint(1, 4)))
    elif kind == 4:  # two seeds spliced
        other = rng.choice(pool)
        data = data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]
    else:  # a field of a decoded frame replaced, dropped or added: well-formed msgpack, wrong frame
        try:
            fields = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
        except Exception:
            return bytes(data)
        if isinstance(fields, list) and fields:
            at = rng.randrange(len(fields))
            if kind == 5:
                fields[at] = rng.choice(INTERESTING_VALUES)
            elif rng.random() < 0.5:
                del fields[at]
            else:
                fields.append(rng.choice(INTERESTING_VALUES))
        data = bytearray(msgpack.packb(fields, use_bin_type=True))
    return bytes(data)


MODES = ("first", "with_hello", "after_welcome")
"""Where the mutated bytes go: as the connection's first bytes, in the same write as a valid
HELLO, or after the server's WELCOME."""


def sequence(mode: str, data: bytes) -> list[Any]:
    """The writes (TCP) or messages (WebSocket) of one case."""
    if mode == "first":
        return [data] if data else []
    return [hello() + data] if mode == "with_hello" else [hello(), WAIT, data]


def expected_conn_error(mode: str, data: bytes) -> int | None:
    """The code of the CONN_ERROR the server must send for ``data``, or None for none."""
    oracle = Connection(Role.SERVER)
    oracle.receive_data({"first": data, "with_hello": hello() + data}.get(mode, hello()))
    events = oracle.events_received()
    if mode == "after_welcome":
        assert isinstance(events[0], Hello)
        oracle.send_welcome()
        oracle.receive_data(data)
        events = oracle.events_received()
    closed = [e for e in events if isinstance(e, ConnectionClosed)]
    return closed[0].code if closed and not closed[0].by_peer else None


async def well_behaved_client(url: str, done: trio.Event, rounds: list[float]) -> None:
    """Subscribes again and again while the fuzzing runs; each round must finish promptly."""
    async with rsnet.connect(url) as conn:
        while not done.is_set():
            started = trio.current_time()
            with trio.fail_after(5):  # a hang on this connection fails the test
                items = [item async for item in conn.subscribe("range", {"count": 100})]
            assert items == list(range(100))
            rounds.append(trio.current_time() - started)
            await trio.sleep(0.01)


def make_cases(count: int, seed: int) -> list[tuple[str, bytes, int | None]]:
    """(where the bytes go, the mutated bytes, the CONN_ERROR code the oracle expects)."""
    rng = random.Random(seed)
    pool = seeds()
    cases = []
    for _ in range(count):
        mode = rng.choices(MODES, weights=(1, 2, 7))[0]
        data = mutate(rng, pool)
        cases.append((mode, data, expected_conn_error(mode, data)))
    violations = sum(code is not None for _, _, code in cases)
    assert violations > count // 3, "the mutations should mostly be violations"
    assert count - violations > count // 20, "and some should be valid"
    return cases


async def test_mutated_frames_over_tcp_never_kill_or_hang_the_server() -> None:
    cases = make_cases(CASES, SEED)

    mismatches: list[tuple[bytes, int | None, list[Any]]] = []
    rounds: list[float] = []
    done = trio.Event()
    limiter = trio.CapacityLimiter(PARALLEL)

    async def run_case(mode: str, data: bytes, code: int | None, port: int) -> None:
        async with limiter:
            received = await tcp_exchange(port, *sequence(mode, data), half_close=True)
        errors = [f for f in received.frames if isinstance(f, ConnError)]
        if code is None:
            ok = not errors
        else:
            ok = bool(errors) and received.frames[-1] is errors[0] and errors[0].code == code and received.clean_eof
        if not ok:
            mismatches.append((data, code, received.frames[-3:]))

    async with serving() as ports:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(well_behaved_client, f"tcp://127.0.0.1:{ports['tcp']}", done, rounds)
            with trio.fail_after(60):
                async with trio.open_nursery() as fuzzers:
                    for mode, data, code in cases:
                        fuzzers.start_soon(run_case, mode, data, code, ports["tcp"])
            done.set()
        # The server survived: a fresh connection is served as usual.
        async with rsnet.connect(f"tcp://127.0.0.1:{ports['tcp']}") as conn:
            assert [item async for item in conn.subscribe("range", {"count": 3})] == [0, 1, 2]
    assert not mismatches, f"{len(mismatches)} of {CASES} cases, e.g. {mismatches[:3]}"
    assert rounds, "the well-behaved client never completed a round"


async def test_mutated_frames_over_websocket_get_conn_error_and_a_closing_handshake() -> None:
    """The same over WebSocket, one binary message per case, fewer cases; every case must end
    with a close frame, never 1006. Where the oracle expects no violation the client starts the
    closing handshake itself right after its message (the server would wait for more); where
    it expects one, the server must answer and close first. (A client that sends its close
    frame together with a violation has said it is done: websockets, rightly, sends no data
    after answering a close, so that client gets no CONN_ERROR.)"""
    cases = make_cases(CASES // 4, SEED + 1)
    mismatches: list[tuple[bytes, int | None, list[Any], int | None]] = []
    limiter = trio.CapacityLimiter(PARALLEL)

    async def run_case(mode: str, data: bytes, code: int | None, port: int) -> None:
        async with limiter:
            received = await ws_exchange(port, *sequence(mode, data), close=code is None)
        errors = [f for f in received.frames if isinstance(f, ConnError)]
        if code is None:
            ok = not errors
        else:
            ok = bool(errors) and received.frames[-1] is errors[0] and errors[0].code == code
        if not ok or received.close_code is None:
            mismatches.append((data, code, received.frames[-3:], received.close_code))

    async with serving() as ports:
        with trio.fail_after(60):
            async with trio.open_nursery() as fuzzers:
                for mode, data, code in cases:
                    fuzzers.start_soon(run_case, mode, data, code, ports["ws"])
        async with rsnet.connect(f"ws://127.0.0.1:{ports['ws']}/") as conn:
            assert [item async for item in conn.subscribe("range", {"count": 3})] == [0, 1, 2]
    assert not mismatches, f"{len(mismatches)} of {len(cases)} cases, e.g. {mismatches[:3]}"
