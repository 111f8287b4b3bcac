"""What issue 12 found broken in the command line, each as a user meets it (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

import rsnet.sync as rsnet_sync
from rsnet.broker import blocking
from rsnet.errors import StreamError
from rsnet.protocol import ErrorCode

from .support import RSNET, Daemon, env, one_line, rsnet


def stored(url: str, topic: str) -> int:
    with blocking.connect(url) as client:
        for info in blocking.list_topics(client):
            if info["topic"] == topic:
                return info["next_offset"]
    return 0


def acknowledged(url: str, topic: str, producer: str) -> int:
    """The highest sequence of ``producer`` the broker stored durably and acknowledges: what
    its ``$acks`` gives first, once the record that carries it is durable (BROKER.md). The
    producer's own ``$acks`` was told in the same step."""
    with blocking.connect(url) as client:
        return next(client.subscribe("$acks", {"producer": producer, "topic": topic}, limit=1))["sequence"]


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_pub_publishes_each_line_as_it_arrives_before_stdin_closes(broker):
    # tail -f app.log | rsnet pub ...: stdin stays open; every line must be stored at once.
    process = subprocess.Popen(
        [RSNET, "pub", broker.url, "app.log"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    try:
        for number in range(1, 4):
            process.stdin.write(json.dumps({"line": number}) + "\n")
            process.stdin.flush()
            wait_until(lambda number=number: stored(broker.url, "app.log") == number)
            assert process.poll() is None  # still reading
        process.stdin.close()
        assert process.wait(timeout=10) == 0
        assert one_line(process.stderr.read()) == "rsnet pub: 3 records stored in app.log"
    finally:
        process.kill()
        process.wait()


def test_sub_into_a_closed_pipe_ends_quietly_with_0(demo):
    process = subprocess.Popen(
        [RSNET, "sub", demo.url, "range", "-p", "count=10000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    )
    first = [process.stdout.readline() for _ in range(3)]  # | head -3
    process.stdout.close()
    assert process.wait(timeout=20) == 0
    assert first == [b"0\n", b"1\n", b"2\n"]
    assert process.stderr.read() == b""
    process.stderr.close()


@pytest.mark.parametrize("command", [["broker", "hash-token", "--generate"], ["completion", "bash"]])
def test_a_command_that_only_prints_ends_quietly_into_a_closed_pipe(command):
    # | head -1 that is gone before the command writes: every write then fails (EPIPE).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([RSNET, *command], stdout=write_end, stderr=subprocess.PIPE, env=env(), timeout=30)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, b"")


def test_sub_on_a_quiet_topic_ends_as_soon_as_the_pipe_closes(broker):
    # | head -2 on a topic where nothing more arrives: no write would ever notice the closed
    # pipe, so the command must watch it (else it hangs until the next record).
    assert rsnet("pub", broker.url, "quiet", stdin="1\n2\n3\n").returncode == 0
    process = subprocess.Popen(
        [RSNET, "sub", broker.url, "quiet", "--from", "earliest", "-f", "value"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    )
    first = [process.stdout.readline() for _ in range(2)]
    process.stdout.close()
    assert process.wait(timeout=10) == 0
    assert first == [b"1\n", b"2\n"]
    assert process.stderr.read() == b""
    process.stderr.close()


def as_in_a_terminal() -> None:
    """In the child: Ctrl-C as a terminal's foreground job gets it. A test run started as a
    background job by a shell inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt for it: the command would rightly ignore the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_mid_stream_is_one_line_and_exit_130(demo):
    process = subprocess.Popen(
        [RSNET, "sub", demo.url, "ticks", "-p", "interval=0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        preexec_fn=as_in_a_terminal,
    )
    assert process.stdout.readline() == "0\n"
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=10) == 130
    assert one_line(process.stderr.read()) == "rsnet sub: interrupted"
    process.stdout.close()
    process.stderr.close()


def test_ctrl_c_during_pub_waits_for_what_was_sent_and_says_what_was_stored(broker):
    process = subprocess.Popen(
        [RSNET, "pub", broker.url, "interrupted.pub"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        preexec_fn=as_in_a_terminal,
    )
    process.stdin.write("1\n2\n")
    process.stdin.flush()
    wait_until(lambda: stored(broker.url, "interrupted.pub") == 2)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=10) == 130
    lines = process.stderr.read().strip().splitlines()
    assert "Traceback" not in "".join(lines)
    assert lines[-1] == "rsnet pub: interrupted: 2 records stored in interrupted.pub (lines 1-2)"
    process.stdin.close()
    process.stderr.close()


def test_a_broker_lost_mid_pub_says_how_to_send_the_rest_and_that_works(tmp_path):
    # stdin still open (tail -f ...): the lines after the last one sent must be sent again,
    # with the sequence that keeps a resend free of duplicates.
    data = tmp_path / "data"
    with Daemon("broker", "--tcp", "127.0.0.1:0", "--data-dir", str(data)) as broker:
        process = subprocess.Popen(
            [RSNET, "pub", broker.url, "lost.pub", "--producer", "feeder"],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        process.stdin.write("1\n2\n")
        process.stdin.flush()
        wait_until(lambda: stored(broker.url, "lost.pub") == 2)
        # Written is not acknowledged yet (fsync always): a broker killed in between left the
        # client told nothing, which it then says (CI saw it once, on a busy machine).
        assert acknowledged(broker.url, "lost.pub", "feeder") == 1
    assert process.wait(timeout=10) == 1
    said = one_line(process.stderr.read())
    assert said.startswith("rsnet pub: not every record was acknowledged: ")
    assert said.endswith(
        "2 records stored in lost.pub (lines 1-2); lines from 3 on were not sent: "
        "send them with --producer feeder --sequence 2 (no duplicates)"
    ), said
    assert "handshake" not in said, "the handshake was done: the connection ended with a stream open"
    process.stdin.close()
    process.stderr.close()
    with Daemon("broker", "--tcp", "127.0.0.1:0", "--data-dir", str(data)) as broker:
        # As told (and once more from the start, as a careless resend would): nothing twice.
        for lines, sequence in (("3\n4\n", "2"), ("1\n2\n3\n4\n", "0")):
            sent = rsnet("pub", broker.url, "lost.pub", "--producer", "feeder", "--sequence", sequence, stdin=lines)
            assert sent.returncode == 0, sent.stderr
        read = rsnet("sub", broker.url, "lost.pub", "--from", "earliest", "--until-end", "-f", "value")
        assert read.stdout == "1\n2\n3\n4\n"


@pytest.mark.parametrize("command", ["serve", "broker"])
def test_a_port_in_use_is_one_line(command, demo):
    taken = demo.url.removeprefix("tcp://")
    extra = ["--demo"] if command == "serve" else []
    result = rsnet(command, "--tcp", taken, *extra)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith(f"rsnet {command}: ") and "in use" in line and taken in line, line


def test_a_data_dir_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    result = rsnet("broker", "--tcp", "127.0.0.1:0", "--data-dir", str(tmp_path / "file" / "data"))
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith("rsnet broker: ") and "file/data" in line, line


@pytest.mark.parametrize("command", ["serve", "broker"])
def test_a_port_out_of_range_is_refused(command):
    result = rsnet(command, "--tcp", "127.0.0.1:99999", "--demo" if command == "serve" else "--fsync=always")
    assert result.returncode == 2
    assert "less than or equal to 65535" in result.stderr


def test_serve_imports_a_module_from_the_current_directory(tmp_path):
    (tmp_path / "mymodule.py").write_text(
        "import rsnet\n"
        "server = rsnet.Server()\n"
        "@server.publisher('hello')\n"
        "def hello(params, ctx):\n"
        "    return rsnet.just('world')\n"
    )
    with Daemon("serve", "mymodule:server", "--tcp", "127.0.0.1:0", cwd=str(tmp_path)) as server:
        result = rsnet("sub", server.url, "hello")
    assert (result.returncode, result.stdout) == (0, '"world"\n'), result.stderr


def test_serve_keeps_the_servers_own_token_and_limits(tmp_path):
    # An outside check: `rsnet serve app:server` served a Server(token=...) to anyone.
    (tmp_path / "guarded.py").write_text(
        "import itertools, rsnet\n"
        "server = rsnet.Server(token='module-secret-token', max_streams=1)\n"
        "@server.publisher('ticks')\n"
        "def ticks(params, ctx):\n"
        "    return rsnet.from_iterable(itertools.count())\n"
        "loose = rsnet.Server(max_streams=5)\n"
    )
    with Daemon("serve", "guarded:server", "--tcp", "127.0.0.1:0", cwd=str(tmp_path)) as server:
        refused = rsnet("sub", server.url, "ticks", "--count", "1")
        assert refused.returncode == 1 and "UNAUTHORIZED" in refused.stderr, refused.stderr
        with rsnet_sync.connect(server.url, token="module-secret-token") as client:
            first = client.subscribe("ticks")
            assert next(first) == 0
            with pytest.raises(StreamError) as caught:  # max_streams=1: the Server's own limit
                next(client.subscribe("ticks"))
            assert caught.value.code == ErrorCode.TOO_MANY_STREAMS
            first.close()
    replaced = rsnet("serve", "guarded:server", "--token", "other-token-0123456789", cwd=str(tmp_path))
    assert replaced.returncode == 2  # a usage error
    assert one_line(replaced.stderr) == (
        "rsnet serve: guarded:server has its own token (or authenticate), which --token would replace: drop --token"
    )
    both = rsnet("serve", "guarded:server", "guarded:loose", cwd=str(tmp_path))
    assert both.returncode == 1 and "are Servers with different settings" in both.stderr


def test_a_null_line_is_reported_with_its_number_what_was_stored_and_how_to_send_the_rest(broker):
    lines = '{"a": 1}\n\n2\nnull\n4\n'
    result = rsnet("pub", broker.url, "nulls", "--producer", "feeder", stdin=lines)
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        "rsnet pub: line 4: null is not a record (a record is any JSON value except null); "
        "stopped there: 2 records stored in nulls (lines 1-3); lines from 4 on were not sent: "
        "send them with --producer feeder --sequence 2 (no duplicates)"
    )
    # As told, once line 4 is mended: the rest follows, nothing twice.
    rest = "\n".join(lines.splitlines()[3:]).replace("null", "3")
    sent = rsnet("pub", broker.url, "nulls", "--producer", "feeder", "--sequence", "2", stdin=rest)
    assert sent.returncode == 0, sent.stderr
    records = rsnet("sub", broker.url, "nulls", "--from", "earliest", "--until-end", "--format", "value")
    assert records.stdout == '{"a": 1}\n2\n3\n4\n'


def test_an_integer_beyond_64_bits_is_refused_before_anything_is_sent(broker):
    result = rsnet("pub", broker.url, "bigints", stdin="[1, 123456789012345678901234567890]\n")
    assert result.returncode == 1
    assert "line 1: the integer at [1] does not fit in 64 bits" in one_line(result.stderr)


def test_a_line_that_is_not_json_points_at_raw(broker):
    # An outside check: "not JSON: Expecting value: line 1 column 1", with no word of --raw.
    result = rsnet("pub", broker.url, "texts", stdin="plain words\n")
    assert result.returncode == 1
    assert "line 1: not JSON (--raw publishes each line as a string): Expecting value" in one_line(result.stderr)


@pytest.mark.parametrize("count", ["0", "-1"])
def test_count_must_be_at_least_1(count, demo):
    result = rsnet("sub", demo.url, "ticks", "--count", count)
    assert result.returncode == 2
    assert "--count: must be at least 1" in result.stderr


def test_from_minus_n_is_the_last_n_records_and_errors_name_their_code(broker):
    assert rsnet("pub", broker.url, "last.n", stdin="".join(f"{i}\n" for i in range(10))).returncode == 0
    result = rsnet("sub", broker.url, "last.n", "--from", "-3", "--until-end", "--format", "{offset}={value}")
    assert (result.returncode, result.stdout) == (0, "7=7\n8=8\n9=9\n")
    beyond = rsnet("sub", broker.url, "last.n", "--from", "11")
    assert beyond.returncode == 1
    assert (
        one_line(beyond.stderr)
        == "rsnet sub: OFFSET_OUT_OF_RANGE: offset 11 of 'last.n' does not exist yet (next is 10)"
    )


def test_from_a_timestamp_as_the_docs_say(broker):
    assert rsnet("pub", broker.url, "stamped", stdin="1\n2\n").returncode == 0
    result = rsnet("sub", broker.url, "stamped", "--from", '{"timestamp": 0}', "--count", "2", "--format", "value")
    assert (result.returncode, result.stdout) == (0, "1\n2\n"), result.stderr


def test_pub_to_a_server_that_is_no_broker_says_so(demo):
    # An outside check: "not every record was acknowledged: UNKNOWN_PUBLISHER: no sink named
    # 'numbers'", where sub and topics say the server is not a broker.
    result = rsnet("pub", demo.url, "numbers", stdin="1\n")
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith(f"rsnet pub: {demo.url} is not a broker (") and line.endswith("); nothing was stored")


def test_pub_says_when_the_broker_had_its_records_already(broker):
    # An outside check: a producer id reused for other data printed "3 records stored" and
    # stored one (the broker stores each producer and sequence once).
    first = rsnet("pub", broker.url, "dups", "--producer", "P1", stdin="1\n2\n")
    assert (first.returncode, one_line(first.stderr)) == (0, "rsnet pub: 2 records stored in dups")
    again = rsnet("pub", broker.url, "dups", "--producer", "P1", stdin="1\n2\n3\n")
    assert again.returncode == 0
    assert one_line(again.stderr).startswith(
        "rsnet pub: 3 records acknowledged, but the topic dups grew by only 1: "
        "the broker had records of producer P1 with these sequences already"
    )
    fresh = rsnet("pub", broker.url, "dups", stdin="4\n")  # a producer of its own: stored
    assert (fresh.returncode, one_line(fresh.stderr)) == (0, "rsnet pub: 1 record stored in dups")
    read = rsnet("sub", broker.url, "dups", "--from", "earliest", "--until-end", "--format", "value")
    assert read.stdout == "1\n2\n3\n4\n"
