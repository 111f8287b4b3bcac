"""Write the golden vectors of protocol/SPEC.md: frames.json, conversations.json, invalid.json.

Run from the repository root:  .venv/bin/python protocol/vectors/generate.py

The JSON files are the contract; tests check rsnet against them and never regenerate them.
Every vector is written by hand below. Frame bytes come from this file's own copy of the
SPEC's layout table, not from rsnet's encoder; conversations and invalid inputs are played
through rsnet's Connection, and the script stops if rsnet does not produce exactly the
frames and events written here. Read the vector format in protocol/vectors/README.md.
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import msgpack

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from rsnet.protocol import (
    Connection,
    ConnectionClosed,
    FrameDecoder,
    Items,
    Role,
    frame_fields,
    parse_frame,
)

HERE = pathlib.Path(__file__).parent
MAX = 2**63 - 1

# SPEC "Frames": type number and field names in wire order.
LAYOUT: dict[str, tuple[int, tuple[str, ...]]] = {
    "HELLO": (1, ("magic", "versions", "settings")),
    "WELCOME": (2, ("version", "settings")),
    "PING": (3, ("token",)),
    "PONG": (4, ("token",)),
    "GO_AWAY": (5, ("message",)),
    "CONN_ERROR": (6, ("code", "message", "data")),
    "SUBSCRIBE": (16, ("stream_id", "name", "params", "initial_demand", "metadata")),
    "OFFER": (17, ("stream_id", "name", "params", "metadata")),
    "ACCEPT": (18, ("stream_id", "metadata")),
    "REQUEST": (19, ("stream_id", "n")),
    "CANCEL": (20, ("stream_id",)),
    "NEXT": (21, ("stream_id", "item")),
    "BATCH": (22, ("stream_id", "items")),
    "COMPLETE": (23, ("stream_id",)),
    "ERROR": (24, ("stream_id", "code", "message", "data")),
}
NAMES = {number: name for name, (number, _) in LAYOUT.items()}

# SPEC "Error codes"
PROTOCOL_ERROR, FLOW_CONTROL, INVALID_REQUEST, FRAME_TOO_LARGE = 1, 2, 3, 4
UNSUPPORTED_VERSION, UNAUTHORIZED, UNKNOWN_PUBLISHER, REJECTED = 5, 6, 7, 8
TOO_MANY_STREAMS, GOING_AWAY, TIMEOUT, INTERNAL, APPLICATION_ERROR = 9, 10, 11, 12, 4096

CLIENT_SETTINGS = {"max_frame_size": 1048576, "max_streams": 1024, "keepalive_interval": 20000}


def frame(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, **fields}


def wire_fields(f: dict[str, Any]) -> list[Any]:
    number, names = LAYOUT[f["type"]]
    return [number, *[f[name] for name in names]]


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def tag(value: Any) -> Any:
    """A msgpack value as JSON (README "Values"): ints beyond 2**53, binary and ext are tagged."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if isinstance(value, int):
        return int(value) if abs(value) < 2**53 else {"$int": str(value)}
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, msgpack.ExtType):
        return {"$ext": [value.code, value.data.hex()]}
    if isinstance(value, msgpack.Timestamp):
        return {"$ext": [-1, value.to_bytes().hex()]}
    if isinstance(value, (list, tuple)):
        return [tag(v) for v in value]
    if isinstance(value, dict):
        return {k: tag(v) for k, v in value.items()}
    raise TypeError(value)


def structure(f: Any) -> dict[str, Any]:
    """An rsnet frame object as the vectors write frames: {"type": NAME, field: value...}."""
    fields = frame_fields(f)
    return {"type": NAMES[fields[0]], **dict(zip(LAYOUT[NAMES[fields[0]]][1], fields[1:], strict=False))}


def event_json(event: Any) -> list[dict[str, Any]]:
    """rsnet events as the vectors write them; Items become one NEXT event per item."""
    if isinstance(event, Items):
        return [{"event": "NEXT", "stream_id": event.stream_id, "item": item} for item in event.items]
    if isinstance(event, ConnectionClosed):
        return [
            {
                "event": "CLOSED",
                "code": event.code,
                "message": event.message,
                "data": event.data,
                "by_peer": event.by_peer,
            }
        ]
    s = structure(event)
    return [{"event": s.pop("type"), **s}]


def matches(expected: dict[str, Any], actual: dict[str, Any]) -> bool:
    """Keys missing from ``expected`` are not compared (e.g. messages this side writes)."""
    return all(key in actual and tag(actual[key]) == tag(value) for key, value in expected.items())


def decode_all(data: bytes) -> list[dict[str, Any]]:
    out = []
    for fields in FrameDecoder().frames(data):
        out.append(structure(parse_frame(fields)))
    return out


# ---------------------------------------------------------------- frames.json


