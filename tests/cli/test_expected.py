"""What users of kcat, the nats CLI and websocat expect of rsnet's command line (issue 12)."""

from __future__ import annotations

import json
import os
import pty
import re
import socket
import subprocess

import pytest

from rsnet.cli.progress import duration

from .support import RSNET, Daemon, auth_config, env, one_line, rsnet


def publish(url: str, topic: str, lines: str) -> None:
    result = rsnet("pub", url, topic, stdin=lines)
    assert result.returncode == 0, result.stderr


def test_until_end_exits_at_the_end_of_a_topic_and_of_a_pattern(broker):
    publish(broker.url, "ends.a", "1\n2\n")
    publish(broker.url, "ends.b", "3\n")
    one = rsnet("sub", broker.url, "ends.a", "--from", "earliest", "--until-end", "-f", "value")
    assert (one.returncode, one.stdout) == (0, "1\n2\n")
    both = rsnet("sub", broker.url, "ends.*", "--from", "earliest", "--until-end", "-f", "{topic}:{value}")
    assert both.returncode == 0
    assert sorted(both.stdout.splitlines()) == ["ends.a:1", "ends.a:2", "ends.b:3"]
    nothing = rsnet("sub", broker.url, "ends.a", "--until-end")  # from latest: nothing to read
    assert (nothing.returncode, nothing.stdout) == (0, "")


def test_a_format_that_is_no_template_is_wrong_usage_exit_2():
    bad = rsnet("sub", "tcp://127.0.0.1:1", "t", "--format", "{value")  # refused before connecting
    assert bad.returncode == 2 and "--format: '{value': expected json, value, raw or a template" in bad.stderr
    # A misspelled field is no empty column: refused, with the field and the known ones named.
    typo = rsnet("sub", "tcp://127.0.0.1:1", "t", "--format", "{offst} {value}")
    assert typo.returncode == 2
    assert typo.stderr.splitlines()[-1].endswith(
        "--format: '{offst} {value}': unknown field 'offst' (did you mean 'offset'?); "
        "the fields are topic, offset, timestamp, time, value"
    ), typo.stderr


def test_from_a_duration_and_an_iso_time(broker):
    publish(broker.url, "recent", "1\n")
    assert rsnet("sub", broker.url, "recent", "--from", "10m", "-e", "-f", "value").stdout == "1\n"
    assert rsnet("sub", broker.url, "recent", "--from", "2999-01-01T00:00:00Z", "-e").stdout == ""
    assert rsnet("sub", broker.url, "recent", "--from", "2000-01-01T00:00:00Z", "-e", "-f", "value").stdout == "1\n"
    bad = rsnet("sub", broker.url, "recent", "--from", "yesterday")
    assert bad.returncode == 2 and "expected earliest, latest, an offset, -N, a duration" in bad.stderr


