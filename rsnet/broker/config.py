"""The broker's configuration: ``rsnet broker --config rsnet.toml``, environment, command line.

    config = load_config("rsnet.toml", os.environ, {"data_dir": args.data_dir, "listen.tcp": args.tcp})
    settings = topic_config(config, "sensors.kitchen")

Sources, later ones winning: built-in defaults, the TOML file (stdlib ``tomllib``), environment
variables, command-line overrides. The result is validated as a whole by pydantic; every problem
is reported at once, each naming its field (``topics[2].retention.max_bytes: Input should be
greater than 0``) and, for a value that came from the environment or the command line, where it
came from. Values are never echoed back in errors (a token pasted as a hash stays out of logs).

Schema (``server/rsnet.toml`` is a commented example of every key)::

    data_dir = "/var/lib/rsnet"     # omitted: every topic in memory; set: topics durable by default
    fsync = "always"                # always | interval | never (only for durable topics)
    fsync_interval_ms = 100         # for "interval"
    max_topics = 10000              # topics at most; a publish creating one more gets TOO_MANY_TOPICS
    max_open_topics = 128           # durable topics with their files open at once (omitted: 1/8
                                    # of the fd limit); the least recently used give theirs up
    idle_topic_close_s = 60         # a durable topic with no producer nor subscriber for this long
                                    # has its log (its open files) closed; reopened on demand
    memory_budget_bytes = 1073741824  # memory topics together, in memory; beyond: STORAGE_FULL
                                    # (omitted: half the machine's memory)
    unclean_recovery = false        # true: open topics despite damage recovery cannot place (see server/README.md)

    [listen]
    tcp = "127.0.0.1:7600"          # "HOST:PORT" ("[::1]:7600" for IPv6); "" = off
    ws = "127.0.0.1:7601"           # WebSocket; omitted or "" = off (the default)
    tls = { cert = "cert.pem", key = "key.pem" }   # optional; TLS on tcp and ws (tls://, wss://)

    [topic_defaults]                # for topics no [[topics]] entry matches; built-in values shown
    storage = "default"             # memory | durable | default (durable iff data_dir is set)
    auto_create = "publish"         # publish: publishing to a missing topic creates it | never
    subscribe_missing = "wait"      # wait: a subscription to a missing topic waits for it | fail
    retention = { max_bytes = 1073741824, max_age_s = 604800 }   # also max_records; omitted = no limit
                                    # and max_producers = 10000, producer_max_age_s = 604800: the
                                    # idempotent producers remembered (see protocol/BROKER.md)
    slow_subscriber = { policy = "backpressure", max_lag = 10000 }  # backpressure | drop | disconnect

    [[topics]]                      # first entry whose pattern matches the topic wins
    pattern = "sensors.>"           # a topic pattern (see rsnet.broker.names for * and >)
    storage = "memory"              # any key left out comes from [topic_defaults];
    retention = { max_records = 100000 }   # a table (retention, slow_subscriber) replaces the
                                    # default's table whole: here no byte or age limit
                                    # (settings an admin gives one topic, rsnet topics create
                                    # --policy ..., win over all of these, key by key: see
                                    # rsnet.broker.overrides)

    [auth]                          # no tokens: auth is off (a warning is logged at startup)
    [[auth.tokens]]
    name = "ingest"                 # A-Z a-z 0-9 _ . @ -, shown in logs and metrics
    hash = "sha256:<64 hex digits>" # rsnet broker hash-token; never the token itself
    publish = ["sensors.>"]         # patterns this token may publish to
    subscribe = []                  # patterns it may subscribe to (a subscription must lie within one)

    [metrics]                       # omitted: no metrics endpoint
    listen = "127.0.0.1:9100"       # GET /metrics (Prometheus), GET /health, GET / (live view)

    [log]
    format = "text"                 # text | json (one JSON object per line)
    level = "info"                  # debug | info | warning | error

Default fsync policy: ``always``. ``always`` and ``interval`` both acknowledge a record only
once an fsync has covered it, so neither loses an acknowledged record to a crash or a power
loss; they differ in cost. ``always`` fsyncs every batch the topic writer appends (records that
arrive together share one fsync): the lowest acknowledgement latency, and batches grow by
themselves under load. ``interval`` fsyncs once per ``fsync_interval_ms``: acknowledgements, and
deliveries to subscribers, wait up to that long, but a busy topic costs the disk at most one
fsync per interval (worth it on disks with slow flushes, or with many busy topics). ``never`` acknowledges once the OS has the
bytes: it survives the broker process dying, not the machine crashing or losing power, and is
the only policy that can lose acknowledged records. rsnet is a single node with no replica to
cover for a lost write, so that risk is opt-in and the default is the policy with the lowest
latency among the safe ones.

Environment overrides: ``RSNET_BROKER__<KEY>[__<KEY>...]=<value>``, keys case-insensitive,
``__`` descending into tables and (by number) into arrays::

    RSNET_BROKER__DATA_DIR=/var/lib/rsnet
    RSNET_BROKER__LISTEN__TCP=0.0.0.0:7600
    RSNET_BROKER__METRICS__LISTEN=0.0.0.0:9100        # creates [metrics], so turns it on
    RSNET_BROKER__TOPICS__0__RETENTION__MAX_RECORDS=5000
    RSNET_BROKER__AUTH__TOKENS='[{name="ops", hash="sha256:...", subscribe=[">"]}]'

A value is a string (pydantic converts ``100``, ``true``...) unless it starts with ``[`` or
``{`` and parses as a TOML inline array or table (``[::1]:7600`` stays a string). An empty value
unsets (``RSNET_BROKER__LISTEN__WS=``; ``RSNET_BROKER__METRICS=`` turns the endpoint off).
Tables given as values merge into the file's tables; arrays replace. Command-line overrides (:func:`load_config`'s ``overrides``) work the
same with dotted keys (``{"listen.tcp": "0.0.0.0:7600"}``) and apply last; a ``None`` value means
"not given" and is skipped, as argparse leaves absent options.

Relative paths (``data_dir``, TLS files) are relative to the broker's working directory.

This module imports pydantic, :mod:`rsnet.broker.names` (the topic grammar) and
:mod:`rsnet.broker.auth` (the token hash format); nothing that does I/O beyond reading the
config file.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    FilePath,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..client_rules import HANDSHAKE_TIMEOUT, keepalive_ms
from ..net.session import DEFAULT_OUTPUT_BUDGET_BYTES
from ..protocol import MAX_SETTING
from .auth import is_token_hash
from .names import InvalidName, is_wildcard, pattern_covers, topic_matches, validate_pattern, validate_topic
from .storage.log import DEFAULT_MAX_PRODUCERS, DEFAULT_PRODUCER_MAX_AGE_MS

ENV_PREFIX = "RSNET_BROKER__"

MAX_COUNT = 1 << 62
"""Largest record count, byte count, lag or limit a setting may name (far beyond any real
broker; the answers that show settings are msgpack, whose integers stop at 2**64)."""
MAX_AGE_S = 100 * 365 * 86400.0
"""Longest duration a setting may name: a hundred years (for no age limit: leave it out)."""

Count = Annotated[int, Field(gt=0, le=MAX_COUNT)]
"""A whole number from 1 to MAX_COUNT."""
Age = Annotated[float, Field(gt=0, le=MAX_AGE_S, allow_inf_nan=False)]
"""Seconds above 0, at most MAX_AGE_S."""

FsyncPolicyName = Literal["always", "interval", "never"]
StorageChoice = Literal["memory", "durable", "default"]
SlowPolicyName = Literal["backpressure", "drop", "disconnect"]
AutoCreate = Literal["publish", "never"]
SubscribeMissing = Literal["wait", "fail"]


class ConfigError(Exception):
    """The configuration cannot be read or is invalid; ``problems`` has one line per field."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.message = message
        self.problems = problems or []
        super().__init__(message)

    def __str__(self) -> str:
        return "\n  ".join([self.message, *self.problems])


