"""SIGKILL mid-stream under FsyncPolicy.ALWAYS: every acknowledged record survives, in order, once.

A child process appends batches as an idempotent producer and prints each record's sequence
and offset once ``append`` has returned (its acknowledgement). The test kills it with SIGKILL
while it writes, reopens the log, and checks the acknowledged records. Then it starts a new
child that resends from the first unacknowledged sequence, as a producer retrying would:
records stored but not acknowledged before the kill come back as duplicates (offset None)
and must not be stored twice. Where the kill lands differs from run to run; the checks hold
wherever it lands.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys

from rsnet.broker.storage import FsyncPolicy, Retention, SegmentLog

WRITER = """
import sys
from rsnet.broker.storage import FsyncPolicy, Retention, SegmentLog

directory, sequence = sys.argv[1], int(sys.argv[2])
log, report = SegmentLog.open(directory, Retention(), FsyncPolicy.ALWAYS, 8192)
size = 1
while True:
    batch = range(sequence, sequence + size)
    offsets = log.append(
        [{"seq": s, "pad": "x" * 300} for s in batch], timestamp_ms=sequence, producer="writer", first_sequence=sequence
    )
    sys.stdout.write("".join(f"{s} {o}\\n" for s, o in zip(batch, offsets)))
    sys.stdout.flush()
    sequence += size
    size = size % 7 + 1
"""

ROUNDS = 4
ACKS_BEFORE_KILL = 120


def run_and_kill(directory: pathlib.Path, first_sequence: int) -> dict[int, int | None]:
    """Acknowledged sequences of one child's life, with their offsets (None: duplicate)."""
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(first_sequence)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    acked: dict[int, int | None] = {}
    try:
        assert child.stdout is not None
        while len(acked) < ACKS_BEFORE_KILL:
            line = child.stdout.readline()
            assert line.endswith(b"\n"), f"writer ended: {child.stderr.read()!r}"  # type: ignore[union-attr]
            sequence, offset = line.split()
            acked[int(sequence)] = None if offset == b"None" else int(offset)
        child.send_signal(signal.SIGKILL)
        rest = child.stdout.read()
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    for line in rest.split(b"\n")[:-1]:  # printed before the kill: acknowledged too (a cut last line is not)
        sequence, offset = line.split()
        acked[int(sequence)] = None if offset == b"None" else int(offset)
    return acked


def test_every_acknowledged_record_survives_sigkill_in_order_exactly_once(tmp_path: pathlib.Path) -> None:
    acknowledged: dict[int, int] = {}  # sequence -> offset
    resend_from = 0
    duplicates_seen = 0
    for _ in range(ROUNDS):
        acked = run_and_kill(tmp_path, resend_from)
        duplicates_seen += sum(offset is None for offset in acked.values())
        for sequence, offset in acked.items():
            if offset is not None:
                assert sequence not in acknowledged, "a sequence was stored twice"
                acknowledged[sequence] = offset
        resend_from = max(acked) + 1

        log, report = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.ALWAYS, 8192)
        with log:
            records = log.read(0, 10**6)
            sequences = [record.value["seq"] for record in records]
            # In order, once each, no gap: the log holds sequences 0, 1, 2, ... at offsets 0, 1, 2, ...
            assert sequences == list(range(len(records)))
            assert [record.offset for record in records] == list(range(len(records)))
            assert [record.sequence for record in records] == sequences
            # Every acknowledged record is there, at the offset it was acknowledged with.
            assert max(acked) < len(records)
            for sequence, offset in acknowledged.items():
                assert records[offset].value["seq"] == sequence
            # Anything recovery cut was never acknowledged: at most the batch being written.
            assert report.truncated_bytes < 8 * 400, report.damaged
            assert log.last_sequence("writer") == len(records) - 1
    assert len(acknowledged) + duplicates_seen >= ROUNDS * ACKS_BEFORE_KILL