def test_a_topic_that_does_not_exist_is_announced_with_the_closest_names(broker):
    publish(broker.url, "sensors.kitchen", '{"celsius": 21.5}\n')
    process = subprocess.Popen(
        [RSNET, "sub", broker.url, "sensors.kitchn"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env(),
    )
    try:
        line = process.stderr.readline()
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
    assert line == "rsnet sub: topic 'sensors.kitchn' does not exist yet (did you mean 'sensors.kitchen'?)\n"
    # --until-end reads what is there: a missing topic has nothing, said so, and exit 0.
    done = rsnet("sub", broker.url, "sensors.kitchn", "--until-end")
    assert done.returncode == 0 and done.stdout == ""
    assert one_line(done.stderr) == (
        "rsnet sub: topic 'sensors.kitchn' does not exist: nothing to read (did you mean 'sensors.kitchen'?)"
    )


def test_until_end_fails_for_a_topic_the_token_may_not_read_or_an_invalid_name(tmp_path):
    # Not "does not exist: nothing to read" and exit 0: a script would take that for success.
    config = tmp_path / "rsnet.toml"
    tokens = auth_config(config, writer={"publish": [">"], "subscribe": [">"]}, reader={"subscribe": ["sensors.*"]})
    writer, reader = tokens["writer"], tokens["reader"]
    with Daemon("broker", "--config", str(config), "--tcp", "127.0.0.1:0") as broker:
        publish_env = env(RSNET_TOKEN=writer)
        for topic in ("other.a", "sensors.a"):
            assert rsnet("pub", broker.url, topic, stdin="1\n", env=publish_env).returncode == 0
        read_env = env(RSNET_TOKEN=reader)
        for until_end in ((), ("--until-end",)):
            denied = rsnet("sub", broker.url, "other.a", "--from", "earliest", *until_end, env=read_env)
            assert denied.returncode == 1
            assert one_line(denied.stderr) == "rsnet sub: UNAUTHORIZED: not allowed to subscribe 'other.a'"
            invalid = rsnet("sub", broker.url, "bad name", *until_end, env=read_env)
            assert invalid.returncode == 1 and one_line(invalid.stderr).startswith("rsnet sub: REJECTED: "), (
                invalid.stderr
            )
        # A pattern beyond the grant: refused whether or not there is anything to read (from
        # latest there never is, and no topic the token may read matches 'other.*').
        for pattern in ("sensors.>", "other.*"):
            for start in ("latest", "earliest"):
                denied = rsnet("sub", broker.url, pattern, "--from", start, "--until-end", env=read_env)
                assert denied.returncode == 1
                assert one_line(denied.stderr) == f"rsnet sub: UNAUTHORIZED: not allowed to subscribe {pattern!r}"
        allowed = rsnet(
            "sub", broker.url, "sensors.a", "--from", "earliest", "--until-end", "-f", "value", env=read_env
        )
        assert (allowed.returncode, allowed.stdout) == (0, "1\n")
        for start, read in (("latest", ""), ("earliest", "1\n")):
            within = rsnet("sub", broker.url, "sensors.*", "--from", start, "-e", "-f", "value", env=read_env)
            assert (within.returncode, within.stdout, within.stderr) == (0, read, "")
        # Refused for good: the closing line offers no resend, which would be refused the same way.
        unpublishable = rsnet("pub", broker.url, "sensors.a", stdin="2\n", env=read_env)
        assert unpublishable.returncode == 1
        assert one_line(unpublishable.stderr) == (
            "rsnet pub: not every record was acknowledged: UNAUTHORIZED: not allowed to publish 'sensors.a'; "
            "nothing was stored in sensors.a"
        )


def test_a_broker_that_refuses_missing_topics_is_not_said_to_wait(tmp_path):
    config = tmp_path / "rsnet.toml"
    config.write_text('[[topics]]\npattern = "orders.>"\nsubscribe_missing = "fail"\n')
    with Daemon("broker", "--config", str(config), "--tcp", "127.0.0.1:0") as refusing:
        refused = rsnet("sub", refusing.url, "orders.new")
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[-2:] == [
        "rsnet sub: topic 'orders.new' does not exist yet",
        "rsnet sub: UNKNOWN_PUBLISHER: no topic named 'orders.new' (subscribe_missing is fail for it:"
        " a subscription does not wait for its first record)",
    ]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_an_ipv6_listener_is_announced_as_a_url_a_client_can_use():
    with Daemon("serve", "--demo", "--tcp", "[::1]:0", "--ws", "[::1]:0") as served:
        tcp, ws = served.url, served.process.stderr.readline().split("serving ", 1)[1].strip()
        assert tcp.startswith("tcp://[::1]:") and ws.startswith("ws://[::1]:")
        for url in (tcp, ws):
            assert rsnet("sub", url, "range", "-p", "count=3", "-f", "value").stdout == "0\n1\n2\n"


def test_formats_raw_lines_value_fields_and_topics_json(broker):
    publish(broker.url, "formats", '{"id": 7, "name": "seven"}\n')
    raw = rsnet("pub", broker.url, "formats", "--raw", stdin="plain text, not JSON\n")
    assert raw.returncode == 0, raw.stderr
    field = rsnet("pub", broker.url, "formats", "--value-field", "name", stdin='{"id": 8, "name": "eight"}\n')
    assert field.returncode == 0, field.stderr
    read = rsnet("sub", broker.url, "formats", "--from", "earliest", "-e", "--format", "raw")
    assert read.stdout == '{"id": 7, "name": "seven"}\nplain text, not JSON\neight\n'
    records = rsnet("sub", broker.url, "formats", "--from", "earliest", "-e", "--count", "1")
    record = json.loads(records.stdout)
    assert (record["topic"], record["offset"], record["value"]) == ("formats", 0, {"id": 7, "name": "seven"})
    listed = rsnet("topics", broker.url, "--json")
    topics = {json.loads(line)["topic"]: json.loads(line) for line in listed.stdout.splitlines()}
    assert topics["formats"]["next_offset"] == 3


def test_a_binary_map_key_is_shown_as_its_base64_text(broker):
    # Spark user check: a record with a binary map key (SPEC 3 allows them) ended rsnet sub
    # with a traceback ("keys must be str ..."); binary values show as {"$bytes": base64}.
    from rsnet.broker import blocking
    from rsnet.sync import connect

    with connect(broker.url) as conn:
        blocking.publish(conn, "binkeys", [{b"k": b"v", "s": [{b"\x00": 1}]}], producer="p", first_sequence=0)
    read = rsnet("sub", broker.url, "binkeys", "--from", "earliest", "-e", "-f", "value")
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == {"aw==": {"$bytes": "dg=="}, "s": [{"AA==": 1}]}


def test_defaults_from_the_environment_a_token_file_and_a_context_file(broker, demo, tmp_path):
    from_env = rsnet("sub", "range", "-p", "count=2", env=env(RSNET_URL=demo.url))
    assert (from_env.returncode, from_env.stdout) == (0, "0\n1\n")
    context = tmp_path / "context.toml"
    context.write_text(f'url = "{demo.url}"\n')
    from_context = rsnet("sub", "range", "-p", "count=1", env=env(RSNET_CONTEXT=str(context)))
    assert (from_context.returncode, from_context.stdout) == (0, "0\n")
    context.write_text(f'url = "{demo.url}"\ntoken = "secret"\n')
    refused = rsnet("sub", "range", "-p", "count=1", env=env(RSNET_CONTEXT=str(context)))
    assert refused.returncode == 2 and "expected only url and token_file" in one_line(refused.stderr)
    missing = rsnet("sub", demo.url, "range", "--token-file", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "cannot read the token file" in one_line(missing.stderr)
    version = rsnet("--version")
    assert version.returncode == 0 and version.stdout.startswith("rsnet ")


def test_a_token_from_the_environment_or_a_file_reaches_the_server(tmp_path):
    from .support import Daemon

    with Daemon("serve", "--demo", "--tcp", "127.0.0.1:0", "--token", "s3cret") as server:
        refused = rsnet("sub", server.url, "range", "-p", "count=1")
        assert refused.returncode == 1 and "UNAUTHORIZED" in one_line(refused.stderr)
        # pub, refused at the handshake, offers no resend (the token is what is wrong).
        unsent = rsnet("pub", server.url, "t", stdin="1\n")
        assert unsent.returncode == 1 and "UNAUTHORIZED" in unsent.stderr and "--sequence" not in unsent.stderr
        # How a command-line user gives a token, not the wire's auth_token (an outside check).
        assert "give the token with --token-file, --token or RSNET_TOKEN" in one_line(refused.stderr)
        from_env = rsnet("sub", server.url, "range", "-p", "count=1", env=env(RSNET_TOKEN="s3cret"))
        assert (from_env.returncode, from_env.stdout) == (0, "0\n")
        (tmp_path / "token").write_text("s3cret\n")
        from_file = rsnet("sub", server.url, "range", "-p", "count=1", "--token-file", str(tmp_path / "token"))
        assert (from_file.returncode, from_file.stdout) == (0, "0\n")
        # A relative token_file in the context file is beside it, wherever rsnet runs (it was
        # read from the current directory: an outside check).
        context = tmp_path / "ctx" / "context.toml"
        context.parent.mkdir()
        (context.parent / "token").write_text("s3cret\n")
        context.write_text(f'url = "{server.url}"\ntoken_file = "token"\n')
        from_context = rsnet("sub", "range", "-p", "count=1", env=env(RSNET_CONTEXT=str(context)), cwd="/")
        assert (from_context.returncode, from_context.stdout) == (0, "0\n"), from_context.stderr
        (context.parent / "token").unlink()
        unreadable = rsnet("sub", "range", "-p", "count=1", env=env(RSNET_CONTEXT=str(context)), cwd="/")
        assert unreadable.returncode == 2
        assert "cannot read the token file (the context file's token_file)" in one_line(unreadable.stderr)
        assert str(context.parent / "token") in one_line(unreadable.stderr)


def run_on_a_terminal(*args: str, stdin: str) -> str:
    """Run ``rsnet *args`` with stderr on a pseudo-terminal; what it drew there."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [RSNET, *args], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=terminal, env=env()
    )
    os.close(terminal)
    process.communicate(stdin.encode(), timeout=30)
    drawn = b""
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:  # EIO: the terminal's other side is closed and drained
            break
        if not data:
            break
        drawn += data
    os.close(controller)
    return drawn.decode()


def test_progress_and_summary_on_a_terminal_and_silence_elsewhere(broker):
    lines = "".join(f"{i}\n" for i in range(2000))
    drawn = run_on_a_terminal("pub", broker.url, "progress", stdin=lines)
    assert "rsnet pub: 2000 records stored in progress in " in drawn  # with the time and rate
    quiet = run_on_a_terminal("pub", broker.url, "progress", "--quiet", stdin=lines)
    assert quiet == ""
    piped = rsnet("pub", broker.url, "progress", stdin=lines)
    assert one_line(piped.stderr) == "rsnet pub: 2000 records stored in progress"  # no live line, no timing


def test_the_live_line_is_redrawn_while_items_arrive(demo):
    # 40 ticks 20 ms apart take at least 0.8 s: the line is redrawn every 0.25 s meanwhile.
    drawn = run_on_a_terminal("sub", demo.url, "ticks", "-p", "interval=0.02", "--count", "40", stdin="")
    live = [part for part in drawn.split("\r\x1b[2K") if part.strip()]
    assert any(part.endswith("/s") and " records " in part for part in live), drawn
    assert live[-1].startswith("rsnet sub: 40 records received in ")


def test_a_summary_s_time_has_the_digits_its_rate_needs(demo):
    drawn = run_on_a_terminal("sub", demo.url, "range", "-p", "count=3", stdin="")
    summary = re.search(r"rsnet sub: 3 records received in ([\d.]+) (ms|s) \(([\d,]+)/s\)", drawn)
    assert summary is not None, drawn
    seconds = float(summary[1]) / (1000 if summary[2] == "ms" else 1)
    # The rate is 3 / the time unrounded: the time shown must be within its rounding of it.
    assert seconds > 0 and abs(3 / seconds / int(summary[3].replace(",", "")) - 1) < 0.02, drawn
    shown = [duration(s) for s in (0.0025, 0.0117, 0.25, 0.9996, 12.345)]
    assert shown == ["2.50 ms", "11.7 ms", "250 ms", "1000 ms", "12.3 s"]


def test_bash_completion_offers_commands_and_each_commands_options(tmp_path):
    script = tmp_path / "rsnet.bash"
    script.write_text(rsnet("completion", "bash").stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        program = f'source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _rsnet; echo "${{COMPREPLY[@]}}"'
        return subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True).stdout.split()

    assert complete("rsnet", "su") == ["sub"]
    assert set(complete("rsnet", "sub", "--u")) == {"--until-end", "--url"}
    assert complete("rsnet", "pub", "--ra") == ["--raw"]