# -- field types ------------------------------------------------------------------------------

_TOKEN_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_ADDRESS = re.compile(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^\s:\[\]]+)):(?P<port>\d{1,5})")


def _empty_is_none(value: Any) -> Any:
    return None if isinstance(value, str) and not value.strip() else value


def _pattern(value: str) -> str:
    try:
        return validate_pattern(value)
    except InvalidName as error:
        raise PydanticCustomError("topic_pattern", "{reason}", {"reason": str(error)}) from None


def _token_hash(value: str) -> str:
    value = value.strip().lower()
    if not is_token_hash(value):
        raise PydanticCustomError(
            "token_hash",
            "expected 'sha256:' and 64 hex digits, the output of rsnet broker hash-token "
            "(configure the token's hash, never the token itself)",
        )
    return value


def _token_name(value: str) -> str:
    if not _TOKEN_NAME.fullmatch(value):
        raise PydanticCustomError("token_name", "expected 1 to 64 characters of A-Z a-z 0-9 _ . @ -")
    return value


TopicPattern = Annotated[str, AfterValidator(_pattern)]
TokenHash = Annotated[str, AfterValidator(_token_hash)]
TokenName = Annotated[str, AfterValidator(_token_name)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Address(_Model):
    """A listening address; written ``"HOST:PORT"`` (``"[::1]:7600"`` for IPv6), port 0 = any free port."""

    host: str = Field(min_length=1)
    port: int = Field(ge=0, le=65535)

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, (tuple, list)) and len(value) == 2:  # (host, port), as argparse may give
            return {"host": value[0], "port": value[1]}
        if isinstance(value, str):
            match = _ADDRESS.fullmatch(value.strip())
            if match is None:
                raise PydanticCustomError("address", "expected HOST:PORT, e.g. 127.0.0.1:7600 or [::1]:7600")
            if match["v6"] is not None:
                try:
                    ipaddress.IPv6Address(match["v6"])
                except ValueError:
                    raise PydanticCustomError("address", "not an IPv6 address between [ and ]") from None
            return {"host": match["v6"] or match["host"], "port": int(match["port"])}
        return value

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @model_serializer
    def _serialize(self) -> str:
        return str(self)


