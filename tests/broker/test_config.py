"""The broker's configuration: TOML, environment and command-line overrides, validation, resolution."""

from __future__ import annotations

import re
import textwrap
import typing
from pathlib import Path

import pydantic
import pytest
from pydantic import BaseModel

from rsnet.broker.auth import hash_token
from rsnet.broker.config import (
    Address,
    BrokerConfig,
    ConfigError,
    declared_topics,
    load_config,
    topic_config,
)
from rsnet.broker.names import InvalidName

EXAMPLE = Path(__file__).resolve().parents[2] / "server" / "rsnet.toml"
HASH = hash_token("a-token-of-some-length-0123456789")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rsnet.toml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(tmp_path: Path, text: str, env=None, overrides=None) -> list[str]:
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text), env or {}, overrides)
    return error.value.problems


# -- defaults and the example ---------------------------------------------------------------


def test_defaults_without_a_file():
    config = load_config(None, {}, {})
    assert str(config.listen.tcp) == "127.0.0.1:7600"
    assert config.listen.ws is None and config.listen.tls is None
    assert config.data_dir is None
    assert config.fsync == "always" and config.fsync_interval_ms == 100
    assert config.topics == () and config.auth.tokens == ()
    assert config.metrics is None
    assert (config.log.format, config.log.level) == ("text", "info")


def test_the_example_config_is_valid():
    config = load_config(EXAMPLE, {}, {})
    assert config.data_dir == Path("rsnet-data")
    assert [rule.pattern for rule in config.topics] == ["sensors.>", "orders.*"]
    assert str(config.metrics.listen) == "127.0.0.1:9100"


def all_fields(model: type[BaseModel], seen=None) -> set[str]:
    names = set()
    for name, field in model.model_fields.items():
        names.add(name)
        for candidate in (*typing.get_args(field.annotation), field.annotation):
            for inner in (candidate, *typing.get_args(candidate)):
                if isinstance(inner, type) and issubclass(inner, BaseModel) and inner is not Address:
                    names |= all_fields(inner)
    return names


def test_the_example_config_shows_every_key():
    text = EXAMPLE.read_text()

    def shown(name: str) -> bool:  # as a key, or in a table header, possibly commented out
        return f"{name} =" in text or re.search(rf"^#? ?\[+(\w+\.)*{name}\]", text, re.M) is not None

    missing = [name for name in sorted(all_fields(BrokerConfig)) if not shown(name)]
    assert not missing


def test_an_empty_file_gives_the_defaults(tmp_path):
    assert load_config(write(tmp_path, ""), {}, {}) == load_config(None, {}, {})


def test_the_output_budget_is_a_byte_count_of_the_listeners(tmp_path):
    assert load_config(None, {}, {}).listen.output_budget_bytes == 256 << 20
    assert (
        load_config(write(tmp_path, "[listen]\noutput_budget_bytes = 1048576\n"), {}, {}).listen.output_budget_bytes
        == 1 << 20
    )
    assert problems(tmp_path, "[listen]\noutput_budget_bytes = 0\n") == [
        "listen.output_budget_bytes: Input should be greater than 0"
    ]


# -- errors that name the field -------------------------------------------------------------


def test_an_invalid_value_is_named_by_its_path(tmp_path):
    found = problems(
        tmp_path,
        """
        [[topics]]
        pattern = "a"
        [[topics]]
        pattern = "b"
        [[topics]]
        pattern = "c"
        retention = { max_bytes = 0 }
        """,
    )
    assert found == ["topics[2].retention.max_bytes: Input should be greater than 0"]


def test_every_problem_is_reported_at_once(tmp_path):
    found = problems(
        tmp_path,
        """
        fsync = "sometimes"
        fsync_interval_ms = -5
        [listen]
        tcp = "localhost"
        [[topics]]
        pattern = "sensors..x"
        slow_subscriber = { policy = "ignore", max_lag = 0 }
        [metrics]
        listen = "0.0.0.0:70000"
        [log]
        level = "loud"
        """,
    )
    assert found == [
        "listen.tcp: expected HOST:PORT, e.g. 127.0.0.1:7600 or [::1]:7600",
        "fsync: Input should be 'always', 'interval' or 'never'",
        "fsync_interval_ms: Input should be greater than 0",
        "topics[0].pattern: pattern 'sensors..x' has an empty segment (a leading, trailing or doubled '.')",
        "topics[0].slow_subscriber.policy: Input should be 'backpressure', 'drop' or 'disconnect'",
        "topics[0].slow_subscriber.max_lag: Input should be greater than 0",
        "metrics.listen.port: Input should be less than or equal to 65535",
        "log.level: Input should be 'debug', 'info', 'warning' or 'error'",
    ]


