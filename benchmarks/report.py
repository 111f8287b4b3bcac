"""Writes what a run measured for people: ``RESULTS.md`` and the charts (PNG, matplotlib).

Input is the suite's result document (the same one ``--json`` saves), so
``python -m benchmarks report results.json`` regenerates the page without measuring again.
"""

from __future__ import annotations

import math
import os
from typing import Any

from .systems import SYSTEMS

COLORS = {
    "rsnet": "#1f77b4",
    "rsocket-py": "#d62728",
    "ceiling": "#7f7f7f",
    "rsnet-js": "#ff7f0e",
    "rsnet-broker": "#2ca02c",
}
SCENARIOS = {
    1: "Scenario 1: one stream, throughput",
    2: "Scenario 2: stop-and-wait and round trip",
    3: "Scenario 3: many streams, many connections",
    4: "Scenario 4: slow consumer, memory",
    5: "Scenario 5: broker fan-out",
    6: "Scenario 6: the JavaScript client in Node against the Python client",
}
CPU_KEYS = ("server_cpu_us", "client_cpu_us")
CHART = "results.png"
MEMORY_CHART = "memory.png"


def number(value: float | None, unit: str = "") -> str:
    """Short human form: 1.23M, 612k, 4.2, 0.31."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    magnitude = abs(value)
    if unit in ("items/s", "deliveries/s"):
        if magnitude >= 1e6:
            return f"{value / 1e6:.2f}M"
        if magnitude >= 1e4:
            return f"{value / 1e3:.0f}k"
        if magnitude >= 1e3:
            return f"{value / 1e3:.1f}k"
        return f"{value:.0f}"
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def cell(record: dict[str, Any] | None, metrics: list[dict[str, Any]], runs_wanted: int) -> str:
    if record is None:
        return ""
    if record["status"] == "not available":
        return "not available"
    summary = record.get("summary", {})
    if not summary:
        return "failed"
    parts = []
    for i, metric in enumerate(m for m in metrics if m["key"] not in CPU_KEYS):
        stats = summary.get(metric["key"])
        if stats is None:
            continue
        text = f"{number(stats['median'], metric['unit'])} {metric['unit']}"
        if i == 0:
            text = f"**{text}**"
            if stats["n"] > 1:
                text += f" ({number(stats['min'], metric['unit'])}–{number(stats['max'], metric['unit'])})"
        parts.append(text)
    if record["status"] != "ok":
        parts.append(f"*{record['status']}*")
    return "<br>".join(parts)


def ratio_cell(stats: dict[str, float] | None) -> str:
    if not stats:
        return "–"
    text = f"**{stats['median']:.2f}x**"
    if stats["n"] > 1:
        text += f" ({stats['min']:.2f}–{stats['max']:.2f})"
    return text


def count_of(params: dict[str, Any]) -> str:
    if "subscribers" in params:
        return f"{params['count']:,} records x {params['subscribers']}"
    for key in ("count", "iterations"):
        if key in params:
            return f"{params[key]:,}"
    if "streams" in params:
        return f"{params['streams']:,}x{params['items']}"
    if "connections" in params:
        return f"{params['connections']:,}x{params['items']}"
    return ""


def counts(entry: dict[str, Any]) -> str:
    shown = {s: count_of(r["params"]) for s, r in entry["systems"].items()}
    if len(set(shown.values())) == 1:
        return next(iter(shown.values()), "")
    return ", ".join(f"{s}: {c}" for s, c in shown.items())


def scenario_table(entries: list[dict[str, Any]], systems: list[str], runs: int) -> list[str]:
    subject = entries[0].get("subject", "rsnet")  # whose advantage the ratios are (one per scenario)
    peers = [s for s in systems if s != subject]
    head = ["", "N", *systems, *(f"{subject} vs {p}" for p in peers if subject in systems)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for entry in entries:
        cells = [entry["title"], counts(entry)]
        cells += [cell(entry["systems"].get(s), entry["metrics"], runs) for s in systems]
        if subject in systems:
            cells += [ratio_cell(entry.get("ratios", {}).get(p)) for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def cpu_table(entries: list[dict[str, Any]], systems: list[str], per: str = "item") -> list[str]:
    """CPU time per item of each process (server measured from /proc while the client ran,
    client from its own clock around the measured part): where each system spends."""
    entries = [e for e in entries if any(m["key"] in CPU_KEYS for m in e["metrics"])]
    if not entries:
        return []
    lines = [
        f"CPU time per {per}, µs, server / client (median):",
        "",
        "| | " + " | ".join(systems) + " |",
        "|" + "---|" * (len(systems) + 1),
    ]
    for entry in entries:
        cells = []
        for system in systems:
            summary = entry["systems"].get(system, {}).get("summary", {})
            server, client = (summary.get(k, {}).get("median") for k in CPU_KEYS)
            cells.append(f"{number(server)} / {number(client)}" if server is not None else "–")
        lines.append(f"| {entry['title']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def memory_table(entry: dict[str, Any], systems: list[str]) -> list[str]:
    metrics = entry["metrics"]
    head = [
        "system",
        "items",
        "consumer pace",
        *(m["label"] if m["label"] == m["unit"] else f"{m['label']} ({m['unit']})" for m in metrics),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system in systems:
        record = entry["systems"].get(system)
        if record is None:
            continue
        if record["status"] == "not available" or not record.get("summary"):
            status = record["status"] if record["status"] != "ok" else "failed"
            lines.append(f"| {system} | | | {status} |" + " |" * (len(metrics) - 1))
            continue
        values = [number(record["summary"].get(m["key"], {}).get("median"), m["unit"]) for m in metrics]
        pace = record["params"].get("pace")
        pace_text = f"{number(pace, 'items/s')} items/s" if pace else "none"
        lines.append(f"| {system} | {count_of(record['params'])} | {pace_text} | " + " | ".join(values) + " |")
    return lines


def find(document: dict[str, Any], row_id: str) -> dict[str, Any] | None:
    return next((e for e in document["rows"] if e["id"] == row_id), None)


def median_of(entry: dict[str, Any] | None, system: str, key: str) -> float | None:
    if entry is None or system not in entry["systems"]:
        return None
    return entry["systems"][system].get("summary", {}).get(key, {}).get("median")


def ratio_of(entry: dict[str, Any] | None, system: str) -> float | None:
    if entry is None:
        return None
    return entry.get("ratios", {}).get(system, {}).get("median")


def targets(document: dict[str, Any]) -> list[str]:
    """Issue 6's targets against this run's numbers: information, never an assertion."""

    def verdict(value: float | None, ok: bool | None) -> str:
        return "no data" if value is None or ok is None else ("met" if ok else "**not met**")

    rows = []
    s1 = find(document, "s1-16-tcp")
    r = ratio_of(s1, "rsocket-py")
    rows.append(("1, TCP, 16 B: rsnet >= 30x rsocket-py", f"{r:.1f}x" if r else "–", verdict(r, r and r >= 30)))
    r = ratio_of(s1, "ceiling")
    rows.append(("1, TCP, 16 B: rsnet >= 0.5x the ceiling", f"{r:.2f}x" if r else "–", verdict(r, r and r >= 0.5)))
    v = median_of(find(document, "s1-16-ws"), "rsnet", "items_per_s")
    rows.append(
        (
            "1, WebSocket, 16 B: rsnet >= 300k items/s",
            f"{number(v, 'items/s')} items/s" if v else "–",
            verdict(v, v and v >= 300_000),
        )
    )
    rtt = find(document, "s2-rtt-tcp")
    mine, peer = median_of(rtt, "rsnet", "p50_us"), median_of(rtt, "rsocket-py", "p50_us")
    ok = None if mine is None or peer is None else mine <= peer
    rows.append(
        (
            "2, TCP: first-item p50 <= rsocket-py request-response p50",
            f"{number(mine)} µs vs {number(peer)} µs" if ok is not None else "–",
            verdict(mine, ok),
        )
    )
    r = ratio_of(find(document, "s3-streams-tcp"), "rsocket-py")
    rows.append(
        (
            "3, TCP: many streams on one connection >= 10x rsocket-py",
            f"{r:.1f}x" if r else "–",
            verdict(r, r and r >= 10),
        )
    )
    s4 = find(document, "s4-slow-tcp")
    drift = [median_of(s4, "rsnet", k) for k in ("server_drift_mib", "client_drift_mib")]
    ok = None if None in drift else all(d < 5 for d in drift)  # type: ignore[operator]
    rows.append(
        (
            "4: flat memory (rsnet drift < 5 MiB, server and client)",
            " / ".join(f"{number(d)} MiB" for d in drift) if ok is not None else "–",
            verdict(drift[0], ok),
        )
    )
    for transport, name in (("tcp", "TCP"), ("ws", "WebSocket")):
        r = ratio_of(find(document, f"s6-js-16-{transport}"), "rsnet")
        rows.append(
            (
                f"6, {name}, 16 B: the Node client >= the Python client (issue 11)",
                f"{r:.2f}x" if r else "–",
                verdict(r, r and r >= 1),
            )
        )
    lines = ["| target (issue 6 unless said) | measured | |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return lines


def chart(document: dict[str, Any], path: str) -> bool:
    """Grouped horizontal bars of items/s (log scale) per row and system, min–max whiskers."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    entries = [e for e in document["rows"] if e["chart"]]
    systems = [s for s in SYSTEMS if any(s in e["systems"] for e in entries)]
    if not entries or not systems:
        return False
    height = 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(10, 0.62 * len(entries) + 1.6))
    for k, system in enumerate(systems):
        ys, values, low, high, tops = [], [], [], [], []
        for i, entry in enumerate(entries):
            stats = entry["systems"].get(system, {}).get("summary", {}).get("items_per_s")
            if not stats:
                continue
            ys.append(i + (k - (len(systems) - 1) / 2) * height)
            values.append(stats["median"])
            low.append(stats["median"] - stats["min"])
            high.append(stats["max"] - stats["median"])
            tops.append(stats["max"])
        ax.barh(
            ys,
            values,
            height=height,
            color=COLORS.get(system),
            label=system,
            xerr=[low, high] if any(low + high) else None,
            error_kw={"elinewidth": 0.8, "capsize": 2},
        )
        for y, v, top in zip(ys, values, tops, strict=True):
            ax.text(top * 1.08, y, number(v, "items/s"), va="center", fontsize=7)
    ax.set_yticks(range(len(entries)))
    ax.set_yticklabels([f"{e['scenario']}: {e['title']}" for e in entries], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("items/s (log scale; median, whiskers min–max)")
    meta = document["meta"]
    ax.set_title(f"rsnet vs peers, {meta['cores']} cores, {meta['python']} ({meta['date']})", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def memory_chart(document: dict[str, Any], path: str) -> bool:
    """RSS of server and client over time in the slow-consumer scenario, one line per system."""
    entry = find(document, "s4-slow-tcp")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if entry is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=False)
    drawn = False
    for side, ax in zip(("server", "client"), axes, strict=True):
        for system, record in entry["systems"].items():
            runs = [r for r in record["runs"] if "rss" in r]
            if not runs:
                continue
            samples = runs[0]["rss"].get(side, [])
            if samples:
                ax.plot(
                    [t for t, _ in samples],
                    [m for _, m in samples],
                    label=system,
                    color=COLORS.get(system),
                    linewidth=1.2,
                )
                drawn = True
        ax.set_title(f"{side} RSS, slow consumer", fontsize=10)
        ax.set_xlabel("seconds since the client started")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.25)
        ax.legend(fontsize=8)
    fig.tight_layout()
    if drawn:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def write(document: dict[str, Any], out_dir: str) -> str:
    """Write RESULTS.md (and the charts) into ``out_dir``; returns the page's path."""
    os.makedirs(out_dir, exist_ok=True)
    meta, config = document["meta"], document["config"]
    systems = [s for s in SYSTEMS if any(s in e["systems"] for e in document["rows"])]
    has_chart = chart(document, os.path.join(out_dir, CHART))
    has_memory = memory_chart(document, os.path.join(out_dir, MEMORY_CHART))
    pkgs = ", ".join(f"{k} {v}" for k, v in meta["packages"].items() if v)
    lines = [
        "# rsnet benchmark results",
        "",
        "Generated by the benchmark suite (`benchmarks/`); do not edit by hand, rerun it:",
        "",
        f"    {meta['command']}",
        "",
        f"- **Date**: {meta['date']}; whole run {document['elapsed_s']:.0f} s"
        + (
            " — **quick mode**: tiny sizes, one run; these numbers only show that the suite works"
            if config["quick"]
            else ""
        ),
        f"- **Machine**: {meta['cpu']}, {meta['cores']} cores, {meta['memory_gib']} GiB, {meta['os']};"
        f" load average at start {', '.join(map(str, meta['load_average']))} (a shared, noisy machine: read ratios)",
        f"- **Python**: {meta['python']}; {pkgs}",
        f"- **Commit**: {meta['commit'] or 'unknown'}",
        f"- **Method**: every measurement starts a fresh server process and a separate client process on"
        f" 127.0.0.1; {config['runs']} run(s) per row (scenario 4: one), taken round-robin over rows and systems;"
        f" cells show the median and (min–max); \"rsnet vs X\" is rsnet's advantage over X on the row's first"
        f" metric (rate ÷ rate, or time ÷ time inverted; above 1 is better for rsnet), computed run by run"
        f" between measurements of the same round, median (min–max). MB/s counts payload bytes only.",
        "- **Systems**: **rsnet** (this repository: `rsnet.Server`, `rsnet.connect`, `subscribe(prefetch=4096)`);"
        " **rsocket-py** (the `rsocket` package: TCP via asyncio streams, WebSocket via aiohttp;"
        " `StreamFromGenerator` with the same demand policy; its round trip is `request_response`);"
        " **ceiling** (a minimal trio program: msgpack frames packed by one reused Packer into batched"
        " 64 KiB writes, decoded by msgpack's `Unpacker`, no handshake or protocol logic, the client's"
        " whole demand granted up front); **rsnet-broker** (scenario 5: rsnet's broker, in memory and"
        " durable under each fsync policy); **rsnet-js** (scenario 6: rsnet's JavaScript client, `client/js`,"
        " in Node, `for await` over `conn.subscribe(..., {prefetch: 4096})`, against rsnet's Python server).",
        "",
    ]
    if has_chart:
        lines += [f"![throughput by scenario and system]({CHART})", ""]
    lines += ["## Targets", "", *targets(document), ""]

    def present(entries: list[dict[str, Any]]) -> list[str]:
        return [s for s in systems if any(s in e["systems"] for e in entries)]

    for scenario in (1, 2, 3):
        entries = [e for e in document["rows"] if e["scenario"] == scenario and e["systems"]]
        if entries:
            lines += [f"## {SCENARIOS[scenario]}", "", *scenario_table(entries, present(entries), config["runs"]), ""]
            lines += cpu_table(entries, present(entries))
    for entry in (e for e in document["rows"] if e["scenario"] == 4 and e["systems"]):
        lines += [
            f"## {SCENARIOS[4]}",
            "",
            f"{entry['title']}. RSS of both processes sampled every 50 ms from /proc; steady = median over"
            " the second half of the run; drift = mean of the last tenth minus the tenth at mid-run (a flat"
            " profile has drift near 0). A consumer is slow when it takes items more slowly than the system"
            " can deliver them, so rsocket-py (15-30k items/s at full speed) is paced lower, with fewer items;"
            " the demand policy is the same (prefetch 4096; the ceiling grants everything up front and"
            " relies on TCP backpressure).",
            "",
            *memory_table(entry, present([entry])),
            "",
        ]
        if has_memory:
            lines += [f"![RSS over time]({MEMORY_CHART})", ""]
    broker = document["broker"]
    lines += [f"## {SCENARIOS[5]}", ""]
    fanout = [e for e in document["rows"] if e["scenario"] == 5 and e["systems"]]
    if broker["reason"]:
        lines += [f"**Not available**: {broker['reason']}. Planned rows:", ""]
        lines += [f"- {title}" for title in broker["planned"]]
    elif not fanout:
        lines += ["Not measured in this run (see `--only` and `--systems`)."]
    else:
        lines += [
            "rsnet's broker (`rsnet.Server(host=Broker(...))`, topic defaults: backpressure, max lag 10,000)."
            " The client process opens one connection per subscriber, each subscribing from the earliest"
            " offset (prefetch 4096), and waits until the broker lists them all; then one producer on its"
            " own connection publishes N records of 16 B with `rsnet.broker.client.publish` (acknowledged"
            " once stored). Time runs from the first publish to the last record at the last subscriber;"
            " deliveries/s = records x subscribers / time, records/s = records / time; every subscriber"
            " checks it got every offset once, in order. Durable topics are segment logs on this machine's"
            " disk; a producer may have 1,024 records not yet stored, so under fsync interval (100 ms) a"
            " topic takes about 10k records/s. CPU figures are per delivery; the client's include the"
            " producer and every subscriber.",
            "",
            *scenario_table(fanout, present(fanout), config["runs"]),
            "",
            *cpu_table(fanout, present(fanout), per="delivery"),
        ]
    js = [e for e in document["rows"] if e["scenario"] == 6 and e["systems"]]
    if js:
        lines += [
            f"## {SCENARIOS[6]}",
            "",
            "The same server (rsnet's, as in scenario 1) read by the Python client (`rsnet`) and by the"
            f" JavaScript one in Node {document['meta'].get('node') or ''} (`rsnet-js`), each in its own"
            " process, one after the other in every round; neither is warmed up before the clock starts."
            " Node runs as a plain program (`node benchmarks/systems/rsnet_js.mjs`), not under `node --test`,"
            ' whose async hooks make every await 3-4x dearer. "rsnet-js vs rsnet" is the Node client\'s rate'
            " ÷ the Python client's, run by run.",
            "",
            *scenario_table(js, present(js), config["runs"]),
            "",
            *cpu_table(js, present(js)),
        ]
    lines.append("")
    failures = [
        (e["id"], s, r["error"])
        for e in document["rows"]
        for s, rec in e["systems"].items()
        for r in rec["runs"]
        if "error" in r
    ]
    missing = {
        (s, rec["reason"])
        for e in document["rows"]
        for s, rec in e["systems"].items()
        if rec["status"] == "not available"
    }
    if failures or missing:
        lines += ["## Problems in this run", ""]
        lines += [f"- {s} not available: {reason}" for s, reason in sorted(missing)]
        lines += [f"- {row} / {s}: {error}" for row, s, error in failures]
        lines.append("")
    path = os.path.join(out_dir, "RESULTS.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path