OptionalAddress = Annotated[Address | None, BeforeValidator(_empty_is_none)]


class TLSConfig(_Model):
    cert: FilePath
    """PEM certificate chain (the server's certificate first)."""
    key: FilePath
    """PEM private key of the certificate."""


def _carried_by_a_hello(seconds: float) -> float:
    """A keepalive the HELLO and WELCOME can carry (client_rules.keepalive_ms says which)."""
    keepalive_ms(seconds)
    return seconds


class ListenConfig(_Model):
    tcp: OptionalAddress = Address(host="127.0.0.1", port=7600)
    ws: OptionalAddress = None
    tls: TLSConfig | None = None
    keepalive_interval_s: Annotated[
        float, Field(ge=0, le=MAX_SETTING // 1000, allow_inf_nan=False), AfterValidator(_carried_by_a_hello)
    ] = 20.0
    """SPEC 10.1: PING after this long without sending; a peer silent for three is dropped. 0: off."""
    max_connections: Count = 10_000
    """Connections served at once over both listeners; one more gets CONN_ERROR GOING_AWAY. At
    most half the process's file descriptor limit less 32 (``rsnet.net.server.connection_limit``):
    a larger value is lowered, with a warning."""
    handshake_timeout_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = HANDSHAKE_TIMEOUT
    """A connection that has not completed its handshake (TLS, WebSocket, HELLO) this long after
    it was accepted is dropped: it holds one of ``max_connections`` meanwhile."""
    output_budget_bytes: Count = DEFAULT_OUTPUT_BUDGET_BYTES
    """What the connections may hold together of records read for subscribers and not yet taken
    by their peers: each connection an equal share of it, at most 16 MiB
    (``rsnet.net.session.OutputBudget``)."""


class RetentionConfig(_Model):
    """Limits on what a topic keeps; the oldest records go first. None = no limit of that kind.

    ``max_producers`` and ``producer_max_age_s`` bound the idempotent producers the topic
    remembers (the least recently written are forgotten first; see protocol/BROKER.md): the
    count always has a limit, the age may be None."""

    max_records: Count | None = None
    max_bytes: Count | None = None
    max_age_s: Age | None = None
    max_producers: Count = DEFAULT_MAX_PRODUCERS
    producer_max_age_s: Age | None = DEFAULT_PRODUCER_MAX_AGE_MS / 1000

    @property
    def max_age_ms(self) -> int | None:
        """``max_age_s`` in whole milliseconds (at least 1), as the storage engine counts."""
        return None if self.max_age_s is None else max(1, round(self.max_age_s * 1000))

    @property
    def producer_max_age_ms(self) -> int | None:
        """``producer_max_age_s`` in whole milliseconds (at least 1)."""
        return None if self.producer_max_age_s is None else max(1, round(self.producer_max_age_s * 1000))


class SlowSubscriberConfig(_Model):
    """What a topic does about a subscriber lagging more than ``max_lag`` records behind."""

    policy: SlowPolicyName = "backpressure"
    max_lag: Count = 10_000


DEFAULT_RETENTION = RetentionConfig(max_bytes=1 << 30, max_age_s=7 * 24 * 3600.0)


class TopicDefaults(_Model):
    storage: StorageChoice = "default"
    auto_create: AutoCreate = "publish"
    subscribe_missing: SubscribeMissing = "wait"
    retention: RetentionConfig = DEFAULT_RETENTION
    slow_subscriber: SlowSubscriberConfig = SlowSubscriberConfig()


class TopicRule(_Model):
    """A ``[[topics]]`` entry: settings for topics matching ``pattern``; None = from ``topic_defaults``."""

    pattern: TopicPattern
    storage: StorageChoice | None = None
    auto_create: AutoCreate | None = None
    subscribe_missing: SubscribeMissing | None = None
    retention: RetentionConfig | None = None
    slow_subscriber: SlowSubscriberConfig | None = None


class TokenConfig(_Model):
    name: TokenName
    hash: TokenHash
    publish: tuple[TopicPattern, ...] = ()
    subscribe: tuple[TopicPattern, ...] = ()
    admin: tuple[TopicPattern, ...] = ()  # topics it may create, delete and purge ($admin)


class AuthConfig(_Model):
    tokens: tuple[TokenConfig, ...] = ()


class MetricsConfig(_Model):
    listen: Address = Address(host="127.0.0.1", port=9100)


class LogConfig(_Model):
    format: Literal["text", "json"] = "text"
    level: Annotated[
        Literal["debug", "info", "warning", "error"],
        BeforeValidator(lambda value: value.lower() if isinstance(value, str) else value),
    ] = "info"


class BrokerConfig(_Model):
    """The whole configuration (see the module docstring); build it with :func:`load_config`."""

    listen: ListenConfig = ListenConfig()
    data_dir: Annotated[Path | None, BeforeValidator(_empty_is_none)] = None
    fsync: FsyncPolicyName = "always"
    fsync_interval_ms: Annotated[int, Field(gt=0, le=3_600_000)] = 100
    """Under ``interval``, acknowledgements wait for it: at most an hour."""
    max_topics: Count = 10_000
    max_open_topics: Count | None = None
    """Durable topics open at once; None (and at most): an eighth of the file descriptor limit."""
    idle_topic_close_s: Annotated[float, Field(ge=0, le=MAX_AGE_S, allow_inf_nan=False)] = 60.0
    memory_budget_bytes: Count | None = None
    """What memory topics may hold together, in bytes of memory (their records and about 80
    bytes each beside): an offer beyond is refused STORAGE_FULL. None: half the machine's memory."""
    unclean_recovery: bool = False
    topic_defaults: TopicDefaults = TopicDefaults()
    topics: tuple[TopicRule, ...] = ()
    auth: AuthConfig = AuthConfig()
    metrics: Annotated[MetricsConfig | None, BeforeValidator(_empty_is_none)] = None
    log: LogConfig = LogConfig()

    @property
    def fsync_interval(self) -> float | None:
        """Seconds between syncs under the ``interval`` policy, else None."""
        return self.fsync_interval_ms / 1000 if self.fsync == "interval" else None

    @model_validator(mode="after")
    def _consistent(self) -> BrokerConfig:
        problems = _cross_field_problems(self)
        if problems:
            raise PydanticCustomError("config", "{problems}", {"problems": "\n".join(problems)})
        return self

    def describe(self) -> dict[str, Any]:
        """The effective configuration as JSON-able data for a startup log: token hashes left out."""
        data = self.model_dump(mode="json")
        data["auth"] = {"tokens": [token.name for token in self.auth.tokens]}
        return data


def _cross_field_problems(config: BrokerConfig) -> list[str]:
    problems = []
    listen = config.listen
    if listen.tcp is None and listen.ws is None:
        problems.append("listen: both tcp and ws are off; the broker would accept no connections")
    addresses = [("listen.tcp", listen.tcp), ("listen.ws", listen.ws)]
    if config.metrics is not None:
        addresses.append(("metrics.listen", config.metrics.listen))
    seen: dict[tuple[str, int], str] = {}
    for where, address in addresses:
        if address is None or address.port == 0:
            continue
        key = (address.host, address.port)
        if key in seen:
            problems.append(f"{where}: same address as {seen[key]} ({address})")
        seen.setdefault(key, where)
    if config.data_dir is None:
        if config.topic_defaults.storage == "durable":
            problems.append("topic_defaults.storage: 'durable' needs data_dir")
        for index, rule in enumerate(config.topics):
            if rule.storage == "durable":
                problems.append(f"topics[{index}].storage: 'durable' needs data_dir")
    for index, rule in enumerate(config.topics):
        for earlier_index, earlier in enumerate(config.topics[:index]):
            if pattern_covers(earlier.pattern, rule.pattern):
                problems.append(
                    f"topics[{index}].pattern: never used: topics[{earlier_index}].pattern "
                    f"{earlier.pattern!r} comes first and matches every topic this one does"
                )
                break
    declared = sum(not is_wildcard(rule.pattern) for rule in config.topics)
    if declared > config.max_topics:
        problems.append(
            f"max_topics: {config.max_topics} is fewer than the {declared} topics [[topics]] names outright"
        )
    names: dict[str, int] = {}
    hashes: dict[str, int] = {}
    for index, token in enumerate(config.auth.tokens):
        if token.name in names:
            problems.append(f"auth.tokens[{index}].name: already used by auth.tokens[{names[token.name]}]")
        if token.hash in hashes:
            problems.append(f"auth.tokens[{index}].hash: same as auth.tokens[{hashes[token.hash]}].hash")
        names.setdefault(token.name, index)
        hashes.setdefault(token.hash, index)
    return problems


# -- resolution -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TopicConfig:
    """The effective settings of one topic."""

    storage: Literal["memory", "durable"]
    auto_create: AutoCreate
    subscribe_missing: SubscribeMissing
    retention: RetentionConfig
    slow_subscriber: SlowSubscriberConfig
    rule: str | None
    """The pattern of the ``[[topics]]`` entry that matched, or None (``topic_defaults``)."""
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    """Where each setting comes from, by dotted key (``storage``, ``retention.max_records``,
    ``slow_subscriber.policy``...): ``[[topics]] PATTERN``, ``[topic_defaults]`` (set in the
    configuration) or ``built-in``. A table (retention, slow_subscriber) comes whole from one place."""


def topic_config(config: BrokerConfig, topic: str) -> TopicConfig:
    """The settings of ``topic``: the first ``[[topics]]`` entry matching it, the keys it leaves
    out taken from ``topic_defaults``; storage ``default`` resolved by ``data_dir``.

    Raises :class:`rsnet.broker.names.InvalidName` if ``topic`` is not a topic name.
    """
    validate_topic(topic)
    defaults = config.topic_defaults
    rule = next((rule for rule in config.topics if topic_matches(rule.pattern, topic)), None)

    def pick(name: str) -> Any:
        value = getattr(rule, name) if rule is not None else None
        return getattr(defaults, name) if value is None else value

    def source(name: str) -> str:
        if rule is not None and getattr(rule, name) is not None:
            return f"[[topics]] {rule.pattern}"
        return "[topic_defaults]" if name in defaults.model_fields_set else "built-in"

    sources = {"storage": source("storage")}
    for table, keys in (
        ("retention", RetentionConfig.model_fields),
        ("slow_subscriber", SlowSubscriberConfig.model_fields),
    ):
        sources.update((f"{table}.{key}", source(table)) for key in keys)

    storage = pick("storage")
    if storage == "default":
        storage = "durable" if config.data_dir is not None else "memory"
    return TopicConfig(
        storage=storage,
        auto_create=pick("auto_create"),
        subscribe_missing=pick("subscribe_missing"),
        retention=pick("retention"),
        slow_subscriber=pick("slow_subscriber"),
        rule=rule.pattern if rule is not None else None,
        sources=sources,
    )


def declared_topics(config: BrokerConfig) -> list[str]:
    """The ``[[topics]]`` patterns without wildcards: topics the config names outright, which a
    broker creates at startup (so they exist with ``auto_create = "never"``)."""
    return [rule.pattern for rule in config.topics if not is_wildcard(rule.pattern)]


# -- loading ----------------------------------------------------------------------------------


def load_config(
    path: str | Path | None,
    env: Mapping[str, str],
    overrides: Mapping[str, Any] | None = None,
) -> BrokerConfig:
    """Read ``path`` (TOML; None = no file), apply ``RSNET_BROKER__*`` variables from ``env``
    (pass ``os.environ``), then ``overrides`` (dotted keys, None values skipped), and validate.

    Raises :class:`ConfigError` listing every problem, each naming its field.
    """
    raw: dict[str, Any] = {}
    origin = str(path) if path is not None else "no config file"
    if path is not None:
        try:
            with open(path, "rb") as file:
                raw = tomllib.load(file)
        except OSError as error:
            raise ConfigError(f"cannot read config file {origin}: {error.strerror or error}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"cannot parse config file {origin}: {error}") from None

    sources: dict[tuple[str | int, ...], str] = {}
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        source = f"environment variable {name}"
        keys = name[len(ENV_PREFIX) :].lower().split("__")
        _apply(raw, keys, _parse_env_value(env[name], source), source, sources)
    for key, value in (overrides or {}).items():
        if value is not None:
            _apply(raw, key.split("."), value, f"command-line override {key}", sources)

    try:
        return BrokerConfig.model_validate(raw)
    except ValidationError as error:
        problems = [
            line for item in error.errors(include_url=False, include_input=False) for line in _describe(item, sources)
        ]
        raise ConfigError(f"invalid broker configuration ({origin}):", problems) from None


_BRACKETED_ADDRESS = re.compile(r"\[[0-9A-Fa-f:.%a-z]*\](:\d*)?")


def _parse_env_value(value: str, source: str) -> Any:
    """An environment variable's value: a TOML array or inline table when in brackets or
    braces (an IPv6 address in brackets, ``[::1]:7600``, is a string), else the string."""
    text = value.strip()
    if not text:
        return None
    if text[0] in "[{":
        try:
            return tomllib.loads(f"value = {text}")["value"]
        except tomllib.TOMLDecodeError as error:
            if _BRACKETED_ADDRESS.fullmatch(text):
                return value
            raise ConfigError(f"{source}: not a TOML {'array' if text[0] == '[' else 'table'}: {error}") from None
    return value


def _apply(
    raw: dict[str, Any],
    keys: list[str],
    value: Any,
    source: str,
    sources: dict[tuple[str | int, ...], str],
) -> None:
    if not all(keys):
        raise ConfigError(f"{source}: empty key")
    node: Any = raw
    path: list[str | int] = []
    for key in keys[:-1]:
        node, step = _descend(node, key, source, path)
        path.append(step)
    last = keys[-1]
    if isinstance(node, list):
        index = _index(node, last, source, path)
        path.append(index)
        node[index] = _merged(node[index], value)
    elif isinstance(node, dict):
        _check_not_index(node, last, source, path)
        path.append(last)
        node[last] = _merged(node.get(last), value)
    else:
        raise ConfigError(f"{source}: {_loc(path)} is not a table")
    sources[tuple(path)] = source


def _descend(node: Any, key: str, source: str, path: list[str | int]) -> tuple[Any, str | int]:
    if isinstance(node, list):
        index = _index(node, key, source, path)
        return node[index], index
    if not isinstance(node, dict):
        raise ConfigError(f"{source}: {_loc(path)} is not a table")
    _check_not_index(node, key, source, path)
    child = node.get(key)
    if child is None:
        child = node[key] = {}
    return child, key


def _check_not_index(node: dict[str, Any], key: str, source: str, path: list[str | int]) -> None:
    """No table of the configuration has a key of digits: such a key indexes an array (of
    ``[[topics]]``, say) that the file does not have."""
    if key.isdigit() and path:
        raise ConfigError(f"{source}: {_loc(path)} has no entry {key} (it has none)")


def _index(node: list[Any], key: str, source: str, path: list[str | int]) -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise ConfigError(f"{source}: {_loc(path)} has no entry {key} (it has {len(node)})")
    return int(key)


def _merged(old: Any, new: Any) -> Any:
    """Tables merge key by key, anything else replaces."""
    if isinstance(old, dict) and isinstance(new, dict):
        merged = dict(old)
        for key, value in new.items():
            merged[key] = _merged(old.get(key), value)
        return merged
    return new


def _loc(loc: tuple[str | int, ...] | list[str | int]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _describe(error: Any, sources: Mapping[tuple[str | int, ...], str]) -> list[str]:
    loc = tuple(error["loc"])
    if not loc:
        return error["msg"].split("\n")  # cross-field problems, each naming its field
    line = f"{_loc(loc)}: {error['msg']}"
    origin = next((sources[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in sources), None)
    if origin is None:  # a table only a source below it made (RSNET_BROKER__LISTN__TCP: listn)
        origin = next((source for key, source in sources.items() if key[: len(loc)] == loc), None)
    return [f"{line} (from {origin})" if origin else line]
