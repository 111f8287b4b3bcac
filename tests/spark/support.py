"""A real ``rsnet broker`` process on 127.0.0.1 and blocking helpers to fill and read topics."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import rsnet.sync
from rsnet.broker import blocking

TOKEN = "spark-tests-token"
READER_TOKEN = "spark-tests-reader"  # may only subscribe to allowed.>

CONFIG = """
{data_dir}
[listen]
tcp = "127.0.0.1:{port}"

[[topics]]
pattern = "trim.>"
retention = {{ max_records = 100 }}

[[topics]]
pattern = "drop.>"
slow_subscriber = {{ policy = "drop", max_lag = 10 }}

[[topics]]
pattern = "strict.>"
auto_create = "never"
subscribe_missing = "fail"

[auth]
[[auth.tokens]]
name = "tests"
hash = "{hash}"
publish = [">"]
subscribe = [">"]

[[auth.tokens]]
name = "reader"
hash = "{reader_hash}"
publish = []
subscribe = ["allowed.>"]
"""


@contextmanager
def broker_process(directory: pathlib.Path, *, port: int = 0, durable: bool = False) -> Iterator[str]:
    """Run ``rsnet broker`` (auth on with :data:`TOKEN`; topics in memory, or durable under
    ``directory``) until the block ends; yields its tcp:// URL."""
    with broker_daemon(directory, port=port, durable=durable) as (url, _):
        yield url


@contextmanager
def broker_daemon(
    directory: pathlib.Path, *, port: int = 0, durable: bool = False, grace: float = 0.5
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """:func:`broker_process`, yielding its process too (to stop it as a deploy would), with
    ``grace`` seconds for its streams when it is told to stop (SIGTERM)."""
    from rsnet.broker.auth import hash_token

    config = directory / "rsnet.toml"
    config.write_text(
        CONFIG.format(
            hash=hash_token(TOKEN),
            reader_hash=hash_token(READER_TOKEN),
            port=port,
            data_dir=f'data_dir = "{directory / "data"}"' if durable else "",
        )
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "rsnet.cli", "broker", "--config", str(config), "--grace", str(grace)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    printed = ""
    try:
        while "serving " not in printed:
            line = process.stderr.readline()
            assert line, f"the broker exited: {printed}"
            printed += line
        url = printed.split("serving ", 1)[1].split()[0]
        yield url, process
    finally:
        process.terminate()
        process.wait(10)
        process.stderr.close()


def publish(url: str, topic: str, values: list[Any], *, producer: str | None = None, first_sequence: int = 0) -> None:
    with rsnet.sync.connect(url, token=TOKEN) as client:
        blocking.publish(client, topic, values, producer=producer or f"test-{topic}", first_sequence=first_sequence)


def records(url: str, topic: str) -> list[dict[str, Any]]:
    """Every retained record of ``topic``, read with exact demand."""
    with rsnet.sync.connect(url, token=TOKEN) as client:
        ((first, end),) = blocking.resolve_topics(client, [topic]).values()
        return [record for chunk in blocking.read_range(client, topic, first, end) for record in chunk]


def ends(url: str, topic: str) -> tuple[int, int]:
    with rsnet.sync.connect(url, token=TOKEN) as client:
        return blocking.resolve_topics(client, [topic])[topic]


def wait_until(condition: Any, what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` (a state of the broker another process changes) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
