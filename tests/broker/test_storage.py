"""The TopicLog contract, checked on both logs: offsets, reads, idempotent producers, timestamps, retention.

What only a durable log does (files, rolling, reopening, recovery) is in the other
``test_storage_*`` files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from rsnet.broker.storage import (
    FsyncPolicy,
    MemoryLog,
    OffsetBeyondEnd,
    OffsetTrimmed,
    Record,
    Retention,
    SegmentLog,
    StorageError,
    TopicLog,
)

MakeLog = Callable[..., TopicLog]


@pytest.fixture(params=["memory", "segments"])
def make_log(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """Opens a fresh log of the parametrized kind; segments are small so tests cross them."""
    logs: list[TopicLog] = []

    def make(retention: Retention | None = None, segment_bytes: int = 512) -> TopicLog:
        if request.param == "memory":
            log: TopicLog = MemoryLog(retention or Retention())
        else:
            log, report = SegmentLog.open(
                tmp_path / f"topic{len(logs)}", retention or Retention(), FsyncPolicy.ALWAYS, segment_bytes
            )
            assert report.clean
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.close()


def values(log: TopicLog, offset: int | None = None, count: int = 10**9) -> list[Any]:
    return [record.value for record in log.read(log.first_offset if offset is None else offset, count)]


# -- offsets and reads ------------------------------------------------------------------------


def test_a_new_log_is_empty_at_offset_zero(make_log: MakeLog) -> None:
    log = make_log()
    assert (log.first_offset, log.next_offset, log.durable_offset) == (0, 0, 0)
    assert log.read(0, 10) == []
    assert log.offset_for_timestamp(0) == 0


def test_offsets_are_contiguous_from_zero_across_batches(make_log: MakeLog) -> None:
    log = make_log()
    assert log.append(["a"], timestamp_ms=1) == [0]
    assert log.append(["b", "c", "d"], timestamp_ms=2) == [1, 2, 3]
    assert log.append([], timestamp_ms=3) == []
    assert log.append([f"v{i}" for i in range(50)], timestamp_ms=4) == list(range(4, 54))
    assert log.next_offset == 54
    assert [record.offset for record in log.read(0, 100)] == list(range(54))


def test_records_read_back_as_appended_with_timestamp_and_idempotency_key(make_log: MakeLog) -> None:
    log = make_log()
    log.append([1], timestamp_ms=1000)
    log.append(["x", "y"], timestamp_ms=2000, producer="p1", first_sequence=7)
    log.append(["z"], timestamp_ms=3000, producer="p2")
    assert log.read(0, 10) == [
        Record(0, 1000, 1, None, None),
        Record(1, 2000, "x", "p1", 7),
        Record(2, 2000, "y", "p1", 8),
        Record(3, 3000, "z", "p2", None),
    ]


def test_every_msgpack_value_but_nil_round_trips_as_msgpack_decodes_it(make_log: MakeLog) -> None:
    log = make_log(segment_bytes=1 << 20)
    stored = [
        0,
        -1,
        2**64 - 1,
        -(2**63),
        1.5,
        True,
        False,
        "",
        "unicode ✓",
        b"\x00\xff",
        [],
        {},
        [1, [2, [3]]],
        {"a": {"b": [1, "c"]}, b"k": 2},
        msgpack.ExtType(5, b"ext"),
        "x" * 10_000,
    ]
    log.append(stored, timestamp_ms=0)
    assert values(log) == stored
    log.append([(1, 2)], timestamp_ms=0)
    assert values(log, len(stored)) == [[1, 2]]  # as it would arrive over the network


@pytest.mark.parametrize(
    "bad, error",
    [
        (None, ValueError),
        (object(), TypeError),
        ({1: "int key"}, ValueError),
        (2**64, ValueError),
        ("\ud800", ValueError),
    ],
    ids=["none", "object", "int-map-key", "too-big-int", "lone-surrogate"],
)
def test_a_value_that_cannot_be_stored_fails_the_whole_batch(make_log: MakeLog, bad: Any, error: type) -> None:
    log = make_log()
    log.append(["before"], timestamp_ms=0, producer="p", first_sequence=0)
    with pytest.raises(error, match=r"values\[1\]"):
        log.append(["ok", bad, "ok"], timestamp_ms=0, producer="p", first_sequence=1)
    assert log.next_offset == 1 and log.last_sequence("p") == 0
    assert log.append(["after"], timestamp_ms=0) == [1]
    assert values(log) == ["before", "after"]


def test_reads_return_ranges_limited_by_max_count_and_the_end(make_log: MakeLog) -> None:
    log = make_log()
    for batch in range(10):
        log.append([batch * 10 + i for i in range(10)], timestamp_ms=batch)
    assert values(log, 0, 5) == [0, 1, 2, 3, 4]
    assert values(log, 37, 6) == [37, 38, 39, 40, 41, 42]
    assert values(log, 95, 100) == [95, 96, 97, 98, 99]
    assert values(log, 99, 1) == [99]
    assert log.read(50, 0) == []
    assert log.read(100, 10) == []


def test_reading_past_the_end_or_with_bad_arguments_raises(make_log: MakeLog) -> None:
    log = make_log()
    log.append(["a", "b"], timestamp_ms=0)
    with pytest.raises(OffsetBeyondEnd) as beyond:
        log.read(3, 1)
    assert (beyond.value.requested, beyond.value.next_offset) == (3, 2)
    with pytest.raises(ValueError):
        log.read(-1, 1)
    with pytest.raises(ValueError):
        log.read(0, -1)


def test_a_closed_log_refuses_every_operation(make_log: MakeLog) -> None:
    log = make_log()
    log.append(["a"], timestamp_ms=0)
    log.close()
    log.close()  # idempotent
    for call in (lambda: log.append(["b"], timestamp_ms=0), lambda: log.read(0, 1), lambda: log.sync()):
        with pytest.raises(StorageError, match="closed"):
            call()


# -- idempotent producers ---------------------------------------------------------------------


def test_a_retried_batch_is_stored_once(make_log: MakeLog) -> None:
    log = make_log()
    assert log.append(["a", "b", "c"], timestamp_ms=0, producer="p", first_sequence=0) == [0, 1, 2]
    assert log.append(["a", "b", "c"], timestamp_ms=0, producer="p", first_sequence=0) == [None, None, None]
    assert log.last_sequence("p") == 2
    assert values(log) == ["a", "b", "c"]


def test_a_retry_overlapping_what_is_stored_keeps_only_the_new_part(make_log: MakeLog) -> None:
    log = make_log()
    log.append(["a", "b"], timestamp_ms=0, producer="p", first_sequence=0)
    assert log.append(["b", "c", "d"], timestamp_ms=0, producer="p", first_sequence=1) == [None, 2, 3]
    assert values(log) == ["a", "b", "c", "d"]
    assert log.read(2, 2) == [Record(2, 0, "c", "p", 2), Record(3, 0, "d", "p", 3)]


def test_sequences_may_skip_ahead_but_never_go_back(make_log: MakeLog) -> None:
    log = make_log()
    log.append(["a"], timestamp_ms=0, producer="p", first_sequence=5)
    assert log.append(["b"], timestamp_ms=0, producer="p", first_sequence=100) == [1]
    assert log.append(["old"], timestamp_ms=0, producer="p", first_sequence=6) == [None]
    assert log.last_sequence("p") == 100


def test_producers_are_deduplicated_independently(make_log: MakeLog) -> None:
    log = make_log()
    log.append(["p0"], timestamp_ms=0, producer="p", first_sequence=0)
    assert log.append(["q0"], timestamp_ms=0, producer="q", first_sequence=0) == [1]
    assert (log.last_sequence("p"), log.last_sequence("q"), log.last_sequence("r")) == (0, 0, None)


def test_without_a_sequence_nothing_is_deduplicated(make_log: MakeLog) -> None:
    log = make_log()
    assert log.append(["a"], timestamp_ms=0) == [0]
    assert log.append(["a"], timestamp_ms=0) == [1]
    assert log.append(["a"], timestamp_ms=0, producer="p") == [2]
    assert log.append(["a"], timestamp_ms=0, producer="p") == [3]
    assert log.last_sequence("p") is None


def test_a_sequence_needs_a_producer_and_must_be_a_non_negative_int(make_log: MakeLog) -> None:
    log = make_log()
    with pytest.raises(ValueError, match="needs a producer"):
        log.append(["a"], timestamp_ms=0, first_sequence=0)
    with pytest.raises(ValueError):
        log.append(["a"], timestamp_ms=0, producer="p", first_sequence=-1)
    with pytest.raises(TypeError):
        log.append(["a"], timestamp_ms=0, producer=7)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        log.append(["a"], timestamp_ms=1.5)  # type: ignore[arg-type]
    assert log.next_offset == 0


# -- timestamps -------------------------------------------------------------------------------


def test_offset_for_timestamp_finds_the_first_record_at_or_after_it(make_log: MakeLog) -> None:
    log = make_log()
    for t in (100, 200, 200, 300):
        log.append([t, t], timestamp_ms=t)  # offsets 0-1: 100, 2-5: 200, 6-7: 300
    assert [log.offset_for_timestamp(t) for t in (0, 100, 101, 200, 250, 300, 301)] == [0, 0, 2, 2, 6, 6, 8]


def test_offset_for_timestamp_is_exact_when_the_clock_went_backwards(make_log: MakeLog) -> None:
    log = make_log()
    for t in (100, 500, 300, 400, 600):
        log.append([t] * 3, timestamp_ms=t)
    # First record with timestamp >= t: 300 is first reached at 500 (offset 3), not at 300.
    assert [log.offset_for_timestamp(t) for t in (100, 150, 300, 500, 550, 600, 601)] == [0, 3, 3, 3, 12, 12, 15]


def test_offset_for_timestamp_ignores_trimmed_records_when_the_clock_went_backwards(make_log: MakeLog) -> None:
    log = make_log(Retention(max_records=2), segment_bytes=1)  # one record per segment: trimmed exactly
    for t in (500, 100, 200):
        log.append([t], timestamp_ms=t)
    assert log.enforce_retention(now_ms=0) == 1  # drops the record stamped 500
    assert [log.offset_for_timestamp(t) for t in (50, 150, 200, 201)] == [1, 2, 2, 3]


def test_age_retention_ignores_trimmed_records_when_the_clock_went_backwards(make_log: MakeLog) -> None:
    log = make_log(Retention(max_records=3, max_age_ms=100), segment_bytes=1)
    for t in (900, 100, 150, 1000):
        log.append([t], timestamp_ms=t)
    assert log.enforce_retention(now_ms=0) == 1  # by count: the record stamped 900
    assert log.enforce_retention(now_ms=1000) == 2  # by age: 100 and 150, though 900 was newer
    assert values(log) == [1000]


@pytest.mark.parametrize(
    "floor",
    [Retention(max_records=1, max_age_ms=1), Retention(max_bytes=1, max_age_ms=1)],
    ids=["count-then-age", "bytes-then-age"],
)
def test_retention_drops_the_oldest_record_while_any_limit_expires_it(make_log: MakeLog, floor: Retention) -> None:
    log = make_log(floor, segment_bytes=1)
    log.append(["young"], timestamp_ms=1000)
    log.append(["old"], timestamp_ms=999)  # the clock went back
    # "young" goes by count or bytes; then "old" is the oldest record, and it is too old.
    assert log.enforce_retention(now_ms=1001) == 2
    assert (log.first_offset, log.next_offset) == (2, 2)


def fill(log: TopicLog, count: int, *, timestamp_ms: int = 0, size: int = 20) -> None:
    for i in range(count):
        log.append([f"{i:0{size}d}"], timestamp_ms=timestamp_ms + i)


def test_retention_by_count_keeps_at_least_the_newest_records_and_trims_the_rest(make_log: MakeLog) -> None:
    log = make_log(Retention(max_records=30))
    fill(log, 100)
    dropped = log.enforce_retention(now_ms=10**6)
    assert dropped == log.first_offset > 0
    assert 30 <= log.next_offset - log.first_offset < 30 + 20  # MemoryLog exactly 30, SegmentLog < a segment more
    assert values(log) == [f"{i:020d}" for i in range(log.first_offset, 100)]
    with pytest.raises(OffsetTrimmed) as trimmed:
        log.read(log.first_offset - 1, 1)
    assert (trimmed.value.requested, trimmed.value.first_available) == (log.first_offset - 1, log.first_offset)
    with pytest.raises(OffsetTrimmed):
        log.read(0, 1)


def test_retention_by_bytes_keeps_at_least_that_many_bytes(make_log: MakeLog) -> None:
    log = make_log(Retention(max_bytes=1000))
    fill(log, 200)
    size_before = log.size_bytes
    dropped = log.enforce_retention(now_ms=0)
    assert dropped > 0 and log.first_offset == dropped
    assert 1000 <= log.size_bytes < size_before
    with pytest.raises(OffsetTrimmed):
        log.read(dropped - 1, 1)


def test_retention_by_age_drops_what_is_older_and_can_empty_the_log(make_log: MakeLog) -> None:
    log = make_log(Retention(max_age_ms=1000))
    fill(log, 100, timestamp_ms=10_000)  # timestamps 10_000 .. 10_099
    assert log.enforce_retention(now_ms=10_099) == 0
    dropped = log.enforce_retention(now_ms=11_050)  # expired: timestamps below 10_050
    assert 0 < dropped <= 50 and log.first_offset == dropped
    assert log.offset_for_timestamp(0) == log.first_offset
    assert log.enforce_retention(now_ms=12_000) == 100 - dropped  # everything expired
    assert (log.first_offset, log.next_offset) == (100, 100)
    assert log.read(100, 10) == [] and log.offset_for_timestamp(0) == 100
    with pytest.raises(OffsetTrimmed):
        log.read(99, 1)
    assert log.append(["new"], timestamp_ms=12_000) == [100]
    assert values(log) == ["new"]


def test_drop_all_empties_the_log_at_the_same_next_offset_and_offsets_go_on(make_log: MakeLog) -> None:
    # A purge: an offset is never given to other data, so a reader that resumes at an offset
    # it had reached is told the records are gone, never handed new ones under old offsets.
    log = make_log()
    fill(log, 50)
    log.append(["keyed"], timestamp_ms=50, producer="p", first_sequence=0)
    assert log.drop_all() == 51
    assert (log.first_offset, log.next_offset, log.durable_offset) == (51, 51, 51)
    assert log.read(51, 10) == [] and log.offset_for_timestamp(0) == 51
    with pytest.raises(OffsetTrimmed) as trimmed:
        log.read(0, 1)
    assert trimmed.value.first_available == 51
    assert log.drop_all() == 0  # nothing left to drop
    assert log.append(["after"], timestamp_ms=60) == [51]
    assert values(log) == ["after"]
    # The producer's sequence survives: a retry of what was stored before is still a duplicate.
    assert log.append(["keyed"], timestamp_ms=61, producer="p", first_sequence=0) == [None]


def test_retention_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_records"):
        Retention(max_records=0)
    with pytest.raises(ValueError, match="max_bytes"):
        Retention(max_bytes=-1)
    assert Retention(None, None, None) == Retention()