def frame_vectors() -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = []

    def add(name: str, f: dict[str, Any], note: str = "") -> None:
        fields = wire_fields(f)
        vectors.append(
            {
                "name": name,
                **({"note": note} if note else {}),
                "frame": tag(f),
                "fields": tag(fields),
                "hex": pack(fields).hex(),
            }
        )

    def decode_only(name: str, data: bytes, f: dict[str, Any] | None, note: str) -> None:
        vectors.append({"name": name, "note": note, "decode_only": True, "frame": tag(f), "hex": data.hex()})

    add(
        "hello_minimal",
        frame("HELLO", magic="rsnet", versions=[1], settings={}),
        "every setting absent means its default",
    )
    add(
        "hello_full",
        frame(
            "HELLO",
            magic="rsnet",
            versions=[2, 1],
            settings={**CLIENT_SETTINGS, "auth_token": "s3cret", "metadata": {"client": "rsnet-js/0.1"}},
        ),
        "a client speaking v2 and v1; the server picks the highest version it also speaks",
    )
    add("hello_binary_token", frame("HELLO", magic="rsnet", versions=[1], settings={"auth_token": b"\x00\xff"}))
    add("welcome", frame("WELCOME", version=1, settings={**CLIENT_SETTINGS, "metadata": {"server": "rsnet-py"}}))
    add("ping_zero", frame("PING", token=0))
    add("ping_max_token", frame("PING", token=MAX))
    add("pong", frame("PONG", token=7))
    add("go_away", frame("GO_AWAY", message="shutting down"))
    add(
        "conn_error_unsupported_version",
        frame("CONN_ERROR", code=UNSUPPORTED_VERSION, message="no common version", data={"versions": [1]}),
    )
    add("conn_error_no_data", frame("CONN_ERROR", code=TIMEOUT, message="no HELLO in 10 s", data=None))
    add(
        "subscribe",
        frame(
            "SUBSCRIBE",
            stream_id=1,
            name="ticks",
            params={"symbol": "ACME"},
            initial_demand=16,
            metadata={"content_type": "application/msgpack"},
        ),
    )
    add(
        "subscribe_minimal",
        frame("SUBSCRIBE", stream_id=3, name="t", params=None, initial_demand=0, metadata={}),
        "params nil, no initial demand",
    )
    add(
        "subscribe_unbounded",
        frame("SUBSCRIBE", stream_id=5, name="all", params=[1, 2], initial_demand=MAX, metadata={}),
        "2**63-1 is unbounded demand",
    )
    add(
        "offer",
        frame("OFFER", stream_id=2, name="orders", params=None, metadata={"content_type": "application/json"}),
        "server-opened streams have even ids",
    )
    add("accept", frame("ACCEPT", stream_id=1, metadata={}))
    add("accept_metadata", frame("ACCEPT", stream_id=1, metadata={"content_type": "application/msgpack"}))
    add("request", frame("REQUEST", stream_id=1, n=128))
    add("request_unbounded", frame("REQUEST", stream_id=1, n=MAX))
    add(
        "request_zero",
        frame("REQUEST", stream_id=1, n=0),
        "well formed; the publisher side answers with a stream ERROR INVALID_REQUEST (rule 3.9)",
    )
    add("request_negative", frame("REQUEST", stream_id=1, n=-(2**63)), "well formed, int64 minimum; rule 3.9")
    add("cancel", frame("CANCEL", stream_id=1))
    add("next_int", frame("NEXT", stream_id=1, item=42))
    add("next_negative_int", frame("NEXT", stream_id=1, item=-1))
    add(
        "next_uint64",
        frame("NEXT", stream_id=1, item=2**64 - 1),
        "payloads may use every msgpack integer; the 2**63-1 bound is for protocol fields",
    )
    add("next_false", frame("NEXT", stream_id=1, item=False), "false is an item; only nil is not")
    add("next_float", frame("NEXT", stream_id=1, item=1.5))
    add("next_str", frame("NEXT", stream_id=1, item="héllo"))
    add("next_bin", frame("NEXT", stream_id=1, item=b"\x00\x01\xfe"))
    add("next_map", frame("NEXT", stream_id=1, item={"i": 1, "v": "x"}))
    add(
        "next_nested",
        frame("NEXT", stream_id=1, item=[{"a": [1, {"b": None}]}, []]),
        "nil inside an item is fine; only the item itself must not be nil",
    )
    add("next_ext", frame("NEXT", stream_id=1, item=msgpack.ExtType(5, b"\x01\x02")))
    add("next_max_stream_id", frame("NEXT", stream_id=MAX - 1, item=0), "largest server-allocated id")
    add("batch", frame("BATCH", stream_id=1, items=[1, "two", {"three": 3}]))
    add("batch_empty", frame("BATCH", stream_id=1, items=[]), "legal and without effect")
    add("complete", frame("COMPLETE", stream_id=1))
    add(
        "error_application",
        frame("ERROR", stream_id=1, code=4242, message="no such account", data={"account": "x-17", "retry": False}),
        "an application code (>= 4096)",
    )
    add(
        "error_application_unspecified",
        frame("ERROR", stream_id=1, code=APPLICATION_ERROR, message="ValueError: boom", data=None),
    )
    add(
        "error_reject_unknown_publisher",
        frame("ERROR", stream_id=1, code=UNKNOWN_PUBLISHER, message="no publisher 'tickz'", data=None),
        "sent before ACCEPT, an ERROR rejects the SUBSCRIBE",
    )

    decode_only(
        "next_trailing_field",
        pack([21, 1, 42, "added in v1.1"]),
        frame("NEXT", stream_id=1, item=42),
        "elements after the known fields are ignored",
    )
    decode_only(
        "subscribe_trailing_fields",
        pack([16, 1, "ticks", None, 0, {}, 1, 2]),
        frame("SUBSCRIBE", stream_id=1, name="ticks", params=None, initial_demand=0, metadata={}),
        "elements after the known fields are ignored",
    )
    decode_only(
        "next_long_form_ints",
        bytes.fromhex("93cf0000000000000015d3000000000000000102"),
        frame("NEXT", stream_id=1, item=2),
        "decoders accept any msgpack encoding of a value, not only the shortest",
    )
    decode_only(
        "hello_unknown_setting",
        pack([1, "rsnet", [1], {"compression": "zstd", "max_streams": 8}]),
        frame("HELLO", magic="rsnet", versions=[1], settings={"compression": "zstd", "max_streams": 8}),
        "unknown settings are kept and ignored",
    )
    decode_only(
        "extension_frame_ignored",
        pack([64, "anything", {"x": 1}]),
        None,
        "types >= 64 are extensions: a receiver that does not know one ignores it",
    )

    for v in vectors:  # rsnet must agree before anything is written
        decoded = [parse_frame(fields) for fields in FrameDecoder().frames(bytes.fromhex(v["hex"]))]
        assert len(decoded) == 1, v["name"]
        got = None if decoded[0] is None else tag(structure(decoded[0]))
        assert got == v["frame"], (v["name"], got)
    return vectors


