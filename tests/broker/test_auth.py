"""Topic names and patterns, pattern containment, tokens, and the bypasses an attacker would try."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsnet.broker import auth
from rsnet.broker.auth import (
    ANONYMOUS,
    MAX_NAME_LENGTH,
    Authorizer,
    InvalidName,
    generate_token,
    hash_token,
    is_token_hash,
    is_valid_pattern,
    is_valid_topic,
    is_wildcard,
    pattern_covers,
    topic_matches,
    validate_pattern,
    validate_topic,
)
from rsnet.broker.config import AuthConfig, TokenConfig

INGEST = "ingest-token-0123456789abcdef"
DASHBOARD = "dashboard-token-0123456789abcdef"
OPS = "ops-token-0123456789abcdef-xyz"


@pytest.fixture
def authorizer() -> Authorizer:
    return Authorizer(
        AuthConfig(
            tokens=[
                TokenConfig(name="ingest", hash=hash_token(INGEST), publish=["sensors.>"], subscribe=[]),
                TokenConfig(name="dashboard", hash=hash_token(DASHBOARD), publish=[], subscribe=["sensors.*"]),
                TokenConfig(
                    name="ops", hash=hash_token(OPS), publish=["ops.log"], subscribe=["sensors.>", "ops.*.status"]
                ),
            ]
        )
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


# -- tokens ---------------------------------------------------------------------------------


def test_hash_token_is_sha256_hex_of_the_utf8_token():
    assert hash_token(INGEST) == "sha256:" + hashlib.sha256(INGEST.encode()).hexdigest()
    assert hash_token(INGEST.encode()) == hash_token(INGEST)
    assert is_token_hash(hash_token(INGEST))


def test_hash_token_refuses_short_tokens():
    with pytest.raises(ValueError, match="at least 16"):
        hash_token("hunter2")


def test_generated_tokens_are_long_random_and_hashable():
    tokens = {generate_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(len(token) >= 43 and is_token_hash(hash_token(token)) for token in tokens)


@pytest.mark.parametrize(
    "text, ok",
    [
        ("sha256:" + "0" * 64, True),
        ("sha256:" + "0" * 63, False),
        ("sha256:" + "g" * 64, False),
        ("SHA256:" + "0" * 64, False),  # the config normalises case before checking
        ("sha256:" + "0" * 64 + "\n", False),
        ("md5:" + "0" * 32, False),
        (None, False),
    ],
)
def test_is_token_hash(text, ok):
    assert is_token_hash(text) is ok


# -- authentication -------------------------------------------------------------------------


def test_the_right_token_authenticates_its_principal(authorizer):
    principal = authorizer.authenticate(INGEST)
    assert principal is not None
    assert (principal.name, principal.publish, principal.subscribe) == ("ingest", ("sensors.>",), ())
    assert authorizer.authenticate(DASHBOARD.encode()).name == "dashboard"
    assert authorizer.enabled


@pytest.mark.parametrize(
    "token",
    [
        None,
        "",
        b"",
        "wrong-token-0123456789abcdef",
        INGEST + "\n",
        INGEST + " ",
        " " + INGEST,
        INGEST.upper(),
        INGEST[:-1],
        INGEST + INGEST,
        hash_token(INGEST),  # the configured hash is not a token
        hash_token(INGEST).removeprefix("sha256:"),
        "x" * 100_000,
        "\udcff",  # a lone surrogate must not crash the check
        12345,
        ["ingest"],
        {"token": INGEST},
    ],
)
def test_no_token_or_a_wrong_token_authenticates_nobody(authorizer, token):
    assert authorizer.authenticate(token) is None


def test_every_configured_hash_is_compared_even_after_a_match(authorizer, monkeypatch):
    calls = []
    original = hmac.compare_digest

    def compare(a, b):
        calls.append(1)
        return original(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", compare)
    assert authorizer.authenticate(INGEST).name == "ingest"  # the first entry
    assert len(calls) == 3


def test_tokens_appear_nowhere_in_the_authorizer_or_its_logs(authorizer, caplog):
    caplog.set_level(logging.DEBUG)
    principal = authorizer.authenticate(INGEST)
    authorizer.authenticate("wrong-token-0123456789abcdef")
    authorizer.can_publish(principal, "sensors.kitchen")
    everything = repr(vars(authorizer)) + repr(principal) + caplog.text
    assert INGEST not in everything
    assert "wrong-token" not in everything


def test_with_no_tokens_auth_is_off_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="rsnet.broker.auth"):
        authorizer = Authorizer(AuthConfig())
    assert not authorizer.enabled
    assert "auth is off" in caplog.text
    assert authorizer.authenticate(None) is ANONYMOUS
    assert authorizer.authenticate("anything at all") is ANONYMOUS
    assert authorizer.can_publish(ANONYMOUS, "any.topic")
    assert authorizer.can_subscribe(ANONYMOUS, ">")
    assert not authorizer.can_publish(ANONYMOUS, "not..valid")


# -- authorisation: the bypasses ------------------------------------------------------------


def test_no_principal_may_do_nothing(authorizer):
    assert not authorizer.can_publish(None, "sensors.kitchen")
    assert not authorizer.can_subscribe(None, "sensors.kitchen")


def test_a_token_for_another_topic_is_refused(authorizer):
    ingest = authorizer.authenticate(INGEST)
    dashboard = authorizer.authenticate(DASHBOARD)
    assert authorizer.can_publish(ingest, "sensors.kitchen")
    assert authorizer.can_publish(ingest, "sensors.kitchen.temp")
    assert not authorizer.can_publish(ingest, "orders.new")
    assert not authorizer.can_publish(ingest, "sensors")  # '>' needs at least one more segment
    assert not authorizer.can_publish(ingest, "sensorsx.kitchen")
    assert not authorizer.can_subscribe(ingest, "sensors.kitchen")  # publish grants do not let it read
    assert not authorizer.can_publish(dashboard, "sensors.kitchen")  # subscribe grants do not let it write


def test_publishing_needs_a_concrete_topic_even_within_the_grant(authorizer):
    ingest = authorizer.authenticate(INGEST)
    for pattern in ["sensors.*", "sensors.>", ">", "*"]:
        assert not authorizer.can_publish(ingest, pattern)


@pytest.mark.parametrize(
    "subscription, allowed",
    [
        ("sensors.kitchen", True),
        ("sensors.*", True),
        ("sensors.>", False),  # would reach sensors.kitchen.temp
        ("sensors.*.temp", False),
        ("*", False),
        (">", False),
        ("*.kitchen", False),
        ("sensors", False),
        ("orders.*", False),
    ],
)
def test_a_wildcard_may_not_escape_its_grant(authorizer, subscription, allowed):
    dashboard = authorizer.authenticate(DASHBOARD)  # subscribe grant: sensors.*
    assert authorizer.can_subscribe(dashboard, subscription) is allowed


@pytest.mark.parametrize(
    "subscription, allowed",
    [
        ("sensors.*.temp", True),
        ("sensors.>", True),
        ("sensors.a.b.c", True),
        ("ops.db.status", True),
        ("ops.*.status", True),
        ("ops.>", False),
        ("ops.*.*", False),
        ("ops.db.status.x", False),
        (">", False),
    ],
)
def test_several_grants_each_judged_whole(authorizer, subscription, allowed):
    ops = authorizer.authenticate(OPS)  # subscribe grants: sensors.>, ops.*.status
    assert authorizer.can_subscribe(ops, subscription) is allowed


@pytest.mark.parametrize(
    "name",
    [
        "sensors..x",
        "sensors.*x",
        "sensors.kitchen\n",
        "sensors.küche",
        "sensors.ｋitchen",
        "sensors.kitchen/../../orders",
        "sensors." + "x" * MAX_NAME_LENGTH,
        "sensors.>.x",
        "sensors.",
        ".sensors.kitchen",
        "",
        None,
        b"sensors.kitchen",
    ],
)
def test_tricky_names_are_refused_for_publish_and_subscribe(name):
    wide_open = Authorizer(
        AuthConfig(tokens=[TokenConfig(name="all", hash=hash_token(OPS), publish=[">"], subscribe=[">"])])
    )
    principal = wide_open.authenticate(OPS)
    assert not wide_open.can_publish(principal, name)
    assert not wide_open.can_subscribe(principal, name)
