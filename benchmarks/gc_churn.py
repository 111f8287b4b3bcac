"""GC churn: does a served process's memory stay flat while connections come and go and the
application leaves reference cycles behind? (The check for ``rsnet/net/gc_tuning.py``.)

Not a test (it runs for a minute or more): numbers for the record. From the repository root:

    .venv/bin/python -m benchmarks.gc_churn [--seconds 60] [--connections 500] [--collector tuned]

A real ``rsnet serve`` process hosts :data:`server` (below). Its ``churn`` publisher makes cyclic
garbage on purpose, as applications do (an exception with its traceback, objects that point at
each other): every stream holds a 4 KiB cycle for its whole life, which becomes garbage when it
ends, and every item leaves a small cycle behind. This process keeps ``--connections``
connections busy; each one opens a stream of a random length and lifetime, then ends it one of
three ways (read to the end; cancel it part-way; or the connection is reset, with no goodbye),
and reconnects. Every ``--sample`` seconds it prints the server's RSS and CPU time and the
connections made so far; at the end, the RSS of the first and last tenth of the run.

``--collector``: ``tuned`` is ``rsnet serve`` as shipped (it calls
:func:`rsnet.net.gc_tuning.tune_for_serving`); ``defaults`` runs the same command with CPython's
own settings; ``off`` with the collector disabled, which shows that the garbage is real (its RSS
keeps growing).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import socket
import struct
import subprocess
import sys
import time
from typing import Any

import trio

import rsnet

from .systems.common import served_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# -- the served application -------------------------------------------------------------------------

server = rsnet.Server()


@server.publisher("churn")
def churn(params: dict[str, Any], ctx: rsnet.StreamContext) -> rsnet.Publisher[int]:
    """``count`` items, ``interval`` seconds apart (in batches of 10), leaving cycles behind."""
    held: dict[str, Any] = {"pad": bytes(4096)}
    held["self"] = held  # garbage once the stream ends, however it ends

    async def items():
        for i in range(params["count"]):
            node: dict[str, Any] = {"i": i, "held": held}
            node["self"] = node  # garbage as soon as the item is sent
            yield i
            if i % 10 == 9:
                await trio.sleep(params["interval"])

    return rsnet.from_async_iterable(items, nursery=ctx.nursery)


# -- the server process ----------------------------------------------------------------------------

LAUNCH = """
import gc, sys
import rsnet.net.gc_tuning as tuning
mode = sys.argv[1]
if mode != "tuned":
    tuning.tune_for_serving = lambda: None  # before rsnet.cli.serve imports it
if mode == "off":
    gc.disable()
from rsnet.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _start_server(collector: str) -> tuple[trio.Process, int]:
    command = [sys.executable, "-c", LAUNCH, collector, "serve", "benchmarks.gc_churn:server"]
    process = await trio.lowlevel.open_process(
        [*command, "--tcp", "127.0.0.1:0", "--app-dir", ROOT], stderr=subprocess.PIPE, cwd=ROOT
    )
    return process, await served_port(process, "server")


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    """Keep reading the server's stderr: a full pipe would stall it."""
    while await stream.receive_some(65536):
        pass


# -- the clients -----------------------------------------------------------------------------------


async def _one_connection(port: int, rng: random.Random, counts: dict[str, int]) -> None:
    """One stream of a random length and pace, ended one of three ways."""
    count, interval = rng.randint(10, 400), rng.choice([0.0, 0.005, 0.02])
    ending = rng.choices(["complete", "cancel", "reset"], weights=[6, 2, 2])[0]
    stop_after = rng.randint(1, count) if ending != "complete" else count
    with trio.CancelScope() as connection:
        async with rsnet.connect(f"tcp://127.0.0.1:{port}") as conn:
            received = 0
            async with conn.subscribe("churn", {"count": count, "interval": interval}, prefetch=64) as stream:
                async for _ in stream:
                    received += 1
                    if received == stop_after and ending == "cancel":
                        break
                    if received == stop_after and ending == "reset":
                        # No goodbye: closed while cancelled, with linger 0, the socket sends an
                        # RST and the server finds its connection broken mid-stream.
                        sock = conn._session.transport._stream.socket  # a TcpTransport's socket
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        connection.cancel()
                        await trio.lowlevel.checkpoint()
    counts[ending] += 1


async def churn_run(args: argparse.Namespace) -> int:
    process, port = await _start_server(args.collector)
    counts = {"complete": 0, "cancel": 0, "reset": 0, "failed": 0}
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    deadline = started + args.seconds
    cpu0 = _cpu_s(process.pid)

    async def slot(index: int) -> None:
        rng = random.Random(index)
        while time.monotonic() < deadline:
            try:
                await _one_connection(port, rng, counts)
            except (rsnet.RsnetError, OSError):
                counts["failed"] += 1

    async with trio.open_nursery() as nursery:
        assert process.stderr is not None
        nursery.start_soon(_drain, process.stderr)
        for index in range(args.connections):
            nursery.start_soon(slot, index)
        while time.monotonic() < deadline:
            await trio.sleep(args.sample)
            sample = {
                "t": round(time.monotonic() - started, 1),
                "rss_mib": round(_rss_mib(process.pid), 1),
                "cpu_s": round(_cpu_s(process.pid) - cpu0, 2),
                **counts,
            }
            samples.append(sample)
            print(json.dumps(sample), flush=True)
        nursery.cancel_scope.cancel()
    process.kill()
    await process.wait()
    tenth = max(1, len(samples) // 10)
    connections = sum(counts[k] for k in ("complete", "cancel", "reset"))
    summary = {
        "collector": args.collector,
        "seconds": args.seconds,
        "connections": connections,
        "failed": counts["failed"],
        "server_cpu_s": samples[-1]["cpu_s"],
        "server_cpu_us_per_connection": round(samples[-1]["cpu_s"] / max(1, connections) * 1e6),
        "rss_mib_first_tenth": max(s["rss_mib"] for s in samples[:tenth]),
        "rss_mib_last_tenth": max(s["rss_mib"] for s in samples[-tenth:]),
        "rss_mib_max": max(s["rss_mib"] for s in samples),
    }
    print(json.dumps(summary, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--connections", type=int, default=500, help="connections kept busy at once")
    parser.add_argument("--collector", choices=["tuned", "defaults", "off"], default="tuned")
    parser.add_argument("--sample", type=float, default=2.0, help="seconds between samples")
    args = parser.parse_args()
    gc.freeze()  # this client's own collector is not what is measured: keep it cheap
    return trio.run(churn_run, args)


if __name__ == "__main__":
    sys.exit(main())
