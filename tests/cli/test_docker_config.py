"""The Docker image's configuration (server/docker.toml, copied by the Dockerfile) does what its
startup line says. Docker itself is not needed: the same file runs here, with only the volume
and the listening addresses moved (to a temporary directory and to 127.0.0.1) by the
environment overrides the image documents."""

from __future__ import annotations

import pathlib
import subprocess
import time

from rsnet.broker.config import load_config, topic_config

from .support import RSNET, env, rsnet

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = ROOT / "server" / "docker.toml"


def test_the_dockerfile_ships_docker_toml():
    assert "COPY server/docker.toml /etc/rsnet/rsnet.toml" in (ROOT / "Dockerfile").read_text()


def test_every_topic_is_durable_listening_everywhere_with_json_logs():
    config = load_config(CONFIG, {})
    assert str(config.data_dir) == "/var/lib/rsnet"
    for topic in ("sensors.kitchen", "orders.eu", "anything"):
        assert topic_config(config, topic).storage == "durable"
    assert (config.listen.tcp.host, config.listen.ws.host, config.metrics.listen.host) == ("0.0.0.0",) * 3
    assert config.log.format == "json"


def test_the_readme_example_topic_is_written_to_the_volume(tmp_path):
    environment = env(
        RSNET_BROKER__DATA_DIR=str(tmp_path),
        RSNET_BROKER__LISTEN__TCP="127.0.0.1:0",
        RSNET_BROKER__LISTEN__WS="",
        RSNET_BROKER__METRICS__LISTEN="127.0.0.1:0",
    )
    process = subprocess.Popen(
        [RSNET, "broker", "--config", str(CONFIG)], stderr=subprocess.PIPE, text=True, env=environment
    )
    try:
        printed = ""
        deadline = time.monotonic() + 20
        while "topics durable" not in printed:
            line = process.stderr.readline()
            assert line and time.monotonic() < deadline, printed
            printed += line
        url = printed.split("serving ", 1)[1].split('"')[0]
        assert f"topics durable in {tmp_path}" in printed
        result = rsnet("pub", url, "sensors.kitchen", stdin='{"celsius": 21.5}\n')
        assert result.returncode == 0, result.stderr
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
    assert any(path.stat().st_size for path in tmp_path.rglob("*") if path.is_file() and "kitchen" in str(path))
