"""Who may publish and subscribe to what: topic names, wildcard patterns, tokens and grants.

Topic names and patterns
------------------------
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

This module imports only the standard library (and, for type checking, ``rsnet.broker.config``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import AuthConfig

log = logging.getLogger("rsnet.broker.auth")

MAX_NAME_LENGTH = 255
"""Longest topic name or pattern, in characters."""

MIN_TOKEN_LENGTH = 16
"""Shortest token :func:`hash_token` accepts, in characters (or bytes)."""

MAX_TOKEN_LENGTH = 1024
"""Longest token :meth:`Authorizer.authenticate` looks at; anything longer is refused unhashed."""

HASH_PREFIX = "sha256:"

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
_HASH = re.compile(r"sha256:[0-9a-f]{64}")


class InvalidName(ValueError):
    """A topic name or pattern outside the grammar; the message says what is wrong."""


# -- names and patterns -------------------------------------------------------------------


def _check(text: object, *, wildcards: bool) -> list[str]:
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
                raise InvalidName(f"topic name {_show(text)} contains a wildcard; publish to a concrete topic")
            if segment == ">" and index != last:
                raise InvalidName(f"pattern {_show(text)}: '>' may only be the last segment")
            continue
        if "*" in segment or ">" in segment:
            raise InvalidName(f"{what} {_show(text)}: '*' and '>' must be whole segments")
        if not _SEGMENT.fullmatch(segment):
            raise InvalidName(f"{what} {_show(text)}: segment {_show(segment)} may only hold A-Z a-z 0-9 _ -")
    return segments


def _show(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def validate_topic(name: object) -> str:
    """Return ``name`` if it is a concrete topic name (no wildcards), else raise InvalidName."""
    _check(name, wildcards=False)
    return name  # type: ignore[return-value]


def validate_pattern(pattern: object) -> str:
    """Return ``pattern`` if it is a valid pattern (a topic name is one too), else raise InvalidName."""
    _check(pattern, wildcards=True)
    return pattern  # type: ignore[return-value]


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
            f"a token must be at least {MIN_TOKEN_LENGTH} characters of random data; "
            "use generate_token() (rsnet broker hash-token --generate)"
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


ANONYMOUS = Principal("anonymous", (">",), (">",))
"""The principal of every client while auth is off: everything is allowed."""


class Authorizer:
    """Authenticates tokens against ``config.tokens`` and checks grants (see the module docstring).

    ``config`` is an :class:`rsnet.broker.config.AuthConfig` (already validated: well-formed
    hashes, valid patterns, unique names and hashes). Checks never raise: an invalid name, a
    pattern where a topic is needed, a missing principal, all answer ``False``.
    """

    def __init__(self, config: AuthConfig) -> None:
        self._entries: list[tuple[bytes, Principal]] = [
            (
                bytes.fromhex(entry.hash.removeprefix(HASH_PREFIX)),
                Principal(entry.name, tuple(entry.publish), tuple(entry.subscribe)),
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

    def can_subscribe(self, principal: Principal | None, topic_or_pattern: str) -> bool:
        """Whether the principal may subscribe to a topic or pattern: a grant must cover every
        topic it could ever match."""
        if principal is None or not is_valid_pattern(topic_or_pattern):
            return False
        return any(pattern_covers(grant, topic_or_pattern) for grant in principal.subscribe)