# ---------------------------------------------------------------- conversations


class Script:
    """Drives a client and a server Connection through a scripted timeline, checking each step."""

    def __init__(
        self,
        name: str,
        note: str,
        *,
        client: dict[str, Any] | None = None,
        server: dict[str, Any] | None = None,
        roles: tuple[str, ...] = ("client", "server"),
    ) -> None:
        self.config = {"client": client or {}, "server": server or {}}
        self.conns = {
            "client": Connection(Role.CLIENT, **self.config["client"]),
            "server": Connection(Role.SERVER, **self.config["server"]),
        }
        self.vector: dict[str, Any] = {
            "name": name,
            "note": note,
            "roles": list(roles),
            "config": tag(self.config),
            "steps": [],
        }
        self.pending: dict[str, bytes] = {}

    def send(
        self,
        side: str,
        action: Callable[[Connection], Any] | None,
        frames: list[dict[str, Any]],
        note: str = "",
        *,
        auto: bool = False,
    ) -> bytes:
        conn = self.conns[side]
        if action is not None:
            assert not conn.data_to_send(), "unexpected output before an action"
            action(conn)
        data = bytes(conn.data_to_send())
        got = decode_all(data)
        assert len(got) == len(frames) and all(matches(e, g) for e, g in zip(frames, got, strict=False)), (side, got)
        if not auto:  # the bytes must be exactly the spec's encoding of the frames
            assert data == b"".join(pack(wire_fields(f)) for f in frames), (side, got)
        step = {
            "step": "send",
            "side": side,
            **({"note": note} if note else {}),
            "frames": tag(frames if not auto else got),
            "hex": data.hex(),
        }
        if auto:
            step["auto"] = True
            step["compare"] = tag(frames)
        self.vector["steps"].append(step)
        return data

    def receive(
        self, side: str, data: bytes, events: list[dict[str, Any]], note: str = "", state: str | None = None
    ) -> None:
        conn = self.conns[side]
        conn.receive_data(data)
        got = [e for event in conn.events_received() for e in event_json(event)]
        assert len(got) == len(events) and all(matches(e, g) for e, g in zip(events, got, strict=False)), (side, got)
        step = {
            "step": "receive",
            "side": side,
            **({"note": note} if note else {}),
            "hex": data.hex(),
            "events": tag(events),
        }
        if state is not None:
            assert conn.state.name == state, conn.state
            step["state"] = state
        self.vector["steps"].append(step)

    def eof(self, side: str, events: list[dict[str, Any]], note: str = "") -> None:
        conn = self.conns[side]
        conn.receive_eof()
        got = [e for event in conn.events_received() for e in event_json(event)]
        assert len(got) == len(events) and all(matches(e, g) for e, g in zip(events, got, strict=False)), (side, got)
        self.vector["steps"].append(
            {"step": "eof", "side": side, **({"note": note} if note else {}), "events": tag(events), "state": "CLOSED"}
        )

    def exchange(
        self,
        side: str,
        action: Callable[[Connection], Any] | None,
        frames: list[dict[str, Any]],
        events: list[dict[str, Any]],
        note: str = "",
        state: str | None = None,
    ) -> None:
        """``side`` sends, the other side receives at once."""
        data = self.send(side, action, frames, note)
        self.receive(other(side), data, events, state=state)

    def handshake(self, welcome_metadata: dict[str, Any] | None = None) -> None:
        cs = {**CLIENT_SETTINGS, **self.config["client"]}
        hello = frame("HELLO", magic="rsnet", versions=[1], settings=cs)
        self.exchange(
            "client",
            None,
            [hello],
            [{"event": "HELLO", "versions": [1], "settings": cs}],
            "the client's first frame",
            state="AWAIT_ACCEPT",
        )
        ss = {**CLIENT_SETTINGS, **{k: v for k, v in self.config["server"].items() if k in CLIENT_SETTINGS}}
        if welcome_metadata is not None:
            ss["metadata"] = welcome_metadata
        self.exchange(
            "server",
            lambda c: c.send_welcome(welcome_metadata),
            [frame("WELCOME", version=1, settings=ss)],
            [{"event": "WELCOME", "version": 1, "settings": ss}],
            "the server accepts; both sides are OPEN",
            state="OPEN",
        )

    def done(self) -> dict[str, Any]:
        for side in self.vector["roles"]:
            assert not self.conns[side].data_to_send(), "output left unchecked at the end"
        return self.vector


def other(side: str) -> str:
    return "server" if side == "client" else "client"


def ev(kind: str, /, **fields: Any) -> dict[str, Any]:
    return {"event": kind, **fields}


