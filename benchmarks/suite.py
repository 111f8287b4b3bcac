"""Runs the rows of every scenario on every system, round-robin, and aggregates the runs.

Run ``r`` of every row and system is measured before run ``r + 1`` of any, so a burst of noise
on this shared machine hits all systems alike; ratios between systems are taken run by run
(run ``r`` of rsnet against run ``r`` of the peer) and then summarised, besides the medians.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from . import scenarios
from .report import number
from .runner import MeasurementError, measure
from .scenarios import Row
from .systems import broker, jetstream, rsnet_js

Progress = Callable[[str], None]


def rsnet_unavailable() -> str | None:
    """Why rsnet's server/client cannot be measured, or None."""
    try:
        import rsnet

        rsnet.Server, rsnet.connect  # noqa: B018 (lazy exports: touching them imports them)
    except Exception as error:  # any import failure means "not there yet"
        return f"rsnet's server/client are not importable: {type(error).__name__}: {error}"
    return None


def rsocket_unavailable(transport: str) -> str | None:
    """Why rsocket-py cannot be measured on ``transport``, or None."""
    import importlib.util

    needs = ["rsocket"] + (["aiohttp"] if transport == "ws" else [])
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (pip install -e '.[bench]')"
    return None


def summarise(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def advantage(row: Row, mine: float, other: float) -> float | None:
    """How many times better ``mine`` is than ``other`` on the row's primary metric (>1: better)."""
    if not mine or not other:
        return None
    return mine / other if row.primary.higher_is_better else other / mine


def run_suite(
    rows: list[Row], runs: int, systems: tuple[str, ...], progress: Progress = lambda line: None
) -> dict[str, Any]:
    unavailable = (
        {("rsnet", transport): rsnet_unavailable() for transport in ("tcp", "ws")}
        | {("rsocket-py", transport): rsocket_unavailable(transport) for transport in ("tcp", "ws")}
        | {("rsnet-broker", transport): rsnet_unavailable() or broker.unavailable() for transport in ("tcp", "ws")}
        | {("jetstream", "tcp"): jetstream.unavailable()}
    )
    if "rsnet-js" in systems and any("rsnet-js" in row.systems for row in rows):
        js = rsnet_unavailable() or rsnet_js.unavailable()  # compiles client/js first if needed
        unavailable |= {("rsnet-js", transport): js for transport in ("tcp", "ws")}
    table: list[dict[str, Any]] = []
    for row in rows:
        entry: dict[str, Any] = {
            "id": row.id,
            "subject": row.subject,
            "scenario": row.scenario,
            "title": row.title,
            "kind": row.kind,
            "transport": row.transport,
            "chart": row.chart,
            "metrics": [m.__dict__ for m in row.metrics],
            "systems": {},
        }
        pacer = row.rate_system
        pacer_missing = None
        if pacer is not None:  # every system of the row runs at this one's pace
            pacer_missing = unavailable.get((pacer, row.transport)) or (None if pacer in systems else "not selected")
        for system in row.systems:
            if system not in systems:
                continue
            reason = unavailable.get((system, row.transport))
            if reason is None and pacer_missing is not None:
                reason = f"the row runs at {pacer}'s pace, and {pacer} is unavailable: {pacer_missing}"
            entry["systems"][system] = {
                "params": row.params_for(system),
                "status": "not available" if reason else "ok",
                "reason": reason,
                "runs": [],
            }
        table.append(entry)

    started = time.monotonic()
    primary: dict[tuple[str, str, int], float] = {}  # (row id, system, run) -> primary metric
    for run in range(runs):
        for row, entry in zip(rows, table, strict=True):
            if row.max_runs is not None and run >= row.max_runs:
                continue
            for system, record in entry["systems"].items():
                if record["status"] == "not available":
                    continue
                params = record["params"]
                try:
                    if row.rate_from is not None:
                        params = {**params, "rate": paced_rate(row, system, run, primary)}
                    m = measure(system, row.transport, row.kind, params, row.timeout, row.server_params)
                    problem = scenarios.check(row, m.result, params)
                    if problem:
                        raise MeasurementError(f"{system}: {problem}")
                    metrics = scenarios.metrics_of(row, m.result, m.rss, params, m.server_cpu_s)
                    if row.primary.key in metrics:
                        primary[row.id, system, run] = metrics[row.primary.key]
                    run_record: dict[str, Any] = {
                        "run": run,
                        "metrics": metrics,
                        "server_cpu_s": round(m.server_cpu_s, 3),
                        "raw": {k: v for k, v in m.result.items() if k != "latencies_us"},
                    }
                    if params is not record["params"]:
                        run_record["params"] = params  # this run's own (a paced rate)
                    if row.scenario == 4:
                        run_record["rss"] = m.rss
                    record["runs"].append(run_record)
                    shown = ", ".join(
                        f"{metric.label} {number(metrics[metric.key], metric.unit)} {metric.unit}"
                        for metric in row.metrics[:2]
                        if metric.key in metrics
                    )
                    progress(f"[run {run + 1}/{runs}] {row.id:15s} {system:10s} {shown}  ({m.wall_s:.1f} s)")
                except MeasurementError as error:
                    record["runs"].append({"run": run, "error": str(error)})
                    record["status"] = "failed"
                    progress(f"[run {run + 1}/{runs}] {row.id:15s} {system:10s} FAILED: {error}")

    for row, entry in zip(rows, table, strict=True):
        for record in entry["systems"].values():
            ok = [r for r in record["runs"] if "metrics" in r]
            if record["status"] == "failed" and ok:
                record["status"] = "partly failed"
            record["summary"] = {
                m.key: summarise([r["metrics"][m.key] for r in ok if m.key in r["metrics"]])
                for m in row.metrics
                if any(m.key in r["metrics"] for r in ok)
            }
        entry["ratios"] = ratios(row, entry)

    return {
        "rows": table,
        "broker": {"reason": broker.unavailable(), "planned": broker.planned_rows()},
        "jetstream": {"reason": jetstream.unavailable()},
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def paced_rate(row: Row, system: str, run: int, primary: dict[tuple[str, str, int], float]) -> float:
    """The rate a latency row paces ``system`` at in ``run``: a fraction of what the same system
    (or the row's ``rate_system``) reached in the row it names, measured earlier in the same run
    (so the same conditions)."""
    assert row.rate_from is not None
    source, fraction = row.rate_from
    pacer = row.rate_system or system
    reached = primary.get((source, pacer, run))
    if not reached:
        raise MeasurementError(f"{system}: no maximum rate of {pacer} from row {source} in this run to pace at")
    return reached * fraction


def ratios(row: Row, entry: dict[str, Any]) -> dict[str, Any]:
    """The row's subject's (rsnet's, mostly) advantage over each other system on the primary
    metric, run by run."""
    key = row.primary.key
    mine = entry["systems"].get(row.subject)
    if not mine:
        return {}
    by_run = {r["run"]: r["metrics"].get(key) for r in mine["runs"] if "metrics" in r}
    out = {}
    for system, record in entry["systems"].items():
        if system == row.subject:
            continue
        values = [
            advantage(row, by_run[r["run"]], r["metrics"].get(key))
            for r in record["runs"]
            if "metrics" in r and by_run.get(r["run"]) is not None
        ]
        values = [v for v in values if v is not None]
        if values:
            out[system] = summarise(values)
    return out


def print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