def test_unknown_keys_are_named(tmp_path):
    found = problems(tmp_path, 'data_dri = "/tmp"\n[listen]\ntpc = "127.0.0.1:1"\n')
    assert found == ["listen.tpc: Extra inputs are not permitted", "data_dri: Extra inputs are not permitted"]


def test_the_error_message_starts_with_the_file(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, "fsync = 1\n"), {}, {})
    assert str(error.value).splitlines()[0] == f"invalid broker configuration ({tmp_path / 'rsnet.toml'}):"
    assert str(error.value).splitlines()[1].startswith("  fsync: ")


def test_a_missing_file_and_bad_toml_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope\.toml: No such file"):
        load_config(tmp_path / "nope.toml", {}, {})
    with pytest.raises(ConfigError, match=r"cannot parse config file .*line 2"):
        load_config(write(tmp_path, 'fsync = "always"\nlisten = nope\n'), {}, {})


def test_values_are_never_echoed_in_errors(tmp_path):
    token = "the-actual-secret-token-pasted-by-mistake"
    found = problems(
        tmp_path,
        f"""
        [[auth.tokens]]
        name = "ingest"
        hash = "{token}"
        """,
    )
    assert found == [
        "auth.tokens[0].hash: expected 'sha256:' and 64 hex digits, the output of rsnet broker hash-token "
        "(configure the token's hash, never the token itself)"
    ]
    with pytest.raises(ConfigError) as error:
        load_config(None, {"RSNET_BROKER__FSYNC": token}, {})
    assert token not in str(error.value)


# -- addresses ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, host, port",
    [
        ("127.0.0.1:7600", "127.0.0.1", 7600),
        ("0.0.0.0:0", "0.0.0.0", 0),
        ("localhost:80", "localhost", 80),
        ("broker.example.com:7600", "broker.example.com", 7600),
        ("[::1]:7600", "::1", 7600),
        ("[::]:7600", "::", 7600),
        ("  127.0.0.1:7600 ", "127.0.0.1", 7600),
    ],
)
def test_addresses(text, host, port):
    address = load_config(None, {}, {"listen.tcp": text}).listen.tcp
    assert (address.host, address.port) == (host, port)
    assert load_config(None, {}, {"listen.tcp": str(address)}).listen.tcp == address


@pytest.mark.parametrize(
    "text, message",
    [
        ("7600", "expected HOST:PORT"),
        (":7600", "expected HOST:PORT"),
        ("host:", "expected HOST:PORT"),
        ("::1:7600", "expected HOST:PORT"),
        ("host:port", "expected HOST:PORT"),
        ("a b:7600", "expected HOST:PORT"),
        ("[nonsense]:7600", "not an IPv6 address"),
        ("127.0.0.1:65536", "less than or equal to 65535"),
    ],
)
def test_invalid_addresses(text, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, {}, {"listen.tcp": text})
    assert error.value.problems[0].startswith("listen.tcp")
    assert message in error.value.problems[0]
    assert "(from command-line override listen.tcp)" in error.value.problems[0]


def test_an_empty_address_turns_a_listener_off(tmp_path):
    config = load_config(write(tmp_path, '[listen]\ntcp = ""\nws = "127.0.0.1:7601"\n'), {}, {})
    assert config.listen.tcp is None and str(config.listen.ws) == "127.0.0.1:7601"


def test_both_listeners_off_is_an_error(tmp_path):
    assert problems(tmp_path, '[listen]\ntcp = ""\n') == [
        "listen: both tcp and ws are off; the broker would accept no connections"
    ]


