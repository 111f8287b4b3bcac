"""The sink's tasks across a broker restart, without Spark: a task that loses the broker between
its batches reconnects and publishes every batch not known stored again, and the broker keeps
each row once (an outside check saw a streaming write die on a broker's SIGTERM)."""

from __future__ import annotations

import contextlib
import signal
import socket

import pyarrow as pa
import pytest

from rsnet.spark import options
from rsnet.spark.sink import write_task

from .support import TOKEN, broker_daemon, records


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["deploy", "crash"])
def test_a_task_writes_every_row_once_across_a_broker_restart(tmp_path, stop):
    port, rows = _free_port(), 10_000
    opts = options.parse({"url": f"tcp://127.0.0.1:{port}", "token": TOKEN, "topic": "sink.restart"})
    with contextlib.ExitStack() as brokers:
        url, first = brokers.enter_context(broker_daemon(tmp_path, port=port, durable=True))

        def batches():
            for number in range(4):
                if number == 2:  # two batches published, maybe not stored yet: the broker goes
                    first.send_signal(stop)
                    first.wait(30)
                    brokers.enter_context(broker_daemon(tmp_path, port=port, durable=True))
                yield pa.record_batch({"value": list(range(number * rows, (number + 1) * rows))})

        written = write_task(opts, batches(), "spark-test-p0", 0)
        assert written.counts == {"sink.restart": 4 * rows}
        assert [record["value"] for record in records(url, "sink.restart")] == list(range(4 * rows))