def conversations() -> list[dict[str, Any]]:
    out = []

    s = Script("handshake", "HELLO and WELCOME; nothing else may be sent before them")
    s.handshake({"server": "rsnet-py"})
    out.append(s.done())

    s = Script(
        "subscribe_demand_items_complete",
        "The complete life of a subscription: SUBSCRIBE with initial demand, ACCEPT, items within "
        "demand, more demand, a BATCH, COMPLETE",
    )
    s.handshake()
    s.exchange(
        "client",
        lambda c: c.send_subscribe("ticks", {"symbol": "ACME"}, initial_demand=2),
        [frame("SUBSCRIBE", stream_id=1, name="ticks", params={"symbol": "ACME"}, initial_demand=2, metadata={})],
        [ev("SUBSCRIBE", stream_id=1, name="ticks", params={"symbol": "ACME"}, initial_demand=2)],
        "client streams have odd ids, starting at 1",
    )
    s.exchange(
        "server",
        lambda c: (c.send_accept(1), c.send_next(1, 10.5), c.send_next(1, 11.25)),
        [
            frame("ACCEPT", stream_id=1, metadata={}),
            frame("NEXT", stream_id=1, item=10.5),
            frame("NEXT", stream_id=1, item=11.25),
        ],
        [ev("ACCEPT", stream_id=1), ev("NEXT", stream_id=1, item=10.5), ev("NEXT", stream_id=1, item=11.25)],
        "ACCEPT, then exactly the 2 items requested",
    )
    s.exchange(
        "client",
        lambda c: c.send_request(1, 3),
        [frame("REQUEST", stream_id=1, n=3)],
        [ev("REQUEST", stream_id=1, n=3)],
    )
    s.exchange(
        "server",
        lambda c: (c.send_batch(1, [12.0, 12.5, 13.0]), c.send_complete(1)),
        [frame("BATCH", stream_id=1, items=[12.0, 12.5, 13.0]), frame("COMPLETE", stream_id=1)],
        [
            ev("NEXT", stream_id=1, item=12.0),
            ev("NEXT", stream_id=1, item=12.5),
            ev("NEXT", stream_id=1, item=13.0),
            ev("COMPLETE", stream_id=1),
        ],
        "a BATCH spends demand like as many NEXT frames; COMPLETE ends the stream",
    )
    out.append(s.done())

    s = Script(
        "worked_example",
        'The annotated conversation of SPEC.md, "Worked example"',
        client={"keepalive_interval": 15000},
    )
    s.handshake()
    s.exchange(
        "client",
        lambda c: c.send_subscribe("ticks", {"symbol": "ACME"}, initial_demand=2),
        [frame("SUBSCRIBE", stream_id=1, name="ticks", params={"symbol": "ACME"}, initial_demand=2, metadata={})],
        [ev("SUBSCRIBE", stream_id=1, name="ticks", params={"symbol": "ACME"}, initial_demand=2)],
    )
    s.exchange(
        "server",
        lambda c: (c.send_accept(1), c.send_next(1, 101), c.send_next(1, 102)),
        [
            frame("ACCEPT", stream_id=1, metadata={}),
            frame("NEXT", stream_id=1, item=101),
            frame("NEXT", stream_id=1, item=102),
        ],
        [ev("ACCEPT", stream_id=1), ev("NEXT", stream_id=1, item=101), ev("NEXT", stream_id=1, item=102)],
    )
    s.exchange(
        "client",
        lambda c: (c.send_request(1, 2), c.send_subscribe("news", initial_demand=1)),
        [
            frame("REQUEST", stream_id=1, n=2),
            frame("SUBSCRIBE", stream_id=3, name="news", params=None, initial_demand=1, metadata={}),
        ],
        [ev("REQUEST", stream_id=1, n=2), ev("SUBSCRIBE", stream_id=3, name="news", initial_demand=1)],
    )
    s.exchange(
        "server",
        lambda c: (c.send_batch(1, [103, 104]), c.send_accept(3), c.send_next(3, "hi")),
        [
            frame("BATCH", stream_id=1, items=[103, 104]),
            frame("ACCEPT", stream_id=3, metadata={}),
            frame("NEXT", stream_id=3, item="hi"),
        ],
        [
            ev("NEXT", stream_id=1, item=103),
            ev("NEXT", stream_id=1, item=104),
            ev("ACCEPT", stream_id=3),
            ev("NEXT", stream_id=3, item="hi"),
        ],
    )
    s.exchange("client", lambda c: c.send_cancel(3), [frame("CANCEL", stream_id=3)], [ev("CANCEL", stream_id=3)])
    s.exchange("server", lambda c: c.send_complete(1), [frame("COMPLETE", stream_id=1)], [ev("COMPLETE", stream_id=1)])
    out.append(s.done())

    s = Script(
        "cancel_with_late_frames",
        "The client cancels while the server is still sending: frames already in flight cross the "
        "CANCEL and are dropped by the client (rules 2.8, 3.12); the server drops the CANCEL for a "
        "stream it already completed",
    )
    s.handshake()
    s.exchange(
        "client",
        lambda c: c.send_subscribe("ticks", initial_demand=5),
        [frame("SUBSCRIBE", stream_id=1, name="ticks", params=None, initial_demand=5, metadata={})],
        [ev("SUBSCRIBE", stream_id=1, initial_demand=5)],
    )
    s.exchange(
        "server",
        lambda c: (c.send_accept(1), c.send_next(1, "a")),
        [frame("ACCEPT", stream_id=1, metadata={}), frame("NEXT", stream_id=1, item="a")],
        [ev("ACCEPT", stream_id=1), ev("NEXT", stream_id=1, item="a")],
    )
    cancel = s.send("client", lambda c: c.send_cancel(1), [frame("CANCEL", stream_id=1)], "the client cancels...")
    late = s.send(
        "server",
        lambda c: (c.send_next(1, "b"), c.send_complete(1)),
        [frame("NEXT", stream_id=1, item="b"), frame("COMPLETE", stream_id=1)],
        "...while the server, not having seen it yet, sends one more item and completes",
    )
    s.receive("client", late, [], "late frames after CANCEL: dropped, no events")
    s.receive("server", cancel, [], "CANCEL for a stream the server already completed: dropped")
    s.exchange(
        "client",
        lambda c: c.send_subscribe("ticks", initial_demand=1),
        [frame("SUBSCRIBE", stream_id=3, name="ticks", params=None, initial_demand=1, metadata={})],
        [ev("SUBSCRIBE", stream_id=3)],
        "ids are never reused: the next stream is 3",
    )
    out.append(s.done())

    s = Script("rejected_subscribe", "An ERROR in answer to SUBSCRIBE, before ACCEPT, rejects it")
    s.handshake()
    s.exchange(
        "client",
        lambda c: c.send_subscribe("tickz", initial_demand=8),
        [frame("SUBSCRIBE", stream_id=1, name="tickz", params=None, initial_demand=8, metadata={})],
        [ev("SUBSCRIBE", stream_id=1, name="tickz")],
    )
    s.exchange(
        "server",
        lambda c: c.send_error(1, UNKNOWN_PUBLISHER, "no publisher 'tickz'", {"known": ["ticks"]}),
        [
            frame(
                "ERROR", stream_id=1, code=UNKNOWN_PUBLISHER, message="no publisher 'tickz'", data={"known": ["ticks"]}
            )
        ],
        [ev("ERROR", stream_id=1, code=UNKNOWN_PUBLISHER, message="no publisher 'tickz'", data={"known": ["ticks"]})],
    )
    out.append(s.done())

    s = Script(
        "offer_push_with_backpressure",
        "A producer pushes into the server: it OFFERs a publisher, the server accepts and requests, "
        "the producer sends only what was requested, then completes",
    )
    s.handshake()
    s.exchange(
        "client",
        lambda c: c.send_offer("orders", {"partition": 0}),
        [frame("OFFER", stream_id=1, name="orders", params={"partition": 0}, metadata={})],
        [ev("OFFER", stream_id=1, name="orders", params={"partition": 0})],
    )
    s.exchange(
        "server",
        lambda c: (c.send_accept(1), c.send_request(1, 2)),
        [frame("ACCEPT", stream_id=1, metadata={}), frame("REQUEST", stream_id=1, n=2)],
        [ev("ACCEPT", stream_id=1), ev("REQUEST", stream_id=1, n=2)],
        "the subscriber side of an OFFER accepts first, then requests",
    )
    s.exchange(
        "client",
        lambda c: c.send_batch(1, [{"id": 1}, {"id": 2}]),
        [frame("BATCH", stream_id=1, items=[{"id": 1}, {"id": 2}])],
        [ev("NEXT", stream_id=1, item={"id": 1}), ev("NEXT", stream_id=1, item={"id": 2})],
    )
    s.exchange(
        "server",
        lambda c: c.send_request(1, 1),
        [frame("REQUEST", stream_id=1, n=1)],
        [ev("REQUEST", stream_id=1, n=1)],
    )
    s.exchange(
        "client",
        lambda c: (c.send_next(1, {"id": 3}), c.send_complete(1)),
        [frame("NEXT", stream_id=1, item={"id": 3}), frame("COMPLETE", stream_id=1)],
        [ev("NEXT", stream_id=1, item={"id": 3}), ev("COMPLETE", stream_id=1)],
    )
    out.append(s.done())

    s = Script(
        "both_directions",
        "Either side may open streams: the server subscribes to a publisher the client hosts, "
        "while the client's own subscription runs; server ids are even",
    )
    s.handshake()
    s.exchange(
        "client",
        lambda c: c.send_subscribe("ticks", initial_demand=MAX),
        [frame("SUBSCRIBE", stream_id=1, name="ticks", params=None, initial_demand=MAX, metadata={})],
        [ev("SUBSCRIBE", stream_id=1, initial_demand=MAX)],
        "unbounded demand",
    )
    s.exchange(
        "server",
        lambda c: (c.send_accept(1), c.send_subscribe("status", initial_demand=1)),
        [
            frame("ACCEPT", stream_id=1, metadata={}),
            frame("SUBSCRIBE", stream_id=2, name="status", params=None, initial_demand=1, metadata={}),
        ],
        [ev("ACCEPT", stream_id=1), ev("SUBSCRIBE", stream_id=2, name="status")],
    )
    s.exchange(
        "client",
        lambda c: (c.send_accept(2), c.send_next(2, "ok"), c.send_complete(2)),
        [
            frame("ACCEPT", stream_id=2, metadata={}),
            frame("NEXT", stream_id=2, item="ok"),
            frame("COMPLETE", stream_id=2),
        ],
        [ev("ACCEPT", stream_id=2), ev("NEXT", stream_id=2, item="ok"), ev("COMPLETE", stream_id=2)],
    )
    s.exchange(
        "server",
        lambda c: (c.send_batch(1, list(range(5))), c.send_next(1, 5)),
        [frame("BATCH", stream_id=1, items=[0, 1, 2, 3, 4]), frame("NEXT", stream_id=1, item=5)],
        [ev("NEXT", stream_id=1, item=i) for i in range(6)],
        "unbounded demand is never used up",
    )
    s.exchange(
        "server",
        lambda c: c.send_error(1, 4101, "feed lost", {"feed": "xnys"}),
        [frame("ERROR", stream_id=1, code=4101, message="feed lost", data={"feed": "xnys"})],
        [ev("ERROR", stream_id=1, code=4101, message="feed lost", data={"feed": "xnys"})],
        "an application error code is delivered as is",
    )
    out.append(s.done())

    s = Script(
        "keepalive_and_graceful_shutdown",
        "PING is answered by PONG automatically; GO_AWAY stops new streams, refuses one that "
        "crossed it, lets the open stream finish; then the transport closes",
    )
    s.handshake()
    s.exchange(
        "client",
        lambda c: c.send_subscribe("ticks", initial_demand=1),
        [frame("SUBSCRIBE", stream_id=1, name="ticks", params=None, initial_demand=1, metadata={})],
        [ev("SUBSCRIBE", stream_id=1)],
    )
    s.exchange(
        "server",
        lambda c: (c.send_accept(1), c.send_ping(99)),
        [frame("ACCEPT", stream_id=1, metadata={}), frame("PING", token=99)],
        [ev("ACCEPT", stream_id=1)],
        "PING is not an event: the connection answers it",
    )
    pong = s.send("client", None, [frame("PONG", token=99)], "the automatic answer", auto=True)
    s.receive("server", pong, [ev("PONG", token=99)])
    go_away = s.send("server", lambda c: c.send_go_away("restarting"), [frame("GO_AWAY", message="restarting")])
    crossing = s.send(
        "client",
        lambda c: c.send_subscribe("other", initial_demand=1),
        [frame("SUBSCRIBE", stream_id=3, name="other", params=None, initial_demand=1, metadata={})],
        "sent before the client saw GO_AWAY",
    )
    s.receive("client", go_away, [ev("GO_AWAY", message="restarting")])
    s.receive("server", crossing, [], "the server refuses it itself, with no event")
    refusal = s.send("server", None, [frame("ERROR", stream_id=3, code=GOING_AWAY)], auto=True)
    s.receive(
        "client",
        refusal,
        [ev("ERROR", stream_id=3, code=GOING_AWAY)],
        "retry on another connection: the stream was not processed",
    )
    s.exchange(
        "server",
        lambda c: (c.send_next(1, "last"), c.send_complete(1)),
        [frame("NEXT", stream_id=1, item="last"), frame("COMPLETE", stream_id=1)],
        [ev("NEXT", stream_id=1, item="last"), ev("COMPLETE", stream_id=1)],
        "the open stream drains; no streams remain, so the server closes the transport",
    )
    s.eof("client", [ev("CLOSED", code=None, by_peer=True)])
    out.append(s.done())

    s = Script(
        "version_rejected", "The server speaks no version the client offers: CONN_ERROR, then close", roles=("server",)
    )
    hello = frame("HELLO", magic="rsnet", versions=[7, 8], settings={})
    s.receive(
        "server", pack(wire_fields(hello)), [ev("CLOSED", code=UNSUPPORTED_VERSION, by_peer=False)], state="CLOSED"
    )
    s.send("server", None, [frame("CONN_ERROR", code=UNSUPPORTED_VERSION, data={"versions": [1]})], auto=True)
    out.append(s.done())

    s = Script(
        "unauthorized", "The server application rejects the client's credentials", client={"auth_token": "wrong"}
    )
    cs = {**CLIENT_SETTINGS, "auth_token": "wrong"}
    s.exchange("client", None, [frame("HELLO", magic="rsnet", versions=[1], settings=cs)], [ev("HELLO", settings=cs)])
    s.exchange(
        "server",
        lambda c: c.send_conn_error(UNAUTHORIZED, "bad token"),
        [frame("CONN_ERROR", code=UNAUTHORIZED, message="bad token", data=None)],
        [ev("CLOSED", code=UNAUTHORIZED, message="bad token", by_peer=True)],
        state="CLOSED",
    )
    out.append(s.done())
    return out


