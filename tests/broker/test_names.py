"""Topic names and patterns: the grammar, matching and pattern containment (rsnet.broker.names)."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsnet.broker.names import (
    MAX_NAME_LENGTH,
    InvalidName,
    is_valid_pattern,
    is_valid_topic,
    is_wildcard,
    pattern_covers,
    topic_matches,
    validate_pattern,
    validate_topic,
)

# -- the grammar ------------------------------------------------------------------------------

VALID_TOPICS = ["a", "sensors", "sensors.kitchen", "sensors.kitchen.temp", "A-Z_0-9.x", "_", "-", "1.2.3"]
INVALID_TOPICS = {
    "": "empty",
    ".": "empty segment",
    ".a": "empty segment",
    "a.": "empty segment",
    "sensors..x": "empty segment",
    "sensors.*": "wildcard",
    "sensors.>": "wildcard",
    "*": "wildcard",
    "sensors.*x": "whole segments",
    "sensors.x>": "whole segments",
    "a b": "may only hold",
    "a/b": "may only hold",
    "a\nb": "may only hold",
    "sensors.kitchen\n": "may only hold",  # no `$` that lets a trailing newline through
    "sensors.kitchen ": "may only hold",
    "sensors.küche": "may only hold",
    "sensors.ｋitchen": "may only hold",  # fullwidth k
    "sensors.١": "may only hold",  # an Arabic-Indic digit is a digit to \d, not to the grammar
    "a\u200bb": "may only hold",  # zero-width space
    "a\x00": "may only hold",
    "x" * (MAX_NAME_LENGTH + 1): "longer than",
}


@pytest.mark.parametrize("name", VALID_TOPICS)
def test_valid_topic_names_are_accepted_as_topics_and_as_patterns(name):
    assert validate_topic(name) == name
    assert validate_pattern(name) == name
    assert is_valid_topic(name) and is_valid_pattern(name)
    assert not is_wildcard(name)


@pytest.mark.parametrize("name, reason", INVALID_TOPICS.items())
def test_invalid_topic_names_are_rejected_with_the_reason(name, reason):
    with pytest.raises(InvalidName, match=reason):
        validate_topic(name)
    assert not is_valid_topic(name)


def test_the_longest_name_is_accepted_and_one_more_character_is_not():
    longest = ".".join(["abc"] * 64)[:MAX_NAME_LENGTH].rstrip(".")
    assert is_valid_topic("x" * MAX_NAME_LENGTH)
    assert is_valid_topic(longest)
    assert not is_valid_topic("x" * (MAX_NAME_LENGTH + 1))
    assert not is_valid_pattern("x" * (MAX_NAME_LENGTH - 1) + ".>")


@pytest.mark.parametrize("value", [None, 5, b"sensors", ["sensors"]])
def test_names_must_be_strings(value):
    with pytest.raises(InvalidName, match="must be a string"):
        validate_topic(value)
    assert not is_valid_pattern(value)


@pytest.mark.parametrize("pattern", ["*", ">", "sensors.*", "sensors.>", "*.temp", "sensors.*.temp", "*.*", "a.*.>"])
def test_valid_patterns(pattern):
    assert validate_pattern(pattern) == pattern
    assert is_wildcard(pattern)
    assert not is_valid_topic(pattern)


@pytest.mark.parametrize(
    "pattern, reason",
    [
        (">.a", "last segment"),
        ("a.>.b", "last segment"),
        (">.>", "last segment"),
        ("sensors.*x", "whole segments"),
        ("**", "whole segments"),
        ("a>", "whole segments"),
        ("sensors..*", "empty segment"),
        ("sensors.*.", "empty segment"),
        ("sensors.#", "may only hold"),
        ("sensors.?", "may only hold"),
        ("", "empty"),
    ],
)
def test_invalid_patterns_are_rejected_with_the_reason(pattern, reason):
    with pytest.raises(InvalidName, match=re.escape(reason)):
        validate_pattern(pattern)


def test_an_error_message_shows_a_long_name_shortened():
    with pytest.raises(InvalidName) as error:
        validate_pattern("a" * 200 + "..b")
    assert len(str(error.value)) < 150


@pytest.mark.parametrize(
    "pattern, topic, matches",
    [
        ("sensors.kitchen", "sensors.kitchen", True),
        ("sensors.kitchen", "sensors.Kitchen", False),  # case-sensitive
        ("sensors.*", "sensors.kitchen", True),
        ("sensors.*", "sensors", False),
        ("sensors.*", "sensors.kitchen.temp", False),
        ("sensors.>", "sensors.kitchen", True),
        ("sensors.>", "sensors.kitchen.temp", True),
        ("sensors.>", "sensors", False),
        ("sensors.>", "sensorsx.kitchen", False),
        ("*.temp", "kitchen.temp", True),
        ("*.temp", "temp", False),
        ("*", "sensors", True),
        ("*", "sensors.kitchen", False),
        (">", "sensors", True),
        (">", "a.b.c.d", True),
        ("a.*.>", "a.b", False),
        ("a.*.>", "a.b.c", True),
    ],
)
def test_topic_matches(pattern, topic, matches):
    assert topic_matches(pattern, topic) is matches


@pytest.mark.parametrize(
    "outer, inner, covers",
    [
        ("sensors.*", "sensors.*", True),
        ("sensors.*", "sensors.kitchen", True),
        ("sensors.*", "sensors.>", False),
        ("sensors.*", "*", False),
        ("sensors.*", ">", False),
        ("sensors.*", "sensors.*.temp", False),
        ("sensors.*", "sensors", False),
        ("sensors.*", "*.kitchen", False),
        ("sensors.>", "sensors.*.temp", True),
        ("sensors.>", "sensors.>", True),
        ("sensors.>", "sensors.*", True),
        ("sensors.>", "sensors.a.b.c", True),
        ("sensors.>", "sensors", False),
        ("sensors.>", "*.kitchen", False),
        ("sensors.>", ">", False),
        (">", ">", True),
        (">", "*.*.>", True),
        ("*", ">", False),
        ("*.>", ">", False),  # "*.>" needs two segments or more, ">" matches "a"
        (">", "*.>", True),
        ("*.*", "*.>", False),
        ("a.*.>", "a.>", False),
        ("a.>", "a.*.>", True),
        ("a.b", "a.*", False),
        ("a.b", "a.b", True),
    ],
)
def test_pattern_covers(outer, inner, covers):
    assert pattern_covers(outer, inner) is covers


# A model of the grammar to check matching and containment against: regular expressions for
# matching, and exhaustive enumeration of short topic names for containment.

LITERALS = ["a", "b"]
UNIVERSE = ["a", "b", "z"]  # "z" appears in no pattern: what only a wildcard matches

patterns = (
    st.lists(st.sampled_from(["a", "b", "*"]), min_size=0, max_size=3)
    .flatmap(lambda head: st.sampled_from([[*head, ">"], head] if head else [[">"], ["*"]]))
    .map(".".join)
)


def regex_for(pattern: str) -> re.Pattern[str]:
    parts = [
        "[^.]+" if seg == "*" else "[^.]+(?:\\.[^.]+)*" if seg == ">" else re.escape(seg) for seg in pattern.split(".")
    ]
    return re.compile("\\.".join(parts))


@settings(max_examples=300, deadline=None)
@given(patterns, st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=5).map(".".join))
def test_topic_matches_agrees_with_a_regular_expression(pattern, topic):
    assert is_valid_pattern(pattern)
    assert topic_matches(pattern, topic) is bool(regex_for(pattern).fullmatch(topic))


def topics_up_to(length: int):
    for n in range(1, length + 1):
        for segments in itertools.product(UNIVERSE, repeat=n):
            yield ".".join(segments)


@settings(max_examples=300, deadline=None)
@given(patterns, patterns)
def test_pattern_covers_is_containment_of_the_matched_topic_sets(outer, inner):
    # A topic inner matches but outer does not, if one exists, exists with at most one segment
    # more than the longer pattern, over an alphabet with a segment neither pattern names.
    longest = max(outer.count("."), inner.count(".")) + 2
    expected = all(topic_matches(outer, topic) for topic in topics_up_to(longest) if topic_matches(inner, topic))
    assert pattern_covers(outer, inner) is expected
