"""The stream reader's planning, without Spark: the per-batch bound and the split into tasks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsnet.spark.source import plan, share

counts = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 10_000), min_size=1)


@given(counts, st.integers(1, 20_000))
def test_max_records_per_batch_is_an_exact_bound_split_across_topics(available, limit):
    shares = share(available, limit)
    assert set(shares) == set(available)
    assert all(0 <= shares[topic] <= available[topic] for topic in available)
    assert sum(shares.values()) == min(limit, sum(available.values()))


@given(counts, st.integers(0, 1_000), st.one_of(st.none(), st.integers(1, 16)))
def test_ranges_cover_each_topic_exactly_once_in_order(sizes, base, min_partitions):
    start = {topic: base for topic in sizes}
    end = {topic: base + size for topic, size in sizes.items()}
    ranges = plan(start, end, min_partitions)
    for topic, size in sizes.items():
        mine = [(r.start, r.end) for r in ranges if r.topic == topic]
        covered = [offset for lo, hi in mine for offset in range(lo, hi)]
        assert covered == list(range(base, base + size))
        assert all(lo < hi for lo, hi in mine)
    with_records = sum(1 for size in sizes.values() if size)
    if min_partitions is None or min_partitions <= with_records:
        assert len(ranges) == with_records


def test_min_partitions_splits_one_topic_evenly():
    assert [(r.start, r.end) for r in plan({"t": 100}, {"t": 900}, 4)] == [
        (100, 300),
        (300, 500),
        (500, 700),
        (700, 900),
    ]
    assert [(r.start, r.end) for r in plan({"t": 0}, {"t": 2}, 4)] == [(0, 1), (1, 2)]  # never an empty task