# ---------------------------------------------------------------- invalid.json


def invalid_vectors() -> list[dict[str, Any]]:
    out = []

    def open_server(name: str, note: str, server: dict[str, Any] | None = None) -> Script:
        s = Script(name, note, server=server, roles=("server",))
        s.handshake()
        return s

    def connection_error(
        s: Script, bad: bytes, code: int, side: str = "server", before: tuple[dict[str, Any], ...] = ()
    ) -> None:
        """``bad`` closes the connection; ``before`` are the events of frames preceding the fault."""
        s.receive(side, bad, [*before, ev("CLOSED", code=code, by_peer=False)], state="CLOSED")
        s.send(side, None, [frame("CONN_ERROR", code=code)], auto=True)
        s.vector["error"] = {"scope": "connection", "code": code}
        out.append(s.done())

    def stream_error(
        s: Script, bad: bytes, stream_id: int, code: int, events: list[dict[str, Any]], side: str = "server"
    ) -> None:
        s.receive(side, bad, events, state="OPEN")
        s.send(side, None, [frame("ERROR", stream_id=stream_id, code=code)], auto=True)
        s.vector["error"] = {"scope": "stream", "stream_id": stream_id, "code": code}
        out.append(s.done())

    def subscribed(s: Script, demand: int = 0) -> None:
        """Client stream 1 subscribed with ``demand`` and accepted."""
        s.exchange(
            "client",
            lambda c: c.send_subscribe("ticks", initial_demand=demand),
            [frame("SUBSCRIBE", stream_id=1, name="ticks", params=None, initial_demand=demand, metadata={})],
            [ev("SUBSCRIBE", stream_id=1)],
        )
        s.exchange(
            "server",
            lambda c: c.send_accept(1),
            [frame("ACCEPT", stream_id=1, metadata={})],
            [ev("ACCEPT", stream_id=1)],
        )

    def client_with_stream(name: str, note: str, demand: int, accept: bool = True) -> Script:
        s = Script(name, note, roles=("client",))
        s.handshake()
        s.exchange(
            "client",
            lambda c: c.send_subscribe("ticks", initial_demand=demand),
            [frame("SUBSCRIBE", stream_id=1, name="ticks", params=None, initial_demand=demand, metadata={})],
            [ev("SUBSCRIBE", stream_id=1)],
        )
        if accept:
            s.exchange(
                "server",
                lambda c: c.send_accept(1),
                [frame("ACCEPT", stream_id=1, metadata={})],
                [ev("ACCEPT", stream_id=1)],
            )
        return s

    # --- stream errors: the rules of Reactive Streams across the wire
    s = open_server("rule_3_9_request_zero", "REQUEST(0) is answered with a stream ERROR INVALID_REQUEST")
    subscribed(s)
    stream_error(s, pack([19, 1, 0]), 1, INVALID_REQUEST, [ev("ERROR", stream_id=1, code=INVALID_REQUEST)])

    s = open_server("rule_3_9_request_negative", "REQUEST(n < 0) is answered with a stream ERROR INVALID_REQUEST")
    subscribed(s, 4)
    stream_error(s, pack([19, 1, -5]), 1, INVALID_REQUEST, [ev("ERROR", stream_id=1, code=INVALID_REQUEST)])

    s = client_with_stream(
        "rule_1_1_next_beyond_demand",
        "One item more than requested: the receiver ends the stream with FLOW_CONTROL; "
        "the items within demand are delivered",
        demand=1,
    )
    stream_error(
        s,
        pack([21, 1, "ok"]) + pack([21, 1, "too many"]),
        1,
        FLOW_CONTROL,
        [ev("NEXT", stream_id=1, item="ok"), ev("ERROR", stream_id=1, code=FLOW_CONTROL)],
        side="client",
    )

    s = client_with_stream(
        "rule_1_1_batch_beyond_demand",
        "A BATCH larger than the outstanding demand: none of its items is delivered",
        demand=2,
    )
    stream_error(
        s, pack([22, 1, [1, 2, 3]]), 1, FLOW_CONTROL, [ev("ERROR", stream_id=1, code=FLOW_CONTROL)], side="client"
    )

    s = client_with_stream("rule_1_1_next_without_demand", "NEXT when nothing was requested", demand=0)
    stream_error(s, pack([21, 1, 1]), 1, FLOW_CONTROL, [ev("ERROR", stream_id=1, code=FLOW_CONTROL)], side="client")

    s = client_with_stream("rule_2_13_nil_item", "A nil item is a stream PROTOCOL_ERROR", demand=3)
    stream_error(
        s, pack([21, 1, None]), 1, PROTOCOL_ERROR, [ev("ERROR", stream_id=1, code=PROTOCOL_ERROR)], side="client"
    )

    s = client_with_stream("rule_2_13_nil_in_batch", "A nil item inside a BATCH is a stream PROTOCOL_ERROR", demand=3)
    stream_error(
        s, pack([22, 1, [1, None]]), 1, PROTOCOL_ERROR, [ev("ERROR", stream_id=1, code=PROTOCOL_ERROR)], side="client"
    )

    s = open_server(
        "too_many_streams",
        "Beyond the max_streams the server announced, a new stream is refused "
        "with TOO_MANY_STREAMS; the connection lives on",
        server={"max_streams": 1},
    )
    subscribed(s)
    stream_error(s, pack([16, 3, "ticks", None, 0, {}]), 3, TOO_MANY_STREAMS, [])

    s = open_server(
        "subscribe_after_go_away",
        "A stream opened after this side sent GO_AWAY is refused with GOING_AWAY (it crossed the GO_AWAY)",
    )
    s.send("server", lambda c: c.send_go_away(), [frame("GO_AWAY", message="")])
    stream_error(s, pack([16, 1, "ticks", None, 0, {}]), 1, GOING_AWAY, [])

    # --- connection errors: malformed frames
    def malformed(name: str, data: bytes, note: str, *before: dict[str, Any]) -> None:
        s = open_server(name, note)
        subscribed(s)
        connection_error(s, data, PROTOCOL_ERROR, before=before)

    malformed("not_msgpack", b"\xc1", "0xc1 is never used by msgpack")
    malformed("invalid_utf8", b"\x93\x15\x01\xa2\xff\xfe", "msgpack strings must be UTF-8")
    malformed("frame_not_array", pack(21), "a frame is an array")
    malformed("frame_is_binary", pack(b"\x15\x01\x05"), "binary that looks like [21, 1, 5] is not a frame")
    malformed("frame_empty_array", pack([]), "a frame has a type")
    malformed("type_not_int", pack(["NEXT", 1, 5]), "the type is an integer")
    malformed("type_float", pack([21.0, 1, 5]), "21.0 is not 21: types are msgpack integers")
    malformed("type_bool", pack([True, "rsnet", [1], {}]), "true is not 1")
    malformed("type_negative", pack([-1]), "types are 0..2**63-1")
    malformed("unknown_core_type_7", pack([7, 1]), "types below 64 that v1 does not define are fatal")
    malformed("unknown_core_type_63", pack([63]), "types below 64 that v1 does not define are fatal")
    malformed("type_zero", pack([0]), "0 is not a frame type")
    malformed("next_missing_item", pack([21, 1]), "too few fields")
    malformed("stream_id_zero", pack([21, 0, 5]), "stream ids start at 1")
    malformed("stream_id_bool", pack([21, True, 5]), "true is not stream 1")
    malformed("stream_id_float", pack([21, 1.0, 5]), "1.0 is not stream 1")
    malformed("stream_id_negative", pack([20, -1]), "stream ids are positive")
    malformed("stream_id_beyond_int64", pack([20, 2**63 + 1]), "protocol integers are at most 2**63-1")
    malformed("request_n_beyond_int64", pack([19, 1, 2**63]), "REQUEST n is an int64")
    malformed("request_n_string", pack([19, 1, "10"]), "REQUEST n is an integer")
    malformed("subscribe_name_not_str", pack([16, 3, b"ticks", None, 0, {}]), "names are strings")
    malformed("subscribe_metadata_not_map", pack([16, 3, "ticks", None, 0, []]), "metadata is a map")
    malformed(
        "metadata_int_key",
        pack([16, 3, "ticks", None, 0, {1: "x"}]),
        "map keys are strings or binary everywhere; an integer key is not decodable",
    )
    malformed("subscribe_negative_demand", pack([16, 3, "ticks", None, -1, {}]), "initial_demand is 0..2**63-1")
    malformed("error_code_negative", pack([24, 1, -1, "x", None]), "codes are 0..2**63-1")
    malformed("error_message_not_str", pack([24, 1, 4096, None, None]), "messages are strings")

    # --- connection errors: state
    malformed("stream_id_wrong_parity", pack([16, 2, "ticks", None, 0, {}]), "clients open odd ids")
    malformed("stream_id_skipped", pack([16, 5, "ticks", None, 0, {}]), "ids go up by exactly 2: 3 comes next")
    malformed(
        "stream_id_reused",
        pack([20, 1]) + pack([16, 1, "ticks", None, 0, {}]),
        "an id is never reused, even after its stream ended",
        ev("CANCEL", stream_id=1),
    )
    malformed("never_opened_stream", pack([19, 9, 1]), "a frame for a stream id that was never opened")
    malformed("accept_from_opener", pack([18, 1, {}]), "the side that sent SUBSCRIBE cannot ACCEPT it")
    malformed("next_from_subscriber", pack([21, 1, 1]), "items flow from the publisher side only")
    malformed("complete_from_subscriber", pack([23, 1]), "COMPLETE flows from the publisher side only")
    malformed("hello_after_handshake", pack([1, "rsnet", [1], {}]), "one handshake per connection")
    malformed(
        "subscribe_after_own_go_away",
        pack([5, "bye"]) + pack([16, 3, "ticks", None, 0, {}]),
        "a side that sent GO_AWAY opens no more streams",
        ev("GO_AWAY", message="bye"),
    )

    s = Script("frame_before_hello", "The server's first frame must be HELLO", roles=("server",))
    connection_error(s, pack([16, 1, "ticks", None, 1, {}]), PROTOCOL_ERROR)
    s = Script("hello_wrong_magic", 'HELLO\'s second element is "rsnet"', roles=("server",))
    connection_error(s, pack([1, "rsocket", [1], {}]), PROTOCOL_ERROR)
    s = Script("hello_no_versions", "HELLO offers 1 to 16 versions", roles=("server",))
    connection_error(s, pack([1, "rsnet", [], {}]), PROTOCOL_ERROR)
    s = Script("hello_max_frame_size_too_small", "max_frame_size is at least 16384", roles=("server",))
    connection_error(s, pack([1, "rsnet", [1], {"max_frame_size": 1024}]), PROTOCOL_ERROR)
    s = Script("hello_keepalive_not_int", "known settings are type-checked", roles=("server",))
    connection_error(s, pack([1, "rsnet", [1], {"keepalive_interval": "20s"}]), PROTOCOL_ERROR)
    s = Script(
        "http_request", 'A peer that is not rsnet: "G" decodes as the integer 71, not a frame', roles=("server",)
    )
    connection_error(s, b"GET / HTTP/1.1\r\n\r\n", PROTOCOL_ERROR)

    s = Script("frame_before_welcome", "The client sends nothing but HELLO until WELCOME arrives", roles=("server",))
    s.exchange(
        "client",
        None,
        [frame("HELLO", magic="rsnet", versions=[1], settings=CLIENT_SETTINGS)],
        [ev("HELLO")],
        state="AWAIT_ACCEPT",
    )
    connection_error(s, pack([16, 1, "ticks", None, 1, {}]), PROTOCOL_ERROR)

    s = Script("welcome_unoffered_version", "A WELCOME must choose a version the client offered", roles=("client",))
    s.send("client", None, [frame("HELLO", magic="rsnet", versions=[1], settings=CLIENT_SETTINGS)])
    connection_error(s, pack([2, 2, {}]), PROTOCOL_ERROR, side="client")

    s = client_with_stream(
        "next_before_accept", "Items only after ACCEPT (rule 1.9: on_subscribe comes first)", demand=1, accept=False
    )
    connection_error(s, pack([21, 1, 1]), PROTOCOL_ERROR, side="client")

    s = client_with_stream("double_accept", "A stream is accepted once", demand=1)
    connection_error(s, pack([18, 1, {}]), PROTOCOL_ERROR, side="client")

    s = client_with_stream("request_from_publisher", "REQUEST flows from the subscriber side only", demand=1)
    connection_error(s, pack([19, 1, 1]), PROTOCOL_ERROR, side="client")

    s = open_server("request_on_offer_before_accept", "The subscriber side of an OFFER requests only after ACCEPT")
    s.exchange(
        "server",
        lambda c: c.send_offer("status"),
        [frame("OFFER", stream_id=2, name="status", params=None, metadata={})],
        [ev("OFFER", stream_id=2)],
    )
    connection_error(s, pack([19, 2, 1]), PROTOCOL_ERROR)

    # --- connection errors: size
    s = open_server(
        "frame_too_large", "A frame longer than the receiver's max_frame_size", server={"max_frame_size": 16384}
    )
    subscribed(s)
    connection_error(s, pack([24, 1, 4096, "x" * 16384, None]), FRAME_TOO_LARGE)

    # A receiver may refuse a length header that cannot fit, or wait for the limit to be
    # reached; the padding makes both end the same way.
    padding = b"\x00" * 16384
    s = open_server(
        "frame_too_large_declared_string", "A string header declaring 2**32-1 bytes", server={"max_frame_size": 16384}
    )
    subscribed(s)
    connection_error(s, b"\x95\x18\x01\xcd\x10\x00\xdb\xff\xff\xff\xff" + padding, FRAME_TOO_LARGE)

    s = open_server(
        "frame_too_large_declared_array",
        "An array header declaring more elements than the limit has bytes",
        server={"max_frame_size": 16384},
    )
    subscribed(s)
    connection_error(s, b"\x93\x16\x01\xdd\x00\x01\x00\x00" + padding, FRAME_TOO_LARGE)
    return out


def main() -> None:
    files = {
        "frames.json": {
            "description": "Single frames: structure, msgpack array, exact bytes",
            "vectors": frame_vectors(),
        },
        "conversations.json": {
            "description": "Whole conversations, step by step, both sides",
            "vectors": conversations(),
        },
        "invalid.json": {"description": "Invalid inputs and the error each must produce", "vectors": invalid_vectors()},
    }
    for name, content in files.items():
        path = HERE / name
        path.write_text(json.dumps({"protocol_version": 1, **content}, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {path} ({len(content['vectors'])} vectors)")


if __name__ == "__main__":
    main()
