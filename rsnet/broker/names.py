"""Topic names and patterns: the grammar, matching and containment.

A topic name is one or more dot-separated segments; a segment is one or more of
``A-Z a-z 0-9 _ -`` (ASCII only, case-sensitive)::

    topic    = segment *( "." segment )         ; at most 255 characters in all
    segment  = 1*( ALPHA / DIGIT / "_" / "-" )

A pattern (wildcard subscriptions, grants, the ``topics`` table of the config) is the same with
two wildcards, each a whole segment, as in NATS::

    pattern  = psegment *( "." psegment ) [ "." ">" ] / ">"
    psegment = segment / "*"

``*`` matches exactly one segment, ``>`` (last only) one or more trailing segments. So
``sensors.*`` matches ``sensors.kitchen`` but not ``sensors`` nor ``sensors.kitchen.temp``;
``sensors.>`` matches both of the latter but not ``sensors``; ``>`` matches every topic. Empty
segments (``a..b``, ``.a``, ``a.``), partial wildcards (``sensors.*x``, ``a>``), a ``>`` that is
not last, and any other character (spaces, ``/``, non-ASCII letters) are rejected.

The grammar keeps names safe as directory names (no ``/``, no ``..``, no empty name) and
bounded in length. This module imports only the standard library; the broker, its
configuration and its authorization all take the grammar from here.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 255
"""Longest topic name or pattern, in characters."""

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")


class InvalidName(ValueError):
    """A topic name or pattern outside the grammar; the message says what is wrong."""


def _check(text: object, *, wildcards: bool) -> str:
    what = "pattern" if wildcards else "topic name"
    if not isinstance(text, str):
        raise InvalidName(f"a {what} must be a string, not {type(text).__name__}")
    if not text:
        raise InvalidName(f"empty {what}")
    if len(text) > MAX_NAME_LENGTH:
        raise InvalidName(f"{what} longer than {MAX_NAME_LENGTH} characters")
    segments = text.split(".")
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        if not segment:
            raise InvalidName(f"{what} {_show(text)} has an empty segment (a leading, trailing or doubled '.')")
        if segment in ("*", ">"):
            if not wildcards:
                raise InvalidName(
                    f"topic name {_show(text)} contains a wildcard: name one topic here (wildcards are for subscriptions)"
                )
            if segment == ">" and index != last:
                raise InvalidName(f"pattern {_show(text)}: '>' may only be the last segment")
            continue
        if "*" in segment or ">" in segment:
            raise InvalidName(f"{what} {_show(text)}: '*' and '>' must be whole segments")
        if not _SEGMENT.fullmatch(segment):
            raise InvalidName(f"{what} {_show(text)}: segment {_show(segment)} may only hold A-Z a-z 0-9 _ -")
    return text


def _show(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


MAX_MATCH_PATTERNS = 1024
"""Names and patterns one ``$topics`` may ask for (its ``match`` param)."""

MAX_MATCH_WILDCARDS = 16
"""Of those, patterns with a wildcard at most: names are looked up in a set, patterns are
tried in turn (compiled into one expression), so this bounds the work per topic listed (16
patterns of 60 segments that just miss 10,000 topics of 60 segments: about 0.13 s)."""


class TopicFilter:
    """Whether a topic name is one of some names or matches one of some patterns (all
    assumed valid): a set lookup for names, one compiled expression for the patterns, where
    testing each pattern in turn in Python cost 10,000 topics x 1,024 patterns 3 s."""

    def __init__(self, patterns: list[str]) -> None:
        self._names = {pattern for pattern in patterns if not is_wildcard(pattern)}
        wildcards = [pattern for pattern in patterns if is_wildcard(pattern)]
        self._expression = re.compile("|".join(map(_expression, wildcards))) if wildcards else None

    def __call__(self, topic: str) -> bool:
        return topic in self._names or (self._expression is not None and self._expression.fullmatch(topic) is not None)


def _expression(pattern: str) -> str:
    """``pattern`` as a regular expression over topic names (as ``topic_matches`` reads it)."""
    parts = []
    for segment in pattern.split("."):
        if segment == ">":
            parts.append(r"[^.]+(?:\.[^.]+)*")  # one or more segments: always the last
            break
        parts.append("[^.]+" if segment == "*" else re.escape(segment))
    return "(?:" + r"\.".join(parts) + ")"


def validate_topic(name: object) -> str:
    """Return ``name`` if it is a concrete topic name (no wildcards), else raise InvalidName."""
    return _check(name, wildcards=False)


def validate_pattern(pattern: object) -> str:
    """Return ``pattern`` if it is a valid pattern (a topic name is one too), else raise InvalidName."""
    return _check(pattern, wildcards=True)


def is_valid_topic(name: object) -> bool:
    try:
        _check(name, wildcards=False)
    except InvalidName:
        return False
    return True


def is_valid_pattern(pattern: object) -> bool:
    try:
        _check(pattern, wildcards=True)
    except InvalidName:
        return False
    return True


def is_wildcard(pattern: str) -> bool:
    """Whether a valid pattern has a wildcard segment (may match more than one topic)."""
    return any(segment in ("*", ">") for segment in pattern.split("."))


def topic_matches(pattern: str, topic: str) -> bool:
    """Whether the topic name matches the pattern (both assumed valid)."""
    return _matches(pattern.split("."), topic.split("."))


def _matches(pattern: list[str], topic: list[str]) -> bool:
    for index, segment in enumerate(pattern):
        if segment == ">":
            return index < len(topic)
        if index >= len(topic) or (segment != "*" and segment != topic[index]):
            return False
    return len(pattern) == len(topic)


def pattern_covers(outer: str, inner: str) -> bool:
    """Whether every topic matching ``inner`` also matches ``outer`` (both assumed valid).

    Both patterns are per-position constraints on segments (a literal, ``*`` = any one segment)
    with an optional ``>`` tail (one or more further segments), so containment is decided
    position by position: ``outer``'s ``>`` covers any non-empty rest of ``inner``; otherwise
    the lengths must agree, an ``outer`` literal needs the same literal in ``inner``, and an
    ``outer`` ``*`` covers a literal or ``*`` but not a ``>`` (which spans more segments).
    """
    return _covers(outer.split("."), inner.split("."))


def _covers(outer: list[str], inner: list[str]) -> bool:
    for index, segment in enumerate(outer):
        if segment == ">":
            return index < len(inner)
        if index >= len(inner):
            return False  # inner's topics stop here; outer's need more segments
        other = inner[index]
        if other == ">":
            return False  # inner reaches any length, outer has a fixed one here
        if segment != "*" and segment != other:
            return False  # a literal covers only itself, not another literal nor '*'
    return len(outer) == len(inner)
