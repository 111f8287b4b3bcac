"""The broker daemon's startup lines as the CLI and the Docker image rely on them."""

from __future__ import annotations

import json
import resource
import subprocess
import time

from .support import RSNET, env, one_line, rsnet


def test_a_port_in_use_names_the_address(demo):
    taken = demo.url.removeprefix("tcp://")
    result = rsnet("broker", "--tcp", taken)
    assert result.returncode == 1
    assert one_line(result.stderr) == f"rsnet broker: cannot listen on {taken}: Address already in use"


def test_a_metrics_port_in_use_names_the_address(demo):
    taken = demo.url.removeprefix("tcp://")
    result = rsnet("broker", "--tcp", "127.0.0.1:0", "--metrics", taken)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"rsnet broker: cannot listen on {taken}: Address already in use"


def startup_lines(environment: dict[str, str], cwd, **popen) -> list[str]:
    """What ``rsnet broker`` writes to stderr up to its last startup line, then it is killed."""
    process = subprocess.Popen([RSNET, "broker"], stderr=subprocess.PIPE, text=True, env=environment, cwd=cwd, **popen)
    try:
        lines = []
        deadline = time.monotonic() + 20
        while not any("topics in memory" in line for line in lines):
            line = process.stderr.readline()
            assert line and time.monotonic() < deadline, lines
            lines.append(line)
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
    return lines


def test_with_json_logs_every_startup_line_is_json_and_an_open_listener_is_warned_about(tmp_path):
    environment = env(RSNET_BROKER__LOG__FORMAT="json", RSNET_BROKER__LISTEN__TCP="0.0.0.0:0")
    lines = startup_lines(environment, tmp_path)
    records = [json.loads(line) for line in lines]  # every line is JSON
    messages = [record["message"] for record in records]
    assert any(message.startswith("serving tcp://0.0.0.0:") for message in messages)
    warnings = [r["message"] for r in records if r["level"] == "warning" and "0.0.0.0" in r["message"]]
    assert warnings and "auth off" in warnings[0], messages


def test_a_max_connections_lowered_to_the_descriptor_limit_is_logged_as_lowered(tmp_path):
    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    environment = env(RSNET_BROKER__LISTEN__TCP="127.0.0.1:0", RSNET_BROKER__LISTEN__MAX_CONNECTIONS="10000")
    lines = startup_lines(environment, tmp_path, preexec_fn=few_descriptors)
    assert any("max_connections lowered from 10000 to 96" in line for line in lines), lines
    (configuration,) = (line.split("configuration: ", 1)[1] for line in lines if "configuration: " in line)
    assert json.loads(configuration)["listen"]["max_connections"] == 96  # 256 / 2 less the 32 refusal slots


def test_a_negative_offset_is_refused_as_invalid_not_as_trimmed(broker):
    import rsnet.sync
    from rsnet.errors import StreamError
    from rsnet.protocol import ErrorCode

    with rsnet.sync.connect(broker.url) as conn:
        try:
            list(conn.subscribe("negative.offset", {"from": -5}))
        except StreamError as error:
            assert error.code == ErrorCode.REJECTED  # not OFFSET_TRIMMED, "removed by retention"
            assert "invalid start position -5" in error.message
        else:
            raise AssertionError("a negative offset was accepted")
