"""parse_frame, frame type by frame type: one parser per type (frames.py), held to the same
rules for every type: each field checked and named, too few fields refused, more ignored."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rsnet.protocol import ErrorCode, RemoteProtocolError, encode_frame, frame_fields, parse_frame
from rsnet.protocol.frames import _any

from .support import load, untag

# One valid frame of every type, from the golden vectors (the first vector of each type).
EXAMPLES: dict[str, list[Any]] = {}
for _vector in load("frames.json"):
    if not _vector.get("decode_only") and _vector["frame"]["type"] not in EXAMPLES:
        EXAMPLES[_vector["frame"]["type"]] = untag(_vector["fields"])

NOT_ANY_VALUE = object()  # decodes from no msgpack value: refused by every check but _any


def test_the_examples_cover_every_frame_type() -> None:
    assert len(EXAMPLES) == 15


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_frame_round_trips_and_extra_fields_are_ignored(name: str) -> None:
    fields = EXAMPLES[name]
    frame = parse_frame(fields)
    assert frame_fields(frame) == fields
    assert parse_frame([*fields, "from a later version", 7]) == frame  # the extension rule
    assert parse_frame(list(fields)) == parse_frame(fields)
    assert encode_frame(frame)  # packs again


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_frame_missing_fields_is_refused_with_the_count(name: str) -> None:
    fields = EXAMPLES[name]
    for length in range(1, len(fields)):
        with pytest.raises(RemoteProtocolError) as refused:
            parse_frame(fields[:length])
        assert refused.value.code == ErrorCode.PROTOCOL_ERROR
        assert refused.value.message == f"{name} needs {len(fields) - 1} fields, got {length - 1}"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_field_of_the_wrong_type_is_refused_by_name(name: str) -> None:
    fields = EXAMPLES[name]
    cls = type(parse_frame(fields))
    for index, check in enumerate(cls.CHECKS, start=1):
        bad = [*fields[:index], NOT_ANY_VALUE, *fields[index + 1 :]]
        if check is _any:
            assert parse_frame(bad) is not None  # any value goes (params, data, an item)
            continue
        with pytest.raises(RemoteProtocolError) as refused:
            parse_frame(bad)
        assert refused.value.code == ErrorCode.PROTOCOL_ERROR
        field = dataclasses.fields(cls)[index - 1].name
        assert refused.value.message.startswith(f"{name}.{field} must be "), refused.value.message
