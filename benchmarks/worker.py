"""One benchmark process: a system's server or client (see :mod:`benchmarks.systems`).

    python -m benchmarks.worker '{"system": "rsnet", "role": "server", "transport": "tcp"}'
    python -m benchmarks.worker '{"system": "rsnet", "role": "client", "transport": "tcp",
                                  "kind": "stream", "port": 4242, "params": {...}, "deadline": 60}'

A server prints ``READY <port>`` once it listens, then serves until killed. A client prints
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


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    if spec.get("exit_with_parent"):
        exit_with_parent()
    module = importlib.import_module(MODULES[spec["system"]])
    if spec["role"] == "server":

        def ready(port: int) -> None:
            print(f"READY {port}", flush=True)

        module.serve(spec["transport"], ready, **spec.get("server", {}))
        return 0
    result = module.run_client(spec["kind"], spec["transport"], spec["port"], spec["params"], spec["deadline"])
    result.update(own_usage())
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
