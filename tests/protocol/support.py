"""Shared helpers for the protocol tests: vector loading, tagged JSON, opened connections.

Hypothesis settings are applied per test (``PROPERTY``), never as a global profile, so these
tests do not change how the rest of the suite runs.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import msgpack
from hypothesis import HealthCheck, settings

from rsnet.protocol import Connection, ConnectionClosed, FrameDecoder, Items, Role, frame_fields, parse_frame

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "protocol" / "vectors"

PROPERTY = settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Deterministic and quick: the suite must stay within seconds."""

NAMES = {
    1: "HELLO",
    2: "WELCOME",
    3: "PING",
    4: "PONG",
    5: "GO_AWAY",
    6: "CONN_ERROR",
    16: "SUBSCRIBE",
    17: "OFFER",
    18: "ACCEPT",
    19: "REQUEST",
    20: "CANCEL",
    21: "NEXT",
    22: "BATCH",
    23: "COMPLETE",
    24: "ERROR",
}


def load(name: str) -> list[dict[str, Any]]:
    return json.loads((VECTORS / name).read_text())["vectors"]


def untag(value: Any) -> Any:
    """A vector's JSON value as the msgpack value it stands for (vectors README, "Values")."""
    if isinstance(value, list):
        return [untag(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key == "$int":
                return int(inner)
            if key == "$bin":
                return bytes.fromhex(inner)
            if key == "$ext":
                return msgpack.ExtType(inner[0], bytes.fromhex(inner[1]))
        return {k: untag(v) for k, v in value.items()}
    return value


def structure(frame: Any) -> dict[str, Any]:
    """A frame object as the vectors write it: {"type": NAME, field: value, ...}."""
    fields = frame_fields(frame)
    names = [field.name for field in dataclasses.fields(frame)]
    return {"type": NAMES[fields[0]], **dict(zip(names, fields[1:], strict=False))}


def decode(data: bytes) -> list[Any]:
    """Every frame object in ``data``, which must hold whole frames only."""
    decoder = FrameDecoder()
    frames = [parse_frame(fields) for fields in decoder.frames(data)]
    assert decoder.buffered == 0, "a partial frame was written"
    return frames


def flatten(events: list[Any]) -> list[dict[str, Any]]:
    """Events as the vectors write them: one NEXT per item, CLOSED for ConnectionClosed."""
    out: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, Items):
            out += [{"event": "NEXT", "stream_id": event.stream_id, "item": item} for item in event.items]
        elif isinstance(event, ConnectionClosed):
            out.append(
                {
                    "event": "CLOSED",
                    "code": event.code,
                    "message": event.message,
                    "data": event.data,
                    "by_peer": event.by_peer,
                }
            )
        else:
            s = structure(event)
            out.append({"event": s.pop("type"), **s})
    return out


def assert_subset(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> None:
    """Each expected object's keys match the actual one's; keys it leaves out are not compared."""
    assert len(expected) == len(actual), (expected, actual)
    for want, got in zip(expected, actual, strict=False):
        assert {k: got.get(k) for k in want} == want, (want, got)


def open_pair(**server_settings: Any) -> tuple[Connection, Connection]:
    """A client and a server connection after a completed handshake, with no output pending."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER, **server_settings)
    server.receive_data(client.data_to_send())
    server.send_welcome()
    client.receive_data(server.data_to_send())
    client.events_received()
    server.events_received()
    return client, server


def transfer(sender: Connection, receiver: Connection) -> list[Any]:
    """Deliver everything ``sender`` wrote to ``receiver``; return the receiver's events."""
    receiver.receive_data(bytes(sender.data_to_send()))
    return receiver.events_received()


def subscribed(demand: int = 0, **server_settings: Any) -> tuple[Connection, Connection, int]:
    """A pair where the client subscribed to the server's publisher and the server accepted."""
    client, server = open_pair(**server_settings)
    stream_id = client.send_subscribe("ticks", initial_demand=demand)
    transfer(client, server)
    server.send_accept(stream_id)
    transfer(server, client)
    return client, server, stream_id
