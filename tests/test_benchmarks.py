"""The benchmark suite keeps working: one ``--quick`` run, as CI does (issue 6).

Structure only: which rows were measured, by which systems. Never a timing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import pytest

from benchmarks import scenarios

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300  # ~80 s on a quiet machine, 130 s at load 5 on 2 cores


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
    missing = [name for name in ("rsocket", "aiohttp", "nats") if importlib.util.find_spec(name) is None]
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
    # 1, 10, 100 subscribers x memory and three fsync policies; 100 taking arrays, and 100
    # Subscribers (no async for), each in memory and under interval
    assert len(scenario_5) == 16
    assert {row["systems"]["rsnet-broker"]["params"]["subscribers"] for row in scenario_5} == {1, 10, 100}
    policies = set()
    for row in scenario_5:
        assert set(row["systems"]) == {"rsnet-broker"}
        record = row["systems"]["rsnet-broker"]
        assert measured(record, "deliveries_per_s"), (row["id"], record)
        params = record["params"]
        for run in record["runs"]:
            assert run["raw"]["items"] == params["count"] * params["subscribers"]
        policies.add(row["id"].split("-")[1])
        assert ("arrays" in row["id"]) == (params["items"] == "arrays")
        assert row["id"].endswith("-subscriber") == (params["api"] == "subscriber")
    assert policies == {"memory", "always", "interval", "never"}

    # Scenario 6: the JavaScript client in Node against the Python client, on the same server.
    scenario_6 = {row["id"]: row for row in rows if row["scenario"] == 6}
    assert set(scenario_6) == {
        f"s6-js-16-{transport}{api}" for transport in ("tcp", "ws") for api in ("", "-default", "-subscriber", "-cold")
    }
    node_ready = shutil.which("node") and (pathlib.Path(ROOT) / "client" / "js" / "node_modules").is_dir()
    for row in scenario_6.values():
        assert set(row["systems"]) == {"rsnet", "rsnet-js"}
        assert measured(row["systems"]["rsnet"], "items_per_s"), row
        python, js = row["systems"]["rsnet"], row["systems"]["rsnet-js"]
        # both clients read the untimed warm-up stream, except in the rows of a first stream
        assert (python["params"]["warmup"] == 0) == row["id"].endswith("-cold")
        assert all(run["raw"]["warmup_items"] == python["params"]["warmup"] for run in python["runs"])
        if node_ready:  # make test installs client/js's packages wherever npm is
            assert measured(js, "items_per_s"), (row["id"], js)
            assert all(run["raw"]["items"] == js["params"]["count"] for run in js["runs"])
            assert all(run["raw"]["warmup_items"] == js["params"]["warmup"] for run in js["runs"])
            assert set(row["ratios"]) == {"rsnet"}  # the Node client's rate over the Python client's
        else:
            assert js["status"] == "not available" and js["reason"], js

    scenario_7 = {row["id"]: row for row in rows if row["scenario"] == 7}
    assert set(scenario_7) == {
        "s7-publish-always",
        "s7-publish-interval",
        "s7-publish-never",
        "s7-fanout-1",
        "s7-fanout-10",
        "s7-fanout-100",
        "s7-fanout-1-interval",
        "s7-fanout-1-interval-25ms",
        "s7-fanout-1-never",
        "s7-replay",
        "s7-latency-always",
        "s7-latency-interval",
        "s7-latency-interval-25ms",
        "s7-latency-never",
        "s7-latency-never-same-rate",
    }
    jetstream = document["jetstream"]["reason"]
    for row_id, row in scenario_7.items():
        assert set(row["systems"]) == {"rsnet-broker", "jetstream"}, row_id
        primary = row["metrics"][0]["key"]
        paced_by_jetstream = row_id == "s7-latency-never-same-rate"
        for system, record in row["systems"].items():
            if jetstream is None:
                assert measured(record, primary), (row_id, system, record)
            elif system == "jetstream" or paced_by_jetstream:
                # nats-server missing (make test installs it as root): said so, not failed
                assert record["status"] == "not available" and "nats-server" in record["reason"], record
            else:
                assert measured(record, primary), (row_id, system, record)
        if jetstream is None:
            assert "jetstream" in row["ratios"], row_id
    for fsync, fanout, pacer in (
        ("always", "s7-fanout-1", None),
        ("interval", "s7-fanout-1-interval", None),
        ("interval-25ms", "s7-fanout-1-interval-25ms", None),
        ("never", "s7-fanout-1-never", None),
        ("never-same-rate", "s7-fanout-1-never", "jetstream"),
    ):
        latency = scenario_7[f"s7-latency-{fsync}"]
        for system, record in latency["systems"].items():
            if record["status"] == "not available":
                continue
            (run,) = record["runs"]
            # paced at half of what the same system (or the row's pacer, for every system)
            # reached from one producer to one subscriber
            reached = scenario_7[fanout]["systems"][pacer or system]["runs"][0]["metrics"]["deliveries_per_s"]
            assert run["params"]["rate"] == reached / 2
            m = run["metrics"]
            assert m["p50_us"] <= m["p99_us"] <= m["p999_us"]
            assert run["raw"]["items"] == int(run["params"]["rate"] * run["params"]["seconds"])

    scenario_8 = [row for row in rows if row["scenario"] == 8]
    assert [row["id"] for row in scenario_8] == ["s8-live-200", "s8-live-50-traced"]
    for row in scenario_8:
        for system in ("rsnet", "ceiling"):
            record = row["systems"][system]
            assert measured(record, row["metrics"][0]["key"]), (row["id"], system, record)
            (run,) = record["runs"]
            assert run["metrics"]["served"] == row["systems"][system]["params"]["connections"]
            assert run["metrics"]["server_kib_per_conn"] > 0
    traced = scenario_8[1]["systems"]["rsnet"]["runs"][0]
    assert traced["metrics"]["server_traced_kib_per_conn"] > 0
    assert any(site.startswith("rsnet/") for site, _, _ in traced["raw"]["server_traced_top"])

    page = (tmp_path / "report" / "RESULTS.md").read_text()
    for heading in ("| target (issue 13)", "## Scenario 7: rsnet's broker against NATS JetStream", "## Scenario 8"):
        assert heading in page
    # Target 6's p99 is checked under fsync always and never; under interval the latency is the
    # interval the broker is given (its rows are reported, and say so).
    latency_targets = [line for line in page.splitlines() if line.startswith("| 6. latency publish")]
    assert len(latency_targets) == 5
    assert ("**Where JetStream wins**" in page) == (jetstream is None)
    for line in latency_targets:
        assert ("reported (no target: the latency is the configured interval" in line) == ("fsync interval" in line)
        assert (">= 0.5x (p99 within 2x)" in line) == ("fsync interval" not in line)
    assert (tmp_path / "report" / "results.png").stat().st_size > 10_000


def test_a_latency_row_brings_the_row_it_takes_its_rate_from():
    rows = scenarios.build(quick=True)
    chosen = [row.id for row in scenarios.select(rows, ["s7-latency-interval-25ms"])]
    assert chosen == ["s7-fanout-1-interval-25ms", "s7-latency-interval-25ms"]  # in suite order: the rate first
    chosen = [row.id for row in scenarios.select(rows, ["s7-latency-interval"])]  # a prefix of both
    assert chosen == [
        "s7-fanout-1-interval",
        "s7-fanout-1-interval-25ms",
        "s7-latency-interval",
        "s7-latency-interval-25ms",
    ]
    assert [row.id for row in scenarios.select(rows, [])] == [row.id for row in rows]


def test_where_jetstream_wins_lists_the_rows_its_median_beats_rsnets_with_why():
    from benchmarks.report import jetstream_wins

    def row(row_id: str, metrics: list[tuple[str, bool]], rsnet: dict, jetstream: dict) -> dict:
        def system(medians: dict) -> dict:
            return {"summary": {key: {"median": value} for key, value in medians.items()}}

        return {
            "id": row_id,
            "title": row_id,
            "metrics": [{"key": k, "label": k, "unit": "u", "higher_is_better": h} for k, h in metrics],
            "systems": {"rsnet-broker": system(rsnet), "jetstream": system(jetstream)},
        }

    latency = [("p99_us", False), ("p50_us", False), ("p999_us", False)]
    entries = [
        row("s7-fanout-1", [("deliveries_per_s", True)], {"deliveries_per_s": 9.0}, {"deliveries_per_s": 1.0}),
        row("s7-publish-never", [("records_per_s", True)], {"records_per_s": 1.0}, {"records_per_s": 2.0}),
        row(
            "s7-latency-always",
            latency,
            {"p99_us": 1, "p50_us": 9, "p999_us": 9},
            {"p99_us": 5, "p50_us": 2, "p999_us": 1},
        ),
        row("s7-latency-never-same-rate", latency, {"p99_us": 1, "p50_us": 1}, {"p99_us": 9, "p50_us": 0.5}),
    ]
    lines = [line for line in jetstream_wins(entries) if line.startswith("- ")]
    assert [line.split(":")[0] for line in lines] == [
        "- records_per_s, s7-publish-never",  # a throughput row: higher is better
        "- p50_us, s7-latency-always",  # its p99 is rsnet's win; the p99.9 is not compared
        "- p50_us, s7-latency-never-same-rate",
    ]
    assert "not explained" in lines[0] and "waits for no fsync" in lines[1] and "same pace" in lines[2]
    assert jetstream_wins(entries[:1]) == ["**Where JetStream wins**: no row (medians of the runs).", ""]


def test_a_row_paced_by_a_system_that_is_unavailable_is_unavailable_for_every_system(monkeypatch):
    from benchmarks import suite

    monkeypatch.setattr(suite.jetstream, "unavailable", lambda: "nats-server not found")
    rows = scenarios.select(scenarios.build(quick=True), ["s7-latency-never-same-rate"])
    (same_rate,) = [
        e for e in suite.run_suite(rows, 0, ("rsnet-broker", "jetstream"))["rows"] if e["id"] == rows[-1].id
    ]
    for record in same_rate["systems"].values():
        assert record["status"] == "not available" and "nats-server not found" in record["reason"], record


def test_the_25_ms_rows_run_the_broker_with_that_interval(tmp_path, monkeypatch):
    from benchmarks.systems import broker

    rows = {row.id: row for row in scenarios.build(quick=True)}
    for row_id in ("s7-fanout-1-interval-25ms", "s7-latency-interval-25ms"):
        assert rows[row_id].server_params == {"storage": "durable", "fsync": "interval", "fsync_interval": 0.025}
    assert "fsync_interval" not in rows["s7-latency-interval"].server_params  # the broker's default, 100 ms
    monkeypatch.setenv("RSNET_BENCH_SCRATCH", str(tmp_path))
    made = broker.make_broker(**{k: v for k, v in rows["s7-latency-interval-25ms"].server_params.items()})
    assert (made.fsync.value, made.fsync_interval) == ("interval", 0.025)


def benchmarks_command(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks *args``, which must succeed within 100 s."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.timeout(120)
def test_profile_writes_a_flame_graph_of_the_server(tmp_path):
    svg = tmp_path / "s8.svg"
    # 200 connections: about a second of the server's work, enough samples to hold its frames
    command = ["profile", "s8-live-200", "--quick", "--rate", "500", "--out", str(svg)]
    done = benchmarks_command(*command)
    assert f"wrote {svg}" in done.stdout
    graph = svg.read_text()
    assert graph.lstrip().startswith("<?xml") and "<svg" in graph
    assert "rsnet/net/server.py" in graph  # the server's own frames were sampled, not just trio's


def test_round_trip_legs_line_up_the_two_processes_events():
    from benchmarks.round_trip import LEGS, _round_trips

    client = [
        ("w", 0.0),  # the handshake, before any stream opened: not a round trip
        ("r", 1.0),
        ("c0", 10.0),
        ("w", 12.0),
        ("r", 30.0),
        ("w", 31.0),  # a REQUEST after the item: no stream opened since, not a round trip
        ("c0", 40.0),
        ("w", 41.0),
        ("r", 60.0),
    ]
    # the server's read may return before the client's write did (the second round trip)
    server = [("r", 0.5), ("w", 0.6), ("r", 15.0), ("w", 20.0), ("r", 32.0), ("r", 41.5), ("w", 50.0)]
    trips = _round_trips(client, server)
    assert [[trip[leg] for leg in LEGS[:4]] for trip in trips] == [[2.0, 3.0, 5.0, 10.0], [1.0, 0.5, 8.5, 10.0]]


@pytest.mark.timeout(120)
def test_round_trip_measures_the_legs_of_every_system():
    done = benchmarks_command("round-trip", "--quick")
    for transport in ("TCP", "WebSocket"):
        section = done.stdout.split(f"## {transport}")[1]
        assert "| server processing |" in section and "| latency |" in section
        assert "| ceiling, two tasks |" in section
    # rsnet, the ceiling and the ceiling in two tasks, on TCP and WebSocket, and the hot loop's two
    assert done.stderr.count("[run 1/1]") == 8
    hot = done.stdout.split("## The same work in a hot loop")[1]
    assert "| both, hot |" in hot and "| both, in the round trip |" in hot
    counted = done.stdout.split("## The same work, counted")[1]
    assert "| instructions | not counted | not counted | |" in counted  # valgrind is too slow for --quick
    bytecodes = re.search(r"\| Python bytecodes \| ([\d,]+) \| ([\d,]+) \|", counted)
    assert bytecodes is not None
    ours, theirs = (int(n.replace(",", "")) for n in bytecodes.groups())
    assert ours > theirs > 0  # rsnet's layers execute more bytecodes than the ceiling's few msgpack calls


def test_bytecodes_are_counted_for_one_round_exactly():
    from benchmarks.instructions import bytecodes_per_round

    # Deterministic: the same round, traced twice, executes the same bytecodes.
    assert bytecodes_per_round("ceiling") == bytecodes_per_round("ceiling") > 0


def test_callgrinds_summary_gives_the_instruction_count():
    from benchmarks.instructions import collected

    assert collected("==12== Collected : 1234\n==12==\n==12== I   refs:      1,894,646,229\n") == 1_894_646_229
    with pytest.raises(RuntimeError, match="no instruction count"):
        collected("valgrind: failed to start tool 'callgrind'")


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instructions_per_round_come_from_two_runs_under_callgrind():
    from benchmarks.instructions import instructions_per_round

    # The ceiling's round is a few msgpack calls: some tens of thousands of instructions, not
    # the millions of the interpreter's start-up, which the difference between the runs removes.
    assert 5_000 < instructions_per_round("ceiling", 100) < 200_000