def test_two_listeners_on_one_address_is_an_error(tmp_path):
    found = problems(
        tmp_path, '[listen]\ntcp = "127.0.0.1:7600"\nws = "127.0.0.1:7600"\n[metrics]\nlisten = "127.0.0.1:7600"\n'
    )
    assert found == [
        "listen.ws: same address as listen.tcp (127.0.0.1:7600)",
        "metrics.listen: same address as listen.tcp (127.0.0.1:7600)",
    ]
    # port 0 picks a free port for each: no conflict
    load_config(None, {}, {"listen.tcp": "127.0.0.1:0", "listen.ws": "127.0.0.1:0"})


def test_tls_files_must_exist(tmp_path):
    found = problems(tmp_path, '[listen.tls]\ncert = "missing.pem"\n')
    assert found == ["listen.tls.cert: Path does not point to a file", "listen.tls.key: Field required"]
    (tmp_path / "cert.pem").write_text("x")
    (tmp_path / "key.pem").write_text("x")
    config = load_config(
        None, {}, {"listen.tls.cert": str(tmp_path / "cert.pem"), "listen.tls.key": str(tmp_path / "key.pem")}
    )
    assert config.listen.tls.cert == tmp_path / "cert.pem"


# -- storage, fsync and topics --------------------------------------------------------------


def test_without_a_data_dir_topics_live_in_memory():
    config = load_config(None, {}, {})
    assert topic_config(config, "anything").storage == "memory"


def test_with_a_data_dir_topics_are_durable_by_default(tmp_path):
    config = load_config(
        write(tmp_path, 'data_dir = "/var/lib/rsnet"\n[[topics]]\npattern = "cache.>"\nstorage = "memory"\n'), {}, {}
    )
    assert topic_config(config, "anything").storage == "durable"
    assert topic_config(config, "cache.x").storage == "memory"


def test_durable_topics_need_a_data_dir(tmp_path):
    found = problems(
        tmp_path,
        """
        [topic_defaults]
        storage = "durable"
        [[topics]]
        pattern = "a"
        [[topics]]
        pattern = "b"
        storage = "durable"
        """,
    )
    assert found == ["topic_defaults.storage: 'durable' needs data_dir", "topics[1].storage: 'durable' needs data_dir"]


def test_fsync_interval():
    assert load_config(None, {}, {}).fsync_interval is None
    config = load_config(None, {}, {"fsync": "interval", "fsync_interval_ms": 250})
    assert config.fsync_interval == 0.25


RULES = """
data_dir = "/data"
[topic_defaults]
auto_create = "never"
subscribe_missing = "fail"
retention = { max_records = 1000, max_age_s = 60 }
slow_subscriber = { policy = "disconnect", max_lag = 10 }

[[topics]]
pattern = "sensors.kitchen"
slow_subscriber = { policy = "backpressure" }

[[topics]]
pattern = "sensors.*"
storage = "memory"
retention = { max_bytes = 4096 }

[[topics]]
pattern = "sensors.>"
auto_create = "publish"
subscribe_missing = "wait"
"""


def test_the_first_matching_rule_wins_and_fills_in_from_the_defaults(tmp_path):
    config = load_config(write(tmp_path, RULES), {}, {})

    kitchen = topic_config(config, "sensors.kitchen")
    assert kitchen.rule == "sensors.kitchen"
    assert (kitchen.storage, kitchen.auto_create, kitchen.subscribe_missing) == ("durable", "never", "fail")
    assert (kitchen.slow_subscriber.policy, kitchen.slow_subscriber.max_lag) == (
        "backpressure",
        10_000,
    )  # a table replaces whole
    assert kitchen.retention.max_records == 1000

    hall = topic_config(config, "sensors.hall")
    assert (hall.rule, hall.storage, hall.auto_create) == ("sensors.*", "memory", "never")
    assert (hall.retention.max_bytes, hall.retention.max_records, hall.retention.max_age_s) == (4096, None, None)

    deep = topic_config(config, "sensors.hall.temp")
    assert (deep.rule, deep.storage, deep.auto_create, deep.subscribe_missing) == (
        "sensors.>",
        "durable",
        "publish",
        "wait",
    )

    other = topic_config(config, "orders")
    assert other.rule is None
    assert other.slow_subscriber.policy == "disconnect"
    assert other.retention.max_age_s == 60


