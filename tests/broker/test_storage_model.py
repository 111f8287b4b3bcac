"""Both logs against a plain list, under random appends, retries, reads, retention, purges,
advances (a topic created again after a delete) and reopening.

The model is every record ever appended (index = offset) and each producer's highest sequence.
MemoryLog must match it exactly; SegmentLog must match it record for record, retaining at
least what MemoryLog retains (it drops whole segments). Timestamps wander backwards too.
Retention here is by count and age; bytes are covered in test_storage.py.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rsnet.broker.storage import (
    FsyncPolicy,
    MemoryLog,
    OffsetBeyondEnd,
    OffsetTrimmed,
    Retention,
    SegmentLog,
    TopicLog,
    segment_file,
)

PRODUCERS = st.sampled_from([None, "a", "b"])
VALUES = st.lists(
    st.one_of(st.integers(-5, 5), st.text(max_size=8), st.lists(st.integers(0, 3), max_size=3)), max_size=6
)


class Logs(RuleBasedStateMachine):
    @initialize(
        max_records=st.one_of(st.none(), st.integers(1, 25)),
        max_age_ms=st.one_of(st.none(), st.integers(1, 60)),
        fsync=st.sampled_from(FsyncPolicy),
        segment_bytes=st.sampled_from([64, 200, 1000]),
    )
    def open_logs(
        self, max_records: int | None, max_age_ms: int | None, fsync: FsyncPolicy, segment_bytes: int
    ) -> None:
        self.retention = Retention(max_records=max_records, max_age_ms=max_age_ms)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.directory = tempfile.mkdtemp(prefix="rsnet-storage-model-")
        # An index entry every few records, so segments this small still have several.
        self.index_interval, segment_file.INDEX_INTERVAL_BYTES = segment_file.INDEX_INTERVAL_BYTES, 40
        self.memory = MemoryLog(self.retention)
        self.segments = self.open_segments()
        self.records: list[tuple[Any, int, str | None, int | None]] = []  # value, timestamp, producer, sequence
        self.highest: dict[str, int] = {}
        self.now = 1000

    def open_segments(self) -> SegmentLog:
        log, report = SegmentLog.open(self.directory, self.retention, self.fsync, self.segment_bytes)
        assert report.clean, report.damaged
        return log

    def teardown(self) -> None:
        if hasattr(self, "directory"):
            self.memory.close()
            self.segments.close()
            shutil.rmtree(self.directory)
            segment_file.INDEX_INTERVAL_BYTES = self.index_interval

    def logs(self) -> list[TopicLog]:
        return [self.memory, self.segments]

    # -- rules ------------------------------------------------------------------------------------

    @rule(values=VALUES, producer=PRODUCERS, back=st.integers(-3, 3), clock=st.integers(-10, 10))
    def append(self, values: list[Any], producer: str | None, back: int, clock: int) -> None:
        self.now += clock
        first_sequence = None
        if producer is not None:
            first_sequence = max(0, self.highest.get(producer, -1) + 1 - back)  # back > 0: a retry
        expected: list[int | None] = []
        for index, value in enumerate(values):
            sequence = None if first_sequence is None else first_sequence + index
            if sequence is not None and sequence <= self.highest.get(producer, -1):  # type: ignore[arg-type]
                expected.append(None)
            else:
                expected.append(len(self.records))
                self.records.append((value, self.now, producer, sequence))
        if first_sequence is not None and values:
            self.highest[producer] = max(self.highest.get(producer, -1), first_sequence + len(values) - 1)  # type: ignore[index]
        for log in self.logs():
            assert (
                log.append(values, timestamp_ms=self.now, producer=producer, first_sequence=first_sequence) == expected
            )

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(max(0, self.segments.first_offset - 2), len(self.records) + 1))
        count = data.draw(st.integers(0, 12))
        for log in self.logs():
            if offset < log.first_offset:
                try:
                    log.read(offset, count)
                except OffsetTrimmed as trimmed:
                    assert trimmed.first_available == log.first_offset
                else:
                    raise AssertionError("no OffsetTrimmed")
            elif offset > log.next_offset:
                try:
                    log.read(offset, count)
                except OffsetBeyondEnd:
                    pass
                else:
                    raise AssertionError("no OffsetBeyondEnd")
            else:
                got = [(r.offset, r.value, r.timestamp_ms, r.producer, r.sequence) for r in log.read(offset, count)]
                want = [(o, *self.records[o]) for o in range(offset, min(offset + count, len(self.records)))]
                assert got == want

    @rule(data=st.data())
    def offset_for_timestamp(self, data: st.DataObject) -> None:
        t = data.draw(st.integers(self.now - 40, self.now + 3))
        for log in self.logs():
            want = next(
                (o for o in range(log.first_offset, len(self.records)) if self.records[o][1] >= t), len(self.records)
            )
            assert log.offset_for_timestamp(t) == want

    @rule(advance=st.integers(0, 40))
    def enforce_retention(self, advance: int) -> None:
        self.now += advance
        first = self.memory.first_offset
        expected = first
        if self.retention.max_records is not None:
            expected = max(expected, len(self.records) - self.retention.max_records)
        if self.retention.max_age_ms is not None:
            cutoff = self.now - self.retention.max_age_ms
            young = next(
                (o for o in range(first, len(self.records)) if self.records[o][1] >= cutoff), len(self.records)
            )
            expected = max(expected, young)
        assert self.memory.enforce_retention(self.now) == expected - first
        assert self.memory.first_offset == expected
        before = self.segments.first_offset
        assert self.segments.enforce_retention(self.now) == self.segments.first_offset - before

    @rule()
    def drop_all(self) -> None:
        # A purge: empty at the same next offset (the model's records keep their offsets).
        for log in self.logs():
            before = log.first_offset
            assert log.drop_all() == log.next_offset - before
            assert log.first_offset == log.next_offset == len(self.records)

    @precondition(lambda self: all(log.first_offset == log.next_offset for log in (self.memory, self.segments)))
    @rule(by=st.integers(1, 5))
    def advance(self, by: int) -> None:
        # A topic created again after a delete: the empty log goes on from the deleted one's
        # next offset, as if records up to it had been removed (never read: none is retained).
        self.records.extend([(None, self.now, None, None)] * by)
        for log in self.logs():
            log.advance(len(self.records))
            assert log.first_offset == log.next_offset == len(self.records)

    @rule()
    def sync(self) -> None:
        for log in self.logs():
            log.sync()
            assert log.durable_offset == log.next_offset

    @rule()
    def reopen(self) -> None:
        before = (self.segments.first_offset, self.segments.next_offset, self.segments.size_bytes)
        self.segments.close()
        self.segments = self.open_segments()
        assert (self.segments.first_offset, self.segments.next_offset, self.segments.size_bytes) == before

    @precondition(lambda self: hasattr(self, "records"))
    @invariant()
    def agree_with_the_model(self) -> None:
        for log in self.logs():
            assert log.next_offset == len(self.records)
            assert log.first_offset <= log.next_offset
            for producer in ("a", "b"):
                assert log.last_sequence(producer) == self.highest.get(producer)
            if self.fsync is FsyncPolicy.INTERVAL and log is self.segments:
                assert log.durable_offset <= log.next_offset
            else:
                assert log.durable_offset == log.next_offset
        assert self.segments.first_offset <= self.memory.first_offset


Logs.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_logs_agree_with_the_model = Logs.TestCase
