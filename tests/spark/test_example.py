"""examples/spark_pipeline.py produces the expected per-window aggregates."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

from .support import TOKEN, publish, records

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"
BASE = 1_700_000_000_000  # ms, on a 10-second boundary


def load_example():
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_windowed_pipeline_writes_one_record_per_closed_window(spark, broker_url, tmp_path):
    example = load_example()
    at = lambda seconds: BASE + int(seconds * 1000)  # noqa: E731 - a one-line helper
    readings = [
        {"sensor": "kitchen", "temp": 20.0, "time": at(1)},
        {"sensor": "hall", "temp": 18.0, "time": at(3)},
        {"sensor": "kitchen", "temp": 22.0, "time": at(5)},
        {"sensor": "kitchen", "temp": 25.0, "time": at(12)},
        "not a reading",  # skipped: not a map
        {"sensor": "hall", "temp": 17.5, "time": at(19.999)},
        {"sensor": "kitchen", "temp": 30.0, "time": at(40)},  # moves the watermark to 30 s: closes two windows
    ]
    publish(broker_url, "example.readings", readings)
    # One micro-batch with every reading, then one without data that closes the two windows.
    query = example.start(
        spark,
        broker_url,
        "example.readings",
        "example.windows",
        str(tmp_path / "cp"),
        token=TOKEN,
        available_now=True,
    )
    query.awaitTermination(120)
    assert query.exception() is None

    windows = sorted(
        (record["value"] for record in records(broker_url, "example.windows")), key=lambda w: (w["start"], w["sensor"])
    )
    assert windows == [
        {"start": at(0), "end": at(10), "sensor": "hall", "readings": 1, "avg_temp": 18.0, "max_temp": 18.0},
        {"start": at(0), "end": at(10), "sensor": "kitchen", "readings": 2, "avg_temp": 21.0, "max_temp": 22.0},
        {"start": at(10), "end": at(20), "sensor": "hall", "readings": 1, "avg_temp": 17.5, "max_temp": 17.5},
        {"start": at(10), "end": at(20), "sensor": "kitchen", "readings": 1, "avg_temp": 25.0, "max_temp": 25.0},
    ]


def test_without_pyspark_the_import_says_which_extra_to_install():
    # sys.modules[name] = None makes importing it fail as an uninstalled package does.
    for missing in ("pyspark", "pyarrow"):
        program = f"import sys; sys.modules[{missing!r}] = None; import rsnet.spark"
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == (
            f"ModuleNotFoundError: rsnet.spark needs {missing}: install rsnet with the spark extra "
            "(in a clone: pip install -e '.[spark]'), which brings pyspark 4.x and pyarrow"
        )


@pytest.mark.parametrize("command", ["produce", "run"])
def test_the_example_says_in_a_line_that_it_cannot_reach_the_broker(command):
    # produce ended in a TransportClosed traceback; run, 20 s later, in 125 lines of Python and
    # Java tracebacks and Spark's plan (an outside check).
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens there once it is closed
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), command, "--url", f"tcp://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr == f"spark_pipeline {command}: cannot connect to 127.0.0.1:{port}: Connection refused\n"