def test_built_in_topic_defaults():
    settings = topic_config(load_config(None, {}, {}), "x")
    assert (settings.auto_create, settings.subscribe_missing) == ("publish", "wait")
    assert (settings.retention.max_records, settings.retention.max_bytes, settings.retention.max_age_s) == (
        None,
        1 << 30,
        604800,
    )
    assert (settings.slow_subscriber.policy, settings.slow_subscriber.max_lag) == ("backpressure", 10_000)


def test_topic_config_needs_a_topic_name(tmp_path):
    config = load_config(None, {}, {})
    for name in ["sensors.*", "a..b", ""]:
        with pytest.raises(InvalidName):
            topic_config(config, name)


def test_a_rule_hidden_by_an_earlier_one_is_an_error(tmp_path):
    found = problems(
        tmp_path,
        """
        [[topics]]
        pattern = "sensors.*"
        [[topics]]
        pattern = "sensors.kitchen"
        [[topics]]
        pattern = "sensors.*"
        [[topics]]
        pattern = "sensors.kitchen.>"
        """,
    )
    assert found == [
        "topics[1].pattern: never used: topics[0].pattern 'sensors.*' comes first and matches every topic this one does",
        "topics[2].pattern: never used: topics[0].pattern 'sensors.*' comes first and matches every topic this one does",
    ]


def test_declared_topics_are_the_rules_without_wildcards(tmp_path):
    config = load_config(write(tmp_path, RULES), {}, {})
    assert declared_topics(config) == ["sensors.kitchen"]


# -- auth -----------------------------------------------------------------------------------


def test_tokens(tmp_path):
    config = load_config(
        write(
            tmp_path,
            f"""
            [[auth.tokens]]
            name = "ingest"
            hash = "{HASH.upper().replace("SHA256", "sha256")}"
            publish = ["sensors.>"]
            """,
        ),
        {},
        {},
    )
    (token,) = config.auth.tokens
    assert (token.name, token.hash, token.publish, token.subscribe) == ("ingest", HASH, ("sensors.>",), ())


def test_token_names_grants_and_duplicates_are_checked(tmp_path):
    other = hash_token("another-token-0123456789abcdef")
    found = problems(
        tmp_path,
        f"""
        [[auth.tokens]]
        name = "ingest"
        hash = "{HASH}"
        publish = ["sensors.>", "sensors.>.x"]
        subscribe = ["*x"]
        [[auth.tokens]]
        name = "bad name"
        hash = "{other}"
        [[auth.tokens]]
        hash = "{other}"
        """,
    )
    assert found == [
        "auth.tokens[0].publish[1]: pattern 'sensors.>.x': '>' may only be the last segment",
        "auth.tokens[0].subscribe[0]: pattern '*x': '*' and '>' must be whole segments",
        "auth.tokens[1].name: expected 1 to 64 characters of A-Z a-z 0-9 _ . @ -",
        "auth.tokens[2].name: Field required",
    ]
    found = problems(
        tmp_path,
        f"""
        [[auth.tokens]]
        name = "a"
        hash = "{HASH}"
        [[auth.tokens]]
        name = "a"
        hash = "{HASH}"
        """,
    )
    assert found == [
        "auth.tokens[1].name: already used by auth.tokens[0]",
        "auth.tokens[1].hash: same as auth.tokens[0].hash",
    ]


def test_describe_leaves_token_hashes_out():
    config = load_config(None, {"RSNET_BROKER__AUTH__TOKENS": f'[{{name = "ingest", hash = "{HASH}"}}]'}, {})
    described = config.describe()
    assert described["auth"] == {"tokens": ["ingest"]}
    assert HASH.removeprefix("sha256:") not in repr(described)
    assert described["listen"]["tcp"] == "127.0.0.1:7600"


# -- environment and command-line overrides -------------------------------------------------


def test_environment_overrides_the_file(tmp_path):
    path = write(tmp_path, 'data_dir = "/from/file"\nfsync = "never"\n[listen]\ntcp = "127.0.0.1:1"\n')
    config = load_config(
        path,
        {
            "RSNET_BROKER__DATA_DIR": "/var/lib/rsnet",
            "RSNET_BROKER__LISTEN__TCP": "0.0.0.0:7600",
            "rsnet_broker__listen__ws": "[::]:7601",  # keys are case-insensitive
            "RSNET_BROKER__FSYNC_INTERVAL_MS": "250",
            "RSNET_BROKERX": "ignored",
            "HOME": "/root",
        },
        {},
    )
    assert config.data_dir == Path("/var/lib/rsnet")
    assert str(config.listen.tcp) == "0.0.0.0:7600"
    assert str(config.listen.ws) == "[::]:7601"
    assert (config.fsync, config.fsync_interval_ms) == ("never", 250)


