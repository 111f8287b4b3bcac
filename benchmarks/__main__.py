"""Command line: ``python -m benchmarks run [--quick] [--json out.json]``, ``python -m benchmarks report``,
``python -m benchmarks spark [--records N]`` (the Spark scenario, see ``benchmarks/spark.py``).

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

from . import machine, report, scenarios, suite
from .runner import kill_all
from .systems import SYSTEMS

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["spark"]:  # needs pyspark and Java: its own module, loaded only here
        from . import spark

        return spark.main(given[1:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
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
    args = parser.parse_args(argv)

    if args.command == "report":
        with open(args.json) as f:
            document = json.load(f)
        print(report.write(document, args.out))
        return 0

    runs = args.runs or (1 if args.quick else 5)
    rows = [r for r in scenarios.build(args.quick) if not args.only or r.id.startswith(tuple(args.only))]
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


if __name__ == "__main__":
    sys.exit(main())
