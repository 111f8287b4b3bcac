"""Command line: ``python -m benchmarks run [--quick] [--json out.json]``, ``python -m benchmarks report``,
``python -m benchmarks profile ROW [--system S]`` (a flame graph of the server, see :func:`profile`),
``python -m benchmarks spark [--records N]`` (the Spark scenario, see ``benchmarks/spark.py``),
``python -m benchmarks round-trip`` (a round trip's legs, see ``benchmarks/round_trip.py``).

``run`` measures and writes ``RESULTS.md`` plus charts into ``--out`` (default: ``benchmarks/``
for a full run; for ``--quick`` a scratch directory, so a quick run never overwrites the
committed results). It exits 1 if any measurement of an available system failed, 0 otherwise:
a system or scenario that does not exist yet is reported "not available", not failed.
Timings are never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time

from . import machine, report, runner, scenarios, suite
from .runner import kill_all
from .systems import SYSTEMS

HERE = os.path.dirname(os.path.abspath(__file__))
FLAMEGRAPHS = os.path.join(HERE, "flamegraphs")


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["spark"]:  # needs pyspark and Java: its own module, loaded only here
        from . import spark

        return spark.main(given[1:])
    if given[:1] == ["round-trip"]:
        from . import round_trip

        return round_trip.main(given[1:])
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.splitlines()[0],
        epilog="Also: 'python -m benchmarks spark --help' (the Spark connector against Spark's file "
        "source; needs pyspark and Java 17) and 'python -m benchmarks round-trip --help' (where a "
        "round trip's time goes).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="measure every scenario on every system")
    run.add_argument("--quick", action="store_true", help="tiny sizes, one run: checks the suite works")
    run.add_argument("--json", metavar="PATH", help="also save every number measured as JSON")
    run.add_argument("--runs", type=int, help="runs per row (default 5; --quick: 1)")
    run.add_argument("--out", metavar="DIR", help="where RESULTS.md and the charts go")
    run.add_argument(
        "--only",
        nargs="+",
        metavar="ROW",
        default=[],
        help="rows whose id starts with one of these (e.g. s1 s3-streams-tcp s5-memory)",
    )
    run.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    again = commands.add_parser("report", help="rewrite RESULTS.md and charts from a saved --json")
    again.add_argument("json", metavar="PATH")
    again.add_argument("--out", metavar="DIR", default=HERE)
    flame = commands.add_parser(
        "profile",
        help="measure one row once with py-spy recording the server: a flame graph (SVG)",
        description=profile.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flame.add_argument("row", metavar="ROW", help="a row id, e.g. s1-16-tcp, s5-memory-100, s8-live-10000")
    flame.add_argument("--system", default=None, help="which system of the row (default: rsnet's)")
    flame.add_argument("--quick", action="store_true", help="the row's --quick sizes")
    flame.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default 250)")
    flame.add_argument("--out", metavar="SVG", help=f"where the SVG goes (default {FLAMEGRAPHS}/ROW-SYSTEM.svg)")
    args = parser.parse_args(argv)

    if args.command == "profile":
        return profile(args.row, args.system, args.quick, args.rate, args.out)
    if args.command == "report":
        with open(args.json) as f:
            document = json.load(f)
        print(report.write(document, args.out))
        return 0

    runs = args.runs or (1 if args.quick else 5)
    rows = scenarios.select(scenarios.build(args.quick), args.only)
    out = args.out or (os.path.join(tempfile.gettempdir(), "rsnet-bench-quick") if args.quick else HERE)
    command = "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    started = time.monotonic()
    document = {
        "meta": machine.describe(command),
        "config": {"quick": args.quick, "runs": runs, "systems": args.systems, "only": args.only},
    }
    try:
        document.update(suite.run_suite(rows, runs, tuple(args.systems), suite.print_progress))
    finally:
        kill_all()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)
    page = report.write(document, out)
    failed = [
        (e["id"], s)
        for e in document["rows"]
        for s, rec in e["systems"].items()
        if rec["status"] in ("failed", "partly failed")
    ]
    print(
        f"wrote {page} in {time.monotonic() - started:.1f} s"
        + (f"; FAILED: {', '.join(f'{r}/{s}' for r, s in failed)}" if failed else ""),
        file=sys.stderr,
    )
    return 1 if failed else 0


def profile(row_id: str, system: str | None, quick: bool, rate: int, out: str | None) -> int:
    """Measure one row once, for one system, while py-spy records the server process.

    The flame graph (SVG, py-spy's ``--format flamegraph``) covers the client's run, not the
    server's start-up: open it in a browser, the widest frames are where the server's CPU went.
    It goes to ``benchmarks/flamegraphs/ROW-SYSTEM.svg`` unless ``--out`` says otherwise; attach
    it to the change that touched the hot path. py-spy samples at ``--rate`` Hz, which costs the
    server a little: the numbers printed are for orientation, not for RESULTS.md. Only Python
    servers can be recorded (not JetStream's nats-server).
    """
    rows = {r.id: r for r in scenarios.build(quick)}
    row = rows.get(row_id)
    if row is None:
        close = [r for r in rows if r.startswith(row_id)]
        print(f"no row {row_id!r}" + (f"; did you mean {', '.join(close)}?" if close else f"; rows: {', '.join(rows)}"))
        return 2
    system = system or next((s for s in ("rsnet", "rsnet-broker") if s in row.systems), row.systems[0])
    if system not in row.systems:
        print(f"row {row_id} measures {', '.join(row.systems)}, not {system}")
        return 2
    if system == "jetstream":
        print("py-spy records Python processes; JetStream's server is nats-server (Go)")
        return 2
    path = out or os.path.join(FLAMEGRAPHS, f"{row.id}-{system}.svg")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    params = row.params_for(system)
    try:
        if row.rate_from is not None:
            source = rows[row.rate_from[0]]
            pacer = row.rate_system or system
            print(f"measuring {source.id} ({pacer}) first: {row.id} runs at {row.rate_from[1]:g} of its rate")
            source_params = source.params_for(pacer)
            first = runner.measure(
                pacer, source.transport, source.kind, source_params, source.timeout, source.server_params
            )
            reached = scenarios.metrics_of(source, first.result, first.rss, source_params, first.server_cpu_s)
            params = {**params, "rate": reached[source.primary.key] * row.rate_from[1]}
        m = runner.measure(
            system, row.transport, row.kind, params, row.timeout, row.server_params, profile=path, profile_rate=rate
        )
    except runner.MeasurementError as error:
        print(f"FAILED: {error}", file=sys.stderr)
        return 1
    finally:
        kill_all()
    metrics = scenarios.metrics_of(row, m.result, m.rss, params, m.server_cpu_s)
    shown = ", ".join(
        f"{k.label} {report.number(metrics[k.key], k.unit)} {k.unit}" for k in row.metrics if k.key in metrics
    )
    print(f"{row.id} / {system} (under py-spy at {rate} Hz): {shown}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
