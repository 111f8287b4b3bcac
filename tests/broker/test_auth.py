"""Tokens, grants, and the bypasses an attacker would try (the name grammar: test_names.py)."""

from __future__ import annotations

import hashlib
import hmac
import logging

import pytest

from rsnet.broker import auth
from rsnet.broker.auth import (
    ANONYMOUS,
    Authorizer,
    generate_token,
    hash_token,
    is_token_hash,
)
from rsnet.broker.config import AuthConfig, TokenConfig
from rsnet.broker.names import MAX_NAME_LENGTH

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