def test_environment_creates_tables_and_indexes_arrays(tmp_path):
    config = load_config(
        write(tmp_path, RULES),
        {
            "RSNET_BROKER__METRICS__LISTEN": "0.0.0.0:9100",
            "RSNET_BROKER__TOPICS__1__RETENTION__MAX_RECORDS": "5",
            "RSNET_BROKER__TOPIC_DEFAULTS__AUTO_CREATE": "never",
        },
        {},
    )
    assert str(config.metrics.listen) == "0.0.0.0:9100"
    assert config.topics[1].retention.max_records == 5
    assert config.topics[1].retention.max_bytes == 4096  # tables merge key by key
    assert config.topic_defaults.auto_create == "never"


def test_environment_values_in_brackets_are_toml(tmp_path):
    config = load_config(
        None,
        {
            "RSNET_BROKER__DATA_DIR": "/d",
            "RSNET_BROKER__TOPICS": '[{pattern = "a.>", storage = "memory"}, {pattern = "b"}]',
            "RSNET_BROKER__TOPIC_DEFAULTS__RETENTION": "{max_records = 7}",
        },
        {},
    )
    assert [rule.pattern for rule in config.topics] == ["a.>", "b"]
    assert config.topic_defaults.retention.max_records == 7
    assert config.topic_defaults.retention.max_bytes is None  # the file had no retention to merge with


def test_an_empty_environment_value_unsets(tmp_path):
    path = write(tmp_path, 'data_dir = "/d"\n[listen]\nws = "127.0.0.1:7601"\n[metrics]\n')
    assert load_config(path, {}, {}).metrics is not None
    config = load_config(
        path, {"RSNET_BROKER__DATA_DIR": "", "RSNET_BROKER__LISTEN__WS": "", "RSNET_BROKER__METRICS": ""}, {}
    )
    assert config.data_dir is None and config.listen.ws is None and config.metrics is None


def test_errors_name_the_variable_that_set_the_value(tmp_path):
    found = problems(
        tmp_path,
        RULES,
        env={
            "RSNET_BROKER__TOPICS__0__SLOW_SUBSCRIBER__MAX_LAG": "-1",
            "RSNET_BROKER__LISTEN__TPC": "x",
            "RSNET_BROKER__LISTN__TCP": "127.0.0.1:7600",  # the table's own name misspelt
        },
    )
    assert found == [
        "listen.tpc: Extra inputs are not permitted (from environment variable RSNET_BROKER__LISTEN__TPC)",
        "topics[0].slow_subscriber.max_lag: Input should be greater than 0 "
        "(from environment variable RSNET_BROKER__TOPICS__0__SLOW_SUBSCRIBER__MAX_LAG)",
        "listn: Extra inputs are not permitted (from environment variable RSNET_BROKER__LISTN__TCP)",
    ]


@pytest.mark.parametrize(
    "name, message",
    [
        ("RSNET_BROKER__TOPICS__3__STORAGE", "RSNET_BROKER__TOPICS__3__STORAGE: topics has no entry 3 (it has 3)"),
        ("RSNET_BROKER__TOPICS__X__STORAGE", "RSNET_BROKER__TOPICS__X__STORAGE: topics has no entry x (it has 3)"),
        ("RSNET_BROKER__DATA_DIR__X", "RSNET_BROKER__DATA_DIR__X: data_dir is not a table"),
        ("RSNET_BROKER__LISTEN____TCP", "RSNET_BROKER__LISTEN____TCP: empty key"),
    ],
)
def test_environment_paths_that_lead_nowhere(tmp_path, name, message):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, RULES), {name: "memory"}, {})
    assert str(error.value) == f"environment variable {message}"


