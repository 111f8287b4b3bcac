"""Wrong usage as a new user meets it (an outside test of the command line): each mistake is
refused with exit 2 and one error line that names the command and what was wrong."""

from __future__ import annotations

import re

import pytest

from rsnet.cli import main

from .support import rsnet

NOWHERE = "tcp://127.0.0.1:1"  # nothing listens there: these are refused before connecting


def usage_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``rsnet *args`` in this process, refused as wrong usage: its error line."""
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("usage: rsnet "), lines
    return lines[-1]


def test_an_abbreviated_option_is_not_taken_for_the_option_it_begins(capsys):
    assert usage_error(capsys, "sub", NOWHERE, "numbers", "--form", "earliest") == (
        "rsnet sub: error: unrecognized arguments: --form earliest (did you mean --format?)"
    )
    assert usage_error(capsys, "topics", NOWHERE, "--js") == (
        "rsnet topics: error: unrecognized arguments: --js (did you mean --json?)"
    )


def test_a_misspelled_broker_option_is_named_not_its_value(capsys):
    assert usage_error(capsys, "broker", "--data-dir=x", "--metrix", "127.0.0.1:9100") == (
        "rsnet broker: error: unrecognized arguments: --metrix (did you mean --metrics?)"
    )
    assert usage_error(capsys, "broker", "hash-tokens") == (
        "rsnet broker: error: unknown action 'hash-tokens': the broker's only action is hash-token"
    )


def test_generate_without_hash_token_is_refused_not_a_broker_started():
    started = rsnet("broker", "--generate", "--tcp", "127.0.0.1:0", timeout=20)
    assert started.returncode == 2
    assert started.stderr.splitlines()[-1] == (
        "rsnet broker: error: --generate goes with hash-token: rsnet broker hash-token --generate"
    )


def test_errors_found_after_parsing_name_the_command_not_rsnet_alone(capsys):
    assert usage_error(capsys, "sub", NOWHERE) == "rsnet sub: error: expected NAME, got nothing"
    assert usage_error(capsys, "pub", NOWHERE, "a", "b") == "rsnet pub: error: expected TOPIC, got a b"
    assert usage_error(capsys, "topics", "alter", NOWHERE, "t") == (
        "rsnet topics alter: error: alter needs a setting to change (--policy, --max-lag, --retention) or --reset NAME"
    )
    assert usage_error(capsys, "topics", "purge", NOWHERE, "t") == (
        "rsnet topics purge: error: purge removes every record of 't' for good: add --yes"
    )


def test_a_setting_both_set_and_reset_is_refused(capsys):
    assert usage_error(capsys, "topics", "alter", NOWHERE, "t1", "--policy", "disconnect", "--reset", "policy") == (
        "rsnet topics alter: error: --policy and --reset policy name the same setting: set it or reset it, not both"
    )
    assert usage_error(capsys, "topics", "alter", NOWHERE, "t1", "--retention", "age=1d", "--reset", "all") == (
        "rsnet topics alter: error: --retention age and --reset all name the same setting: set it or reset it, not both"
    )


def help_of(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    """``rsnet *command --help``, its lines joined by single spaces."""
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["sub", "pub", "topics"])
def test_help_is_plain_text_not_restructuredtext(capsys, command):
    shown = help_of(capsys, command)
    assert "``" not in shown and not re.search(r":\w+:`", shown), shown
    assert {"sub": "--count items arrived", "pub": "any but null", "topics": "$admin (rsnet.broker.admin:"}[
        command
    ] in shown


def test_broker_and_serve_help_show_the_defaults(capsys):
    broker = help_of(capsys, "broker")
    assert "--tcp TCP HOST:PORT for TCP (default: the config's, else 127.0.0.1:7600)" in broker
    assert "--grace GRACE seconds to drain streams on shutdown (default 5)" in broker
    assert (
        "--fsync {always,interval,never} fsync policy of durable topics (default: the config's, else always)" in broker
    )
    assert "--grace GRACE seconds to drain streams on shutdown (default 5)" in help_of(capsys, "serve")


@pytest.mark.parametrize("seconds", ["-1", "0", "0.5", "inf", "nan"])
def test_demo_refuses_a_run_too_short_to_show_anything(capsys, seconds):
    assert usage_error(capsys, "demo", "--seconds", seconds) == (
        f"rsnet demo: error: argument --seconds: must be at least 1 (and finite), got {seconds}"
    )


def test_a_host_and_port_without_a_scheme_is_told_how_to_write_it(capsys):
    assert usage_error(capsys, "sub", "127.0.0.1:7600", "numbers") == (
        "rsnet sub: error: expected NAME, got 127.0.0.1:7600 numbers; "
        "127.0.0.1:7600 is no URL: write tcp://127.0.0.1:7600 (or ws://127.0.0.1:7600/ for WebSocket)"
    )
    assert usage_error(capsys, "pub", "[::1]:7600", "t").endswith(
        "[::1]:7600 is no URL: write tcp://[::1]:7600 (or ws://[::1]:7600/ for WebSocket)"
    )
    assert usage_error(capsys, "topics", "localhost:7600") == (
        "rsnet topics: error: unknown action 'localhost:7600': create, alter, delete or purge (or a URL, to list); "
        "localhost:7600 is no URL: write tcp://localhost:7600 (or ws://localhost:7600/ for WebSocket)"
    )
    assert usage_error(capsys, "sub", "a", "b") == "rsnet sub: error: expected NAME, got a b"  # no address: no hint


@pytest.mark.parametrize(
    ("args", "environment", "said"),
    [
        (["sub", "http://127.0.0.1:7600", "x"], {}, "got 'http://127.0.0.1:7600' (the URL given)"),
        (["sub", "tcp://127.0.0.1", "x"], {}, "got 'tcp://127.0.0.1' (the URL given)"),
        (["sub", "x"], {"RSNET_URL": "127.0.0.1:7600"}, "got '127.0.0.1:7600' (RSNET_URL)"),
        (["serve", "myapp"], {}, "expected module:attr, got 'myapp'"),
        (["serve"], {}, "nothing to serve (give module:attr or --demo)"),
        (["serve", "--demo", "--keepalive", "-1"], {}, "--keepalive must be >= 0 (seconds; 0: off), got -1"),
        (["serve", "--demo", "--max-connections", "0"], {}, "--max-connections must be >= 1, got 0"),
    ],
)
def test_wrong_usage_found_after_parsing_exits_2_and_says_what_and_where(args, environment, said):
    """README: exit 2 is wrong usage. These were exit 1 (an outside check), and a bad URL did
    not say where it came from; one option's error named both options."""
    from .support import env

    refused = rsnet(*args, env=env(**environment))
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip()
    assert line.startswith(f"rsnet {args[0]}: ") and line.endswith(said), line
