"""Who may publish and subscribe to what: tokens and grants over topic names and patterns.

Topic names and patterns (the grammar, ``*`` and ``>``) are defined in :mod:`rsnet.broker.names`.

Tokens
------
Clients authenticate with a bearer token (the HELLO's ``auth_token``). The broker's config holds
only ``sha256:<hex>`` hashes of the tokens (:func:`hash_token`); :meth:`Authorizer.authenticate`
hashes what a client offers and compares it in constant time with every configured hash. A
token is never stored, logged or put in an error message. Tokens are random secrets of at least
128 bits (:func:`generate_token` makes 256), so a fast hash is enough: a slow password hash
(scrypt, argon2) protects guessable passwords from offline guessing, which a 2**128 search
space already rules out, and would cost CPU on every connection attempt, which an attacker can
trigger at will.

Grants
------
Each token names a principal with ``publish`` and ``subscribe`` grants (patterns). Publishing to a
topic needs a publish grant that matches it. Subscribing to a topic or pattern needs a subscribe
grant that covers it: every topic the subscription could ever match, including topics created
later, must match the grant (:func:`pattern_covers`). A grant ``sensors.*`` allows ``sensors.*``
and ``sensors.kitchen`` but not ``sensors.>``, ``*`` or ``>``; a grant ``sensors.>`` allows
``sensors.*.temp``.

With no tokens configured, auth is off: :meth:`Authorizer.authenticate` returns
:data:`ANONYMOUS`, who may publish and subscribe to everything, and the authorizer logs a warning
(logger ``rsnet.broker.auth``) when it is created.

This module imports the standard library and :mod:`rsnet.broker.names`; the configuration
(:mod:`rsnet.broker.config`) imports it to check token hashes, never the other way round: the
:class:`Authorizer` takes anything shaped like ``config.auth`` (:class:`AuthSettings`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Sequence
from typing import Protocol

from .names import is_valid_pattern, is_valid_topic, pattern_covers, topic_matches

log = logging.getLogger("rsnet.broker.auth")

MIN_TOKEN_LENGTH = 16
"""Shortest token :func:`hash_token` accepts, in characters (or bytes)."""

MAX_TOKEN_LENGTH = 1024
"""Longest token :meth:`Authorizer.authenticate` looks at; anything longer is refused unhashed."""

HASH_PREFIX = "sha256:"

_HASH = re.compile(r"sha256:[0-9a-f]{64}")


class TokenEntry(Protocol):
    """One configured token: what :class:`rsnet.broker.config.TokenConfig` holds."""

    @property
    def name(self) -> str: ...
    @property
    def hash(self) -> str: ...
    @property
    def publish(self) -> Sequence[str]: ...
    @property
    def admin(self) -> Sequence[str]: ...
    @property
    def subscribe(self) -> Sequence[str]: ...


class AuthSettings(Protocol):
    """The tokens to accept: what :class:`rsnet.broker.config.AuthConfig` holds."""

    @property
    def tokens(self) -> Sequence[TokenEntry]: ...


# -- tokens ---------------------------------------------------------------------------------


def generate_token() -> str:
    """A new random token (256 bits, URL-safe base64): give it to the client, configure its hash."""
    return secrets.token_urlsafe(32)


def hash_token(token: str | bytes) -> str:
    """The ``sha256:<hex>`` form of a token, for the ``auth.tokens[].hash`` setting.

    Refuses tokens shorter than :data:`MIN_TOKEN_LENGTH`, so that a fast hash stays safe.
    """
    raw = token.encode() if isinstance(token, str) else bytes(token)
    if len(raw) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"a token must be at least {MIN_TOKEN_LENGTH} characters of random data (got {len(raw)}): "
            "make one with rsnet broker hash-token --generate (in Python: generate_token())"
        )
    return HASH_PREFIX + hashlib.sha256(raw).hexdigest()


def is_token_hash(text: object) -> bool:
    """Whether ``text`` is a well-formed ``sha256:<64 lowercase hex digits>`` hash."""
    return isinstance(text, str) and _HASH.fullmatch(text) is not None


# -- principals -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Principal:
    """An authenticated client: the token's configured name and its grants (patterns)."""

    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    admin: tuple[str, ...] = ()  # topics it may create, delete and purge


ANONYMOUS = Principal("anonymous", (">",), (">",), (">",))
"""The principal of every client while auth is off: everything is allowed."""


class Authorizer:
    """Authenticates tokens against ``config.tokens`` and checks grants (see the module docstring).

    ``config`` is an :class:`rsnet.broker.config.AuthConfig` (already validated: well-formed
    hashes, valid patterns, unique names and hashes). Checks never raise: an invalid name, a
    pattern where a topic is needed, a missing principal, all answer ``False``.
    """

    def __init__(self, config: AuthSettings) -> None:
        self._entries: list[tuple[bytes, Principal]] = [
            (
                bytes.fromhex(entry.hash.removeprefix(HASH_PREFIX)),
                Principal(entry.name, tuple(entry.publish), tuple(entry.subscribe), tuple(entry.admin)),
            )
            for entry in config.tokens
        ]
        self.enabled = bool(self._entries)
        if not self.enabled:
            log.warning(
                "auth is off: no tokens configured in [auth]; every client may publish and subscribe to every topic"
            )

    @property
    def principals(self) -> list[Principal]:
        return [principal for _, principal in self._entries]

    def authenticate(self, token: str | bytes | None) -> Principal | None:
        """The principal whose token this is, or None (no, empty, wrong or malformed token).

        While auth is off, every client is :data:`ANONYMOUS`. The offered token's hash is
        compared with every configured hash, in constant time, whether or not one matched.
        """
        if not self.enabled:
            return ANONYMOUS
        if isinstance(token, str):
            raw = token.encode("utf-8", "surrogatepass")
        elif isinstance(token, (bytes, bytearray)):
            raw = bytes(token)
        else:
            return None
        if not raw or len(raw) > MAX_TOKEN_LENGTH:
            return None
        digest = hashlib.sha256(raw).digest()
        found: Principal | None = None
        for expected, principal in self._entries:
            if hmac.compare_digest(digest, expected) and found is None:
                found = principal
        return found

    def can_publish(self, principal: Principal | None, topic: str) -> bool:
        """Whether the principal may publish to ``topic`` (a concrete, valid topic name)."""
        if principal is None or not is_valid_topic(topic):
            return False
        return any(topic_matches(grant, topic) for grant in principal.publish)

    def can_admin(self, principal: Principal | None, topic: str) -> bool:
        """Whether the principal may create, delete and purge ``topic`` (a concrete topic name)."""
        if principal is None or not is_valid_topic(topic):
            return False
        return any(topic_matches(grant, topic) for grant in principal.admin)

    def can_subscribe(self, principal: Principal | None, topic_or_pattern: str) -> bool:
        """Whether the principal may subscribe to a topic or pattern: a grant must cover every
        topic it could ever match."""
        if principal is None or not is_valid_pattern(topic_or_pattern):
            return False
        return any(pattern_covers(grant, topic_or_pattern) for grant in principal.subscribe)