def test_command_line_overrides_apply_last(tmp_path):
    path = write(tmp_path, 'data_dir = "/from/file"\n[listen]\ntcp = "127.0.0.1:1"\n')
    config = load_config(
        path,
        {"RSNET_BROKER__DATA_DIR": "/from/env", "RSNET_BROKER__LISTEN__TCP": "127.0.0.1:2"},
        {"data_dir": "/from/cli", "listen.tcp": None, "listen.ws": "127.0.0.1:3", "metrics": {"listen": "127.0.0.1:4"}},
    )
    assert config.data_dir == Path("/from/cli")
    assert str(config.listen.tcp) == "127.0.0.1:2"  # None: the option was not given
    assert str(config.listen.ws) == "127.0.0.1:3"
    assert str(config.metrics.listen) == "127.0.0.1:4"


def test_nested_override_dicts_merge():
    config = load_config(None, {}, {"listen": {"ws": "127.0.0.1:7601"}})
    assert str(config.listen.tcp) == "127.0.0.1:7600" and str(config.listen.ws) == "127.0.0.1:7601"


def test_log_level_is_case_insensitive():
    assert load_config(None, {"RSNET_BROKER__LOG__LEVEL": "WARNING"}, {}).log.level == "warning"


def test_the_config_is_immutable():
    config = load_config(None, {}, {})
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        config.fsync = "never"  # type: ignore[misc]


def test_an_address_may_come_as_a_host_port_pair_from_argparse():
    config = load_config(None, {}, {"listen.tcp": ("0.0.0.0", 7600), "listen.ws": ["::", 7601]})
    assert str(config.listen.tcp) == "0.0.0.0:7600" and str(config.listen.ws) == "[::]:7601"


def test_retention_age_in_milliseconds_for_the_storage_engine():
    config = load_config(None, {"RSNET_BROKER__TOPIC_DEFAULTS__RETENTION": "{max_age_s = 1.5}"}, {})
    assert config.topic_defaults.retention.max_age_ms == 1500
    assert (
        load_config(
            None, {"RSNET_BROKER__TOPIC_DEFAULTS__RETENTION": "{max_age_s = 0.0001}"}, {}
        ).topic_defaults.retention.max_age_ms
        == 1
    )
    assert (
        load_config(None, {"RSNET_BROKER__TOPIC_DEFAULTS__RETENTION": "{}"}, {}).topic_defaults.retention.max_age_ms
        is None
    )


def test_topic_bounds_and_creation_settings(tmp_path):
    config = load_config(None, {}, {})
    assert (config.max_topics, config.idle_topic_close_s) == (10_000, 60.0)
    assert problems(
        tmp_path,
        """
        max_topics = 1
        idle_topic_close_s = -1
        [topic_defaults]
        auto_create = true
        subscribe_missing = "create"
        [[topics]]
        pattern = "a"
        [[topics]]
        pattern = "b"
        """,
    ) == [
        "idle_topic_close_s: Input should be greater than or equal to 0",
        "topic_defaults.auto_create: Input should be 'publish' or 'never'",
        "topic_defaults.subscribe_missing: Input should be 'wait' or 'fail'",
    ]
    assert problems(
        tmp_path, '[[topics]]\npattern = "a"\n[[topics]]\npattern = "b"\n', overrides={"max_topics": 1}
    ) == ["max_topics: 1 is fewer than the 2 topics [[topics]] names outright"]


def test_the_producer_bounds_reach_the_storage_engine():
    from rsnet.broker.auth import Authorizer
    from rsnet.broker.daemon import build_broker
    from rsnet.broker.storage import Retention

    built_in = Retention()
    config = load_config(None, {}, {"topics": [{"pattern": "few.>", "retention": {"max_producers": 3}}]})
    broker = build_broker(config, Authorizer(config.auth))
    defaults, few = broker.settings_for("orders").retention, broker.settings_for("few.x").retention
    assert (defaults.max_producers, defaults.producer_max_age_ms) == (10_000, 7 * 24 * 3600 * 1000)
    assert (defaults.max_producers, defaults.producer_max_age_ms) == (
        built_in.max_producers,
        built_in.producer_max_age_ms,
    )
    assert (few.max_producers, few.producer_max_age_ms) == (
        3,
        built_in.producer_max_age_ms,
    )  # bounded whatever is left out
    ages = load_config(None, {"RSNET_BROKER__TOPIC_DEFAULTS__RETENTION": "{producer_max_age_s = 90}"}, {})
    assert ages.topic_defaults.retention.producer_max_age_ms == 90_000
    with pytest.raises(ConfigError, match="max_producers"):
        load_config(None, {"RSNET_BROKER__TOPIC_DEFAULTS__RETENTION": "{max_producers = 0}"}, {})


