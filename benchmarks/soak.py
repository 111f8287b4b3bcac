"""Soak: a durable broker under steady load through a network that keeps cutting connections.

Not a test (it runs for minutes): the numbers for the record. Run from the repository root:

    .venv/bin/python -m benchmarks.soak [--seconds 600] [--producers 2] [--followers 4]

A real ``rsnet broker`` process (durable topics, fsync interval) runs behind a fault-injecting
proxy (tests/faults/proxy.py) that resets every connection through it every ``--cut-every``
seconds. Producers publish paced records with the idempotent producer and resume from their
last acknowledgement after each cut; followers (``rsnet.broker.client.follow``) resume after
their last offset. Every ``--sample`` seconds it prints the broker's RSS (and the part of it
in glibc's brk heap, ``[heap]`` in smaps, where allocator fragmentation shows), its open file
descriptors and each follower's lag; at the end it checks that every follower saw every record
exactly once, in order, and reports whether RSS, fds and lag stayed flat (last minute vs first).
``--pad`` sets the bytes of padding per record (64): large records mean large frames and
buffers, the allocations that fragment a heap. The broker's stderr is read throughout (a full
pipe would stall it) and its last lines are printed at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import trio

import rsnet
from rsnet.broker.client import follow, publish
from tests.faults.proxy import FaultyProxy

from .systems.common import served_port


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _heap_mib(pid: int) -> float:
    """Resident MiB of the process's brk heap (``[heap]`` in smaps): glibc's main arena."""
    resident = 0
    in_heap = False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            key = line.split(None, 1)[0]
            if not key.endswith(":"):  # a mapping's first line: addresses, permissions, ..., name
                in_heap = line.rstrip().endswith("[heap]")
            elif in_heap and key == "Rss:":
                resident += int(line.split()[1])
    return resident / 1024


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _read_stderr(broker: trio.Process, lines: collections.deque[str]) -> None:
    """Keep reading the broker's stderr (it must never block on a full pipe); keep the last lines."""
    assert broker.stderr is not None
    pending = b""
    while data := await broker.stderr.receive_some(65536):
        *whole, pending = (pending + data).split(b"\n")
        lines.extend(line.decode(errors="replace") for line in whole)


async def _start_broker(data_dir: str) -> tuple[trio.Process, int]:
    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "rsnet.cli",
            "broker",
            "--data-dir",
            data_dir,
            "--tcp",
            "127.0.0.1:0",
            "--fsync",
            "interval",
        ],
        stderr=subprocess.PIPE,
    )
    return process, await served_port(process, "broker")


async def soak(args: argparse.Namespace) -> int:
    data_dir = tempfile.mkdtemp(prefix="rsnet-soak-")
    broker, port = await _start_broker(data_dir)
    produced = [0] * args.producers
    seen: list[list[int]] = [[] for _ in range(args.followers)]
    problems: list[str] = []
    samples: list[dict] = []
    log_lines: collections.deque[str] = collections.deque(maxlen=20)
    pad = "x" * args.pad
    started = time.monotonic()
    deadline = started + args.seconds

    async with trio.open_nursery() as nursery, FaultyProxy(port) as proxy:

        async def produce(index: int) -> None:
            topic, producer = f"soak.t{index}", f"soak-producer-{index}"
            sequence = 0

            async def paced(start: int):
                for value in range(start, 10**12):
                    if time.monotonic() >= deadline:
                        return
                    yield {"n": value, "pad": pad}
                    produced[index] = max(produced[index], value + 1)  # a resume may go back
                    if value % 50 == 0:
                        await trio.sleep(50 / args.rate)

            while time.monotonic() < deadline:
                try:
                    async with rsnet.connect(proxy.url) as conn:
                        async with conn.subscribe("$acks", {"producer": producer, "topic": topic}) as acks:
                            with trio.move_on_after(0.05):
                                sequence = (await acks.__anext__())["sequence"] + 1
                        await publish(conn, topic, paced(sequence), producer=producer, first_sequence=sequence)
                        return
                except rsnet.ConnectionLost:
                    await trio.sleep(0.05)

        async def consume(index: int) -> None:
            topic = f"soak.t{index % args.producers}"
            records = follow(proxy.url, topic, start="earliest", retry_delay=0.05)
            async with contextlib.aclosing(records) as items:
                async for record in items:
                    seen[index].append(record["value"]["n"])

        async def cut() -> None:
            while True:
                await trio.sleep(args.cut_every)
                proxy.reset_all()

        for index in range(args.producers):
            nursery.start_soon(produce, index)
        for index in range(args.followers):
            nursery.start_soon(consume, index)
        nursery.start_soon(cut)
        nursery.start_soon(_read_stderr, broker, log_lines)
        while time.monotonic() < deadline + 5:
            await trio.sleep(args.sample)
            lag = [produced[i % args.producers] - len(seen[i]) for i in range(args.followers)]
            sample = {
                "t": round(time.monotonic() - started),
                "rss_mib": round(_rss_mib(broker.pid), 1),
                "heap_mib": round(_heap_mib(broker.pid), 1),
                "fds": _fds(broker.pid),
                "produced": sum(produced),
                "max_lag": max(lag),
                "cuts": proxy.resets,
            }
            samples.append(sample)
            print(json.dumps(sample), flush=True)
        nursery.cancel_scope.cancel()

    broker.terminate()
    await broker.wait()
    shutil.rmtree(data_dir, ignore_errors=True)  # hundreds of MB after ten minutes
    for index, values in enumerate(seen):
        total = produced[index % args.producers]
        if values != list(range(len(values))) or len(values) < total:
            problems.append(
                f"follower {index}: {len(values)} of {total} records, in order: {values == list(range(len(values)))}"
            )
    minute = max(1, int(60 / args.sample))
    first, last = samples[:minute], samples[-minute:]
    summary = {
        "seconds": args.seconds,
        "records": sum(produced),
        "cuts": samples[-1]["cuts"],
        "rss_mib_first_minute": max(s["rss_mib"] for s in first),
        "rss_mib_last_minute": max(s["rss_mib"] for s in last),
        "heap_mib_first_minute": max(s["heap_mib"] for s in first),
        "heap_mib_last_minute": max(s["heap_mib"] for s in last),
        "fds_first_minute": max(s["fds"] for s in first),
        "fds_last_minute": max(s["fds"] for s in last),
        "max_lag_first_minute": max(s["max_lag"] for s in first),
        "max_lag_last_minute": max(s["max_lag"] for s in last),
        "exactly_once_in_order": not problems,
    }
    print(json.dumps(summary, indent=1))
    for line in log_lines:
        print("broker:", line, file=sys.stderr)
    for problem in problems:
        print("PROBLEM:", problem, file=sys.stderr)
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--followers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=2000, help="records/s per producer")
    parser.add_argument("--pad", type=int, default=64, help="bytes of padding in each record")
    parser.add_argument("--cut-every", type=float, default=2.0, help="seconds between connection resets")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    return trio.run(soak, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
