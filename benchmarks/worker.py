"""One benchmark process: a system's server or client (see :mod:`benchmarks.systems`).

    python -m benchmarks.worker '{"system": "rsnet", "role": "server", "transport": "tcp"}'
    python -m benchmarks.worker '{"system": "rsnet", "role": "client", "transport": "tcp",
                                  "kind": "stream", "port": 4242, "params": {...}, "deadline": 60}'

A server prints ``READY <port>`` (or ``READY <port> <pid>`` when the server proper is a child
process of the worker, as ``nats-server`` is) once it listens, then serves until killed. A client prints
``RESULT <json>`` (its measurement plus its own CPU time and peak RSS) and exits 0, or prints
the error to stderr and exits 1. The runner (:mod:`benchmarks.runner`) reads these lines.

The runner holds the worker's stdin open and never writes to it: end of file there means the
runner is gone (even killed with SIGKILL, when its own clean-up cannot run), and the worker
removes its scratch directory (``$RSNET_BENCH_SCRATCH``, if any) and exits at once, so no server
outlives the suite.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import threading

from .systems import MODULES
from .systems.common import own_usage


def exit_with_parent() -> None:
    """Exit as soon as stdin reaches end of file (the runner died or closed it)."""

    def watch() -> None:
        try:
            sys.stdin.buffer.read()
        except (OSError, ValueError):
            pass
        scratch = os.environ.get("RSNET_BENCH_SCRATCH")
        if scratch:  # the runner would have removed it
            shutil.rmtree(scratch, ignore_errors=True)
        os._exit(3)

    if sys.stdin is not None and not sys.stdin.isatty():
        threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


TRACED_FILE = "tracemalloc"
"""Where (in ``$RSNET_BENCH_SCRATCH``) a traced server answers SIGUSR1, one JSON line each."""
TRACED_TOP = 12
"""Allocation sites listed per answer: those that grew most since the previous one."""


def trace_on_signal() -> None:
    """Trace this server's Python allocations; on SIGUSR1 append a JSON line to
    ``$RSNET_BENCH_SCRATCH/tracemalloc``: ``{"traced": bytes, "top": [[site, bytes, count], ...]}``,
    ``top`` being the allocation sites that grew most since the previous SIGUSR1 (the
    connections-at-scale client asks before and after it opens its connections). Tracing slows
    the server: only rows that ask for it trace."""
    import signal
    import tracemalloc

    tracemalloc.start()
    path = os.path.join(os.environ["RSNET_BENCH_SCRATCH"], TRACED_FILE)
    previous: list[tracemalloc.Snapshot] = []
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]

    def report(signum: int, frame: object) -> None:
        snapshot = tracemalloc.take_snapshot().filter_traces(ignore)
        top = []
        if previous:
            for stat in snapshot.compare_to(previous[0], "lineno")[:TRACED_TOP]:
                where = stat.traceback[0]
                site = f"{os.path.relpath(where.filename)}:{where.lineno}"
                top.append([site, stat.size_diff, stat.count_diff])
        previous[:] = [snapshot]
        with open(path, "a") as f:
            f.write(json.dumps({"traced": tracemalloc.get_traced_memory()[0], "top": top}) + "\n")

    signal.signal(signal.SIGUSR1, report)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    if spec.get("exit_with_parent"):
        exit_with_parent()
    module = importlib.import_module(MODULES[spec["system"]])
    if spec["role"] == "server":

        def ready(port: int, pid: int | None = None) -> None:
            # A server that runs in a child process (nats-server) names it: its pid is sampled.
            print(f"READY {port}" + (f" {pid}" if pid else ""), flush=True)

        server_params = dict(spec.get("server", {}))
        if server_params.pop("tracemalloc", False):
            trace_on_signal()
        module.serve(spec["transport"], ready, **server_params)
        return 0
    # The server's pid and scratch directory ride along with the row's parameters (only the
    # connections-at-scale kind reads them: it samples the server's memory itself).
    params = {**spec["params"], "server_pid": spec.get("server_pid"), "server_scratch": spec.get("server_scratch")}
    result = module.run_client(spec["kind"], spec["transport"], spec["port"], params, spec["deadline"])
    result.update(own_usage())
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
