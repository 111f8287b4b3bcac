"""One benchmark process: a system's server or client (see :mod:`benchmarks.systems`).

    python -m benchmarks.worker '{"system": "rsnet", "role": "server", "transport": "tcp"}'
    python -m benchmarks.worker '{"system": "rsnet", "role": "client", "transport": "tcp",
                                  "kind": "stream", "port": 4242, "params": {...}, "deadline": 60}'

A server prints ``READY <port>`` once it listens, then serves until killed. A client prints
``RESULT <json>`` (its measurement plus its own CPU time and peak RSS) and exits 0, or prints
the error to stderr and exits 1. The runner (:mod:`benchmarks.runner`) reads these lines.
"""

from __future__ import annotations

import importlib
import json
import sys

from .systems import MODULES
from .systems.common import own_usage


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
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