# -- values the broker could not use: refused at start, not at each use -----------------------


def test_numbers_no_topic_or_handshake_can_carry_are_refused(tmp_path):
    # Each was accepted: an infinite age failed every publish that created a durable topic
    # (INTERNAL), a huge keepalive every handshake, a byte limit past 2**64 every $topics
    # listing and $admin answer (msgpack cannot carry it), an infinite keepalive a traceback.
    found = problems(
        tmp_path,
        """
        [listen]
        keepalive_interval_s = inf
        [topic_defaults]
        retention = { max_age_s = inf, max_bytes = 1180591620717411303424 }
        slow_subscriber = { max_lag = 1e400 }
        """,
        env={"RSNET_BROKER__IDLE_TOPIC_CLOSE_S": "nan"},
    )
    assert found == [
        "listen.keepalive_interval_s: Input should be a finite number",
        "idle_topic_close_s: Input should be a finite number (from environment variable RSNET_BROKER__IDLE_TOPIC_CLOSE_S)",
        "topic_defaults.retention.max_bytes: Input should be less than or equal to 4611686018427387904",
        "topic_defaults.retention.max_age_s: Input should be a finite number",
        "topic_defaults.slow_subscriber.max_lag: Input should be a finite number",
    ]
    assert problems(tmp_path, "", env={"RSNET_BROKER__LISTEN__KEEPALIVE_INTERVAL_S": "1e300"}) == [
        "listen.keepalive_interval_s: Input should be less than or equal to 2147483 "
        "(from environment variable RSNET_BROKER__LISTEN__KEEPALIVE_INTERVAL_S)"
    ]
    # A microsecond was sent as 0 ms, which means no keepalive; acknowledgements under an
    # fsync interval of three years never came.
    assert problems(tmp_path, "[listen]\nkeepalive_interval_s = 0.000001\n", env={}) == [
        "listen.keepalive_interval_s: Value error, keepalive_interval must be 0 (none) or a number of seconds from "
        "0.001 to 2147483.647, got 1e-06"
    ]
    assert problems(tmp_path, "fsync_interval_ms = 100000000000\n") == [
        "fsync_interval_ms: Input should be less than or equal to 3600000"
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RSNET_BROKER__TOPICS__5__STORAGE": "memory"}, "RSNET_BROKER__TOPICS__5__STORAGE: topics has no entry 5"),
        ({"RSNET_BROKER__AUTH__TOKENS": "[{name = 'a', hash"}, "RSNET_BROKER__AUTH__TOKENS: not a TOML array: "),
        ({"RSNET_BROKER__TOPIC_DEFAULTS__RETENTION": "{max_records = }"}, "RETENTION: not a TOML table: "),
    ],
)
def test_an_environment_variable_that_cannot_be_used_is_named(tmp_path, env, message):
    # They said "topics: Input should be a valid tuple", naming no variable.
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, env, {})
    assert load_config(None, {"RSNET_BROKER__LISTEN__TCP": "[::1]:7600"}, {}).listen.tcp.host == "::1"


def test_a_swapped_certificate_and_key_are_named(tmp_path):
    import trustme

    from rsnet.broker.daemon import _ssl_context

    certificate = trustme.CA().issue_cert("127.0.0.1")
    certificate.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
    certificate.private_key_pem.write_to_path(tmp_path / "key.pem")
    swapped = {"listen.tls.cert": str(tmp_path / "key.pem"), "listen.tls.key": str(tmp_path / "cert.pem")}
    with pytest.raises(ConfigError, match=r"listen.tls: the certificate .*key.pem and the key .*cert.pem do not load"):
        _ssl_context(load_config(None, {}, swapped))
    right = {"listen.tls.cert": str(tmp_path / "cert.pem"), "listen.tls.key": str(tmp_path / "key.pem")}
    assert _ssl_context(load_config(None, {}, right)) is not None
