"""Peak client memory of a slow consumer of 1 MiB items, by demand policy (issue 13, target 2).

    python -m benchmarks.demand_memory [--count 300] [--per-item 0.02] [none 256 ...]

For each policy (``none``: rsnet's default, adaptive demand; a number: a fixed ``prefetch``),
a fresh client process takes ``count`` items of 1 MiB less 64 bytes from an rsnet server
(:mod:`benchmarks.systems.rsnet_system`, its own process), sleeping ``per_item`` seconds after
each, and reports its peak RSS (``ru_maxrss``) before and after. A fast consumer holds few items
whatever its window; a slow one holds its whole window, which is what the byte budget bounds.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from typing import Any

ITEM = 1024 * 1024 - 64
"""A "1 MiB" item: as large as fits one frame under the default max_frame_size."""


def client(port: int, prefetch: int | None, count: int, per_item: float) -> dict[str, Any]:
    import trio

    import rsnet

    async def main() -> dict[str, Any]:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        taken = 0
        async with rsnet.connect(f"tcp://127.0.0.1:{port}") as conn:
            async for _ in conn.subscribe("items", {"count": count, "size": ITEM}, prefetch=prefetch):
                taken += 1
                await trio.sleep(per_item)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {"items": taken, "rss_before_mib": round(before, 1), "peak_rss_mib": round(peak, 1)}

    return trio.run(main)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demand_memory", description=__doc__.split("\n")[0])
    parser.add_argument("policies", nargs="*", default=["none", "256"], help="none (adaptive) or a prefetch")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--per-item", type=float, default=0.02, help="seconds the consumer spends per item")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # internal: run one client
    args = parser.parse_args(argv)
    if args.client:
        port, prefetch = json.loads(args.client)
        print(json.dumps(client(port, prefetch, args.count, args.per_item)))
        return 0
    spec = json.dumps({"system": "rsnet", "role": "server", "transport": "tcp"})
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.worker", spec], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        for policy in args.policies:
            prefetch = None if policy == "none" else int(policy)
            command = [sys.executable, "-m", "benchmarks.demand_memory", "--client", json.dumps([port, prefetch])]
            command += ["--count", str(args.count), "--per-item", str(args.per_item)]
            result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
            name = "default (adaptive)" if prefetch is None else f"prefetch={prefetch}"
            print(
                f"{name:20s} {result['items']} items of 1 MiB: peak RSS {result['peak_rss_mib']} MiB"
                f" (before streaming {result['rss_before_mib']} MiB)"
            )
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
