"""Throughput of the broker's storage engine (rsnet.broker.storage): appends, reads, reopening.

Not a test: numbers for the record, on whatever disk ``--dir`` is on.

    .venv/bin/python benchmarks/broker_storage.py [--seconds 2] [--dir /tmp]

Each append scenario appends one small record value (about 50 bytes of msgpack, as a
sensor reading) per call or 100 per call, for ``--seconds``. INTERVAL calls ``sync()`` every
100 ms, as the broker's topic writer does. Reads go through the log in batches of 256 (the
broker's read batch) and one record at a time at random offsets. Reopening is measured on a
log of ``--open-records`` (1,000,000) records in 8 MiB segments: as written (sealed segments
read from their sidecars, the active one scanned), then with the sidecars removed (every
segment scanned, the recovery speed without them).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable

from rsnet.broker.storage import FsyncPolicy, MemoryLog, Retention, SegmentLog, TopicLog


def value(i: int) -> dict:
    return {"sensor": f"s-{i % 64}", "temperature": 21.5 + (i % 10) / 10, "seq": i}


def appends(log: TopicLog, batch: int, seconds: float, sync_every: float | None = None) -> float:
    """Records appended per second."""
    records = 0
    start = last_sync = time.perf_counter()
    deadline = start + seconds
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        log.append(
            [value(records + i) for i in range(batch)],
            timestamp_ms=int(now * 1000),
            producer="bench",
            first_sequence=records,
        )
        records += batch
        if sync_every is not None and now - last_sync >= sync_every:
            log.sync()
            last_sync = now
    log.sync()
    return records / (time.perf_counter() - start)


def timed(action: Callable[[], int]) -> float:
    start = time.perf_counter()
    count = action()
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per append scenario")
    parser.add_argument("--dir", default=None, help="where to write (default: the system temp dir)")
    parser.add_argument("--open-records", type=int, default=1_000_000, help="records in the log reopened")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="rsnet-storage-bench-", dir=args.dir)
    rows: list[tuple[str, float, str]] = []
    try:
        for policy, batch in [
            (FsyncPolicy.ALWAYS, 1),
            (FsyncPolicy.ALWAYS, 100),
            (FsyncPolicy.INTERVAL, 1),
            (FsyncPolicy.INTERVAL, 100),
            (FsyncPolicy.NEVER, 1),
            (FsyncPolicy.NEVER, 100),
        ]:
            directory = os.path.join(root, f"{policy.value}-{batch}")
            log, _ = SegmentLog.open(directory, Retention(), policy)
            rate = appends(log, batch, args.seconds, 0.1 if policy is FsyncPolicy.INTERVAL else None)
            log.close()
            rows.append((f"append SegmentLog {policy.name:<8} batch {batch:>3}", rate, "records/s"))
        for batch in (1, 100):
            rows.append(
                (
                    f"append MemoryLog            batch {batch:>3}",
                    appends(MemoryLog(), batch, args.seconds),
                    "records/s",
                )
            )

        # Reads and reopening, on the log the NEVER batch-100 scenario wrote.
        directory = os.path.join(root, "never-100")
        log, _ = SegmentLog.open(directory, Retention(), FsyncPolicy.NEVER)
        total = log.next_offset
        size = log.size_bytes

        def sequential() -> int:
            offset = 0
            while offset < total:
                offset += len(log.read(offset, 256))
            return total

        def point_reads() -> int:
            rng = random.Random(7)
            for _ in range(20_000):
                log.read(rng.randrange(total), 1)
            return 20_000

        rows.append(("read sequential, batches of 256", timed(sequential), "records/s"))
        rows.append(("read one record at a random offset", timed(point_reads), "reads/s"))
        log.close()

        directory = os.path.join(root, "reopen")
        log, _ = SegmentLog.open(directory, Retention(), FsyncPolicy.NEVER, 8 << 20)
        while log.next_offset < args.open_records:
            first = log.next_offset
            log.append(
                [value(first + i) for i in range(1000)], timestamp_ms=first, producer="bench", first_sequence=first
            )
        total, size = log.next_offset, log.size_bytes
        log.close()

        def reopen() -> int:
            reopened, report = SegmentLog.open(directory, Retention(), FsyncPolicy.NEVER, 8 << 20)
            reopened.close()
            return report.records

        label = f"{total:,} records, {size / 2**20:.0f} MiB, 8 MiB segments"
        rows.append((f"reopen with sidecars, {label}", timed(reopen), "records/s"))
        for name in os.listdir(directory):
            if name.endswith(".idx"):
                os.unlink(os.path.join(directory, name))
        rows.append((f"reopen scanning all, {label}", timed(reopen), "records/s"))
    finally:
        shutil.rmtree(root)
    width = max(len(name) for name, _, _ in rows)
    for name, rate, unit in rows:
        print(f"{name:<{width}}  {rate:>12,.0f} {unit}")


if __name__ == "__main__":
    main()
