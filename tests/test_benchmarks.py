"""The benchmark suite keeps working: one ``--quick`` run, as CI does (issue 6).

Structure only: which rows were measured, by which systems. Never a timing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 180


def measured(record: dict, primary: str) -> bool:
    """Every run of ``record`` produced metrics, and the primary one was summarised."""
    runs = record["runs"]
    return (
        record["status"] == "ok"
        and bool(runs)
        and all("metrics" in run and primary in run["metrics"] for run in runs)
        and record["summary"][primary]["n"] == len(runs)
    )


@pytest.mark.timeout(TIMEOUT + 30)
def test_quick_run_measures_every_system(tmp_path):
    missing = [name for name in ("rsocket", "aiohttp") if importlib.util.find_spec(name) is None]
    # `make test` installs the extras: their absence is a broken install, not a reason to skip
    assert not missing, f"the benchmark extras are not installed ({', '.join(missing)}): pip install -e '.[bench]'"
    out = tmp_path / "q.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "run", "--quick", "--json", str(out), "--out", str(tmp_path / "report")],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)  # the suite kills its workers on the way out
        try:
            output, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()  # its workers exit by themselves when it is gone
            output, _ = process.communicate()
        pytest.fail(f"the quick run took more than {TIMEOUT} s:\n{output[-4000:]}")
    assert process.returncode == 0, output[-4000:]

    document = json.loads(out.read_text())
    assert document["config"]["quick"] is True
    rows = document["rows"]
    assert all(row["systems"] for row in rows)

    scenario_1 = [row for row in rows if row["scenario"] == 1]
    assert {"s1-16-tcp", "s1-1024-tcp", "s1-16-ws", "s1-1024-ws"} <= {row["id"] for row in scenario_1}
    for row in scenario_1:
        if "-default" not in row["id"]:  # default-demand rows are rsnet's (and rsocket-py's 256)
            assert {"rsnet", "rsocket-py", "ceiling"} <= set(row["systems"]), row["id"]
        for system, record in row["systems"].items():
            assert measured(record, "items_per_s"), (row["id"], system, record)
    ratios = next(row for row in scenario_1 if row["id"] == "s1-16-tcp")["ratios"]
    assert {"rsocket-py", "ceiling"} <= set(ratios)

    assert document["broker"]["reason"] is None
    scenario_5 = [row for row in rows if row["scenario"] == 5]
    assert len(scenario_5) == 12  # 1, 10, 100 subscribers x memory and three fsync policies
    assert {row["systems"]["rsnet-broker"]["params"]["subscribers"] for row in scenario_5} == {1, 10, 100}
    policies = set()
    for row in scenario_5:
        assert set(row["systems"]) == {"rsnet-broker"}
        record = row["systems"]["rsnet-broker"]
        assert measured(record, "deliveries_per_s"), (row["id"], record)
        params = record["params"]
        for run in record["runs"]:
            assert run["raw"]["items"] == params["count"] * params["subscribers"]
        policies.add(row["id"].rsplit("-", 1)[0])
    assert policies == {"s5-memory", "s5-always", "s5-interval", "s5-never"}

    # Scenario 6: the JavaScript client in Node against the Python client, on the same server.
    scenario_6 = {row["id"]: row for row in rows if row["scenario"] == 6}
    assert set(scenario_6) == {"s6-js-16-tcp", "s6-js-16-ws"}
    node_ready = shutil.which("node") and (pathlib.Path(ROOT) / "client" / "js" / "node_modules").is_dir()
    for row in scenario_6.values():
        assert set(row["systems"]) == {"rsnet", "rsnet-js"}
        assert measured(row["systems"]["rsnet"], "items_per_s"), row
        js = row["systems"]["rsnet-js"]
        if node_ready:  # make test installs client/js's packages wherever npm is
            assert measured(js, "items_per_s"), (row["id"], js)
            assert all(run["raw"]["items"] == js["params"]["count"] for run in js["runs"])
            assert set(row["ratios"]) == {"rsnet"}  # the Node client's rate over the Python client's
        else:
            assert js["status"] == "not available" and js["reason"], js
