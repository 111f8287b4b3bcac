"""The golden vectors in protocol/vectors/ are the contract: rsnet must agree with every one.

The JSON files are checked in and never regenerated here; see protocol/vectors/README.md.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from rsnet.protocol import Connection, Role, encode_frame, parse_frame

from .support import VECTORS, assert_subset, decode, flatten, load, structure, untag

FRAMES = load("frames.json")
CONVERSATIONS = load("conversations.json")
INVALID = load("invalid.json")


def replays(vectors: list[dict[str, Any]]) -> list[Any]:
    return [pytest.param(v, role, id=f"{v['name']}-as-{role}") for v in vectors for role in v["roles"]]


@pytest.mark.parametrize("vector", FRAMES, ids=lambda v: v["name"])
def test_frame_vector_decodes_to_its_structure(vector: dict[str, Any]) -> None:
    (frame,) = decode(bytes.fromhex(vector["hex"]))
    expected = untag(vector["frame"])
    assert (None if frame is None else structure(frame)) == expected


@pytest.mark.parametrize("vector", [v for v in FRAMES if not v.get("decode_only")], ids=lambda v: v["name"])
def test_frame_vector_encodes_to_its_exact_bytes(vector: dict[str, Any]) -> None:
    frame = parse_frame(untag(vector["fields"]))
    assert encode_frame(frame).hex() == vector["hex"]


def perform(conn: Connection, frame: dict[str, Any]) -> None:
    """Make ``conn`` write ``frame`` through its public API (vectors README, "Replaying")."""
    kind = frame["type"]
    if kind in ("SUBSCRIBE", "OFFER"):
        options = {"initial_demand": frame["initial_demand"]} if kind == "SUBSCRIBE" else {}
        send = conn.send_subscribe if kind == "SUBSCRIBE" else conn.send_offer
        assert send(frame["name"], frame["params"], metadata=frame["metadata"], **options) == frame["stream_id"]
        return
    calls = {
        "WELCOME": lambda f: conn.send_welcome(f["settings"].get("metadata")),
        "PING": lambda f: conn.send_ping(f["token"]),
        "GO_AWAY": lambda f: conn.send_go_away(f["message"]),
        "CONN_ERROR": lambda f: conn.send_conn_error(f["code"], f["message"], f["data"]),
        "ACCEPT": lambda f: conn.send_accept(f["stream_id"], f["metadata"]),
        "REQUEST": lambda f: conn.send_request(f["stream_id"], f["n"]),
        "CANCEL": lambda f: conn.send_cancel(f["stream_id"]),
        "NEXT": lambda f: conn.send_next(f["stream_id"], f["item"]),
        "BATCH": lambda f: conn.send_batch(f["stream_id"], f["items"]),
        "COMPLETE": lambda f: conn.send_complete(f["stream_id"]),
        "ERROR": lambda f: conn.send_error(f["stream_id"], f["code"], f["message"], f["data"]),
    }
    calls[kind](frame)


def replay(vector: dict[str, Any], role: str) -> Connection:
    """Play ``role``'s steps of ``vector`` against a fresh rsnet connection, checking each."""
    conn = Connection(Role[role.upper()], **untag(vector["config"][role]))
    for step in vector["steps"]:
        if step["side"] != role:
            continue
        if step["step"] == "send" and step.get("auto"):
            got = [structure(f) for f in decode(bytes(conn.data_to_send()))]
            assert_subset(untag(step["compare"]), got)
        elif step["step"] == "send":
            frames = untag(step["frames"])
            if frames[0]["type"] != "HELLO":  # a client's HELLO is written by its constructor
                assert not conn.data_to_send(), "unexpected output before this step"
                for frame in frames:
                    perform(conn, frame)
            assert conn.data_to_send().hex() == step["hex"]
        else:
            if step["step"] == "receive":
                conn.receive_data(bytes.fromhex(step["hex"]))
            else:
                conn.receive_eof()
            assert_subset(untag(step["events"]), flatten(conn.events_received()))
            if "state" in step:
                assert conn.state.name == step["state"]
    assert not conn.data_to_send(), "output the vector does not list"
    return conn


@pytest.mark.parametrize(("vector", "role"), replays(CONVERSATIONS))
def test_conversation_replays(vector: dict[str, Any], role: str) -> None:
    replay(vector, role)


@pytest.mark.parametrize(("vector", "role"), replays(INVALID))
def test_invalid_input_yields_its_error_code(vector: dict[str, Any], role: str) -> None:
    conn = replay(vector, role)
    error = vector["error"]
    assert conn.state.name == ("CLOSED" if error["scope"] == "connection" else "OPEN")


def test_vectors_cover_every_frame_type_and_error_code() -> None:
    types = {v["frame"]["type"] for v in FRAMES if v["frame"]}
    assert types == {
        "HELLO",
        "WELCOME",
        "PING",
        "PONG",
        "GO_AWAY",
        "CONN_ERROR",
        "SUBSCRIBE",
        "OFFER",
        "ACCEPT",
        "REQUEST",
        "CANCEL",
        "NEXT",
        "BATCH",
        "COMPLETE",
        "ERROR",
    }
    codes = {v["error"]["code"] for v in INVALID}
    assert {1, 2, 3, 4, 9, 10} <= codes


def test_spec_worked_example_is_the_worked_example_vector() -> None:
    """SPEC.md section 13 shows, block by block, the bytes of the vector ``worked_example``."""
    spec = (VECTORS.parent / "SPEC.md").read_text()
    section = spec.split("## 13. Worked example")[1].split("\n## ")[0]
    blocks = section.split("```")[1::2]
    # Each line is hex bytes, then two or more spaces, then an annotation.
    shown = [
        "".join(re.split(r"\s{2,}", line.strip())[0].replace(" ", "") for line in block.strip().splitlines())
        for block in blocks
    ]
    (vector,) = [v for v in CONVERSATIONS if v["name"] == "worked_example"]
    assert shown == [s["hex"] for s in vector["steps"] if s["step"] == "send"]
