"""What a topic log remembers of idempotent producers is bounded (``Retention.max_producers``,
``Retention.producer_max_age_ms``): the least recently written are forgotten first, a forgotten
producer is deduplicated as a new one, and the bounds hold across a restart.

A peer with a publish grant can invent producer ids at will; without these bounds each id
stayed in memory and in every new segment's header for the topic's life.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from rsnet.broker.storage import FsyncPolicy, MemoryLog, Retention, SegmentLog, TopicLog, segment_file
from rsnet.broker.storage.log import DEFAULT_MAX_PRODUCERS
from rsnet.broker.storage.records import frame
from rsnet.broker.storage.segment_file import MAGIC, PREAMBLE, segment_name

MakeLog = Callable[..., TopicLog]


@pytest.fixture(params=["memory", "segments"])
def make_log(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Any:
    logs: list[TopicLog] = []

    def make(retention: Retention, segment_bytes: int = 512) -> TopicLog:
        if request.param == "memory":
            log: TopicLog = MemoryLog(retention)
        else:
            log, _ = SegmentLog.open(tmp_path / f"topic{len(logs)}", retention, FsyncPolicy.NEVER, segment_bytes)
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.close()


def store(log: TopicLog, producer: str, first_sequence: int, count: int = 1, at: int = 0) -> list[int | None]:
    return log.append(
        [f"{producer}{first_sequence + i}" for i in range(count)],
        timestamp_ms=at,
        producer=producer,
        first_sequence=first_sequence,
    )


def remembered(log: TopicLog, *producers: str) -> dict[str, int | None]:
    return {producer: log.last_sequence(producer) for producer in producers}


def test_producers_are_bounded_by_default() -> None:
    assert Retention().max_producers == DEFAULT_MAX_PRODUCERS
    assert Retention(None, None, None).producer_max_age_ms is not None
    for bad in (None, 0, -1, 1.5):
        with pytest.raises(ValueError, match="max_producers must be a positive int"):
            Retention(max_producers=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="producer_max_age_ms must be a positive int or None"):
        Retention(producer_max_age_ms=0)


def test_one_producer_too_many_forgets_the_least_recently_written(make_log: MakeLog) -> None:
    log = make_log(Retention(max_producers=3))
    for producer in "abc":
        store(log, producer, 0, 2)
    store(log, "a", 2)  # a wrote again: b is now the least recently written
    store(log, "d", 0)
    assert remembered(log, "a", "b", "c", "d") == {"a": 2, "b": None, "c": 1, "d": 0}
    assert (log.producer_count, log.producers_forgotten) == (3, 1)
    # What a forgotten producer sees: it is new to the log, so its retry is stored again.
    before = log.next_offset
    assert store(log, "b", 0, 2) == [before, before + 1]
    assert remembered(log, "b", "c") == {"b": 1, "c": None}
    assert store(log, "a", 0, 3) == [None, None, None]  # the ones remembered still deduplicate


def test_a_flood_of_invented_producer_ids_stays_within_the_bound(make_log: MakeLog) -> None:
    log = make_log(Retention(max_producers=100), segment_bytes=16 << 10)
    for n in range(2_000):
        store(log, f"invented-{n}", 0)
    assert log.producer_count == 100
    assert log.last_sequence("invented-1899") is None and log.last_sequence("invented-1900") == 0
    if isinstance(log, SegmentLog):  # each new segment's header lists what is remembered, no more
        newest = log._segments[-1]
        assert log._segments[0] is not newest
        header = segment_file.scan(newest.path, newest.base_offset).header_producers
        assert header is not None and len(header) == 100


def test_a_producer_silent_longer_than_its_max_age_is_forgotten(make_log: MakeLog) -> None:
    log = make_log(Retention(producer_max_age_ms=1_000))
    store(log, "old", 0, 5, at=0)
    store(log, "young", 0, 5, at=500)
    assert log.enforce_retention(1_000) == 0  # records have no limit here; producers do
    assert remembered(log, "old", "young") == {"old": 4, "young": 4}
    log.enforce_retention(1_001)  # the periodic sweep forgets old even if nobody appends
    assert remembered(log, "old", "young") == {"old": None, "young": 4}
    store(log, "young", 5, at=1_499)
    assert store(log, "other", 0, at=2_600) == [11]  # an append forgets those expired at its time too
    assert remembered(log, "young", "other") == {"young": None, "other": 0}
    assert log.producers_forgotten == 2


def test_no_age_bound_keeps_producers_until_the_count_bound(make_log: MakeLog) -> None:
    log = make_log(Retention(max_producers=2, producer_max_age_ms=None))
    store(log, "a", 0, at=0)
    log.enforce_retention(10**12)
    assert log.last_sequence("a") == 0


# -- across a restart --------------------------------------------------------------------------


def reopen(directory: pathlib.Path, retention: Retention, segment_bytes: int = 512) -> SegmentLog:
    log, report = SegmentLog.open(directory, retention, FsyncPolicy.NEVER, segment_bytes)
    assert report.clean, report.damaged
    return log


def test_after_a_restart_the_log_remembers_the_same_producers_as_before(tmp_path: pathlib.Path) -> None:
    retention = Retention(max_producers=3)
    with reopen(tmp_path, retention) as log:
        for n, producer in enumerate("abcdef"):  # 512-byte segments: headers of many segments list them
            store(log, producer, 0, 20, at=n)
        store(log, "d", 20, at=10)
        assert log._segments[0] is not log._segments[-1]  # several segments, so several headers
        assert remembered(log, *"abcdef") == {"a": None, "b": None, "c": None, "d": 20, "e": 19, "f": 19}
    with reopen(tmp_path, retention) as log:
        assert remembered(log, *"abcdef") == {"a": None, "b": None, "c": None, "d": 20, "e": 19, "f": 19}
        assert store(log, "e", 0, 20, at=11) == [None] * 20  # duplicates store nothing: e did not write
        store(log, "g", 0, at=12)  # so e, which last wrote at 4, is the least recently written
        assert remembered(log, "d", "e", "f", "g") == {"d": 20, "e": None, "f": 19, "g": 0}


def test_after_a_restart_a_lower_bound_forgets_the_least_recently_written(tmp_path: pathlib.Path) -> None:
    with reopen(tmp_path, Retention(max_producers=10)) as log:
        for n, producer in enumerate("abcdef"):
            store(log, producer, 0, 3, at=100 + n)
        store(log, "a", 3, at=200)
    with reopen(tmp_path, Retention(max_producers=2)) as log:
        assert remembered(log, *"abcdef") == {"a": 3, "b": None, "c": None, "d": None, "e": None, "f": 2}
        assert log.producers_forgotten == 4


def test_ages_survive_a_restart(tmp_path: pathlib.Path) -> None:
    retention = Retention(producer_max_age_ms=1_000)
    with reopen(tmp_path, retention) as log:
        for n in range(30):  # old's records end up in sealed segments; its time is in later headers
            store(log, "old", n, at=0)
        for n in range(30):
            store(log, "young", n, at=900)
    for segment_bytes in (512, 1 << 20):  # the last segment scanned or its header read
        with reopen(tmp_path, retention, segment_bytes) as log:
            assert remembered(log, "old", "young") == {"old": 29, "young": 29}
            log.enforce_retention(1_500)
            assert remembered(log, "old", "young") == {"old": None, "young": 29}
            log.close()


def test_a_producer_forgotten_and_started_again_keeps_its_new_sequences_after_a_restart(
    tmp_path: pathlib.Path,
) -> None:
    retention = Retention(producer_max_age_ms=1_000)
    with reopen(tmp_path, retention) as log:
        store(log, "p", 0, 50, at=0)  # seq 49 is in the segments' records and headers
        assert store(log, "p", 0, 3, at=5_000) == [50, 51, 52]  # forgotten: starts again at 0
        assert log.last_sequence("p") == 2
    with reopen(tmp_path, retention) as log:
        assert log.last_sequence("p") == 2  # not 49: its records 3 to 49 would be taken for duplicates
        assert store(log, "p", 2, 3, at=5_001) == [None, 53, 54]


def test_a_producer_forgotten_by_the_count_stays_forgotten_after_a_restart(tmp_path: pathlib.Path) -> None:
    retention = Retention(max_producers=2)
    with reopen(tmp_path, retention) as log:
        store(log, "a", 0, 40, at=1)  # fills segments whose headers and records remember a
        store(log, "b", 0, 40, at=2)
        store(log, "c", 0, 40, at=3)
        assert remembered(log, "a", "b", "c") == {"a": None, "b": 39, "c": 39}
    with reopen(tmp_path, retention) as log:
        assert remembered(log, "a", "b", "c") == {"a": None, "b": 39, "c": 39}


def test_segments_written_before_times_were_stored_count_as_written_at_the_newest_record(
    tmp_path: pathlib.Path,
) -> None:
    """A segment header without ``written`` (rsnet before producer bounds): its producers are
    taken as written when the newest record in the log was, remembered rather than dropped."""
    with reopen(tmp_path, Retention()) as log:
        store(log, "p", 0, 3, at=1_000)
    (tmp_path / segment_name(0)).unlink()
    (tmp_path / "00000000000000000000.idx").unlink(missing_ok=True)
    header = msgpack.packb({"base_offset": 0, "producers": {"legacy": 7}}, use_bin_type=True)
    record = frame(msgpack.packb([0, 5_000, "v", "q", 0], use_bin_type=True))
    (tmp_path / segment_name(0)).write_bytes(PREAMBLE.pack(MAGIC, 1) + frame(header) + record)
    with reopen(tmp_path, Retention(producer_max_age_ms=1_000)) as log:
        assert remembered(log, "legacy", "q") == {"legacy": 7, "q": 0}
        log.enforce_retention(6_000)
        assert remembered(log, "legacy", "q") == {"legacy": 7, "q": 0}
        log.enforce_retention(6_001)
        assert remembered(log, "legacy", "q") == {"legacy": None, "q": None}
