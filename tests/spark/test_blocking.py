"""The broker conventions over the blocking client (rsnet.broker.blocking), which Spark's
executors use: exact demand, and no event loop."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

import rsnet.sync

from .support import TOKEN, publish, wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("items", ["maps", "arrays", "stored"])
def test_exact_demand_sends_no_record_beyond_the_range(broker_url, items):
    from rsnet.broker import blocking

    topic = f"demand.exact-{items}"
    publish(broker_url, topic, list(range(1000)))

    def delivered():
        with rsnet.sync.connect(broker_url, token=TOKEN) as client:
            (info,) = [t for t in blocking.list_topics(client) if t["topic"] == topic]
            return info["records_out"]

    before = delivered()
    with rsnet.sync.connect(broker_url, token=TOKEN) as client:
        chunks = list(blocking.read_range(client, topic, 100, 437, window=64, items=items))
    records = [r for chunk in chunks for r in chunk]
    if items == "maps":
        assert [(r["offset"], r["value"]) for r in records] == [(i, i) for i in range(100, 437)]
    else:  # [offset, timestamp, value], and producer, sequence when stored
        assert [(r[0], r[2]) for r in records] == [(i, i) for i in range(100, 437)]
        assert {len(r) for r in records} == {3 if items == "arrays" else 5}
    wait_until(lambda: delivered() - before >= 337, "the broker's delivery count")
    assert delivered() - before == 337  # the records the range holds, none more


def test_importing_and_using_the_broker_helpers_loads_no_event_loop(broker_url):
    """Spark's workers import rsnet.spark and read through rsnet.broker.blocking: no event loop."""
    probe = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import rsnet.spark, rsnet.spark.sink
from rsnet.broker import blocking
with blocking.connect({broker_url!r}, token={TOKEN!r}) as client:
    blocking.publish(client, "noloop.t", [1, 2, 3], producer="noloop", first_sequence=0)
    blocking.commit(client, "noloop.t", "c", 3)
    assert [r["value"] for chunk in blocking.read_range(client, "noloop.t", 0, 3) for r in chunk] == [1, 2, 3]
print(sorted(name for name in sys.modules if name.split(".")[0] in ("trio", "asyncio", "anyio", "sniffio")))
"""
    result = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_a_partition_read_collects_garbage_less_often_and_gives_the_threshold_back(broker_url):
    """rsnet.spark.source.fewer_collections: while a partition is read, Python's young
    generation waits for COLLECT_AFTER allocations (the records it holds would otherwise make
    the collector walk the worker's whole heap over and over); the worker's own threshold is
    back once the read is done, or abandoned."""
    import gc

    from rsnet.spark import options
    from rsnet.spark.arrow import RecordBatches
    from rsnet.spark.source import COLLECT_AFTER, Range, read_ranges

    from .test_arrow import DEFAULT

    publish(broker_url, "gc.read", list(range(25_000)))
    opts = options.parse({"url": broker_url, "topic": "gc.read", "token": TOKEN})
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        batches = read_ranges(opts, RecordBatches(DEFAULT), Range("gc.read", 0, 25_000))
        first = next(batches)
        assert gc.get_threshold() == (COLLECT_AFTER, 10, 10)
        rows = first.num_rows + sum(batch.num_rows for batch in batches)
        assert rows == 25_000 and gc.get_threshold() == (700, 10, 10)
        abandoned = read_ranges(opts, RecordBatches(DEFAULT), Range("gc.read", 0, 25_000))
        next(abandoned)
        abandoned.close()
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)


def test_topics_and_patterns_resolve_beyond_what_one_listing_may_ask_for(broker_url):
    """More patterns than a $topics `match` takes (16 with a wildcard): the client lists every
    topic and matches them itself."""
    from rsnet.broker import blocking

    publish(broker_url, "many.a.x", [1])
    publish(broker_url, "many.b.x", [1, 2])
    patterns = [f"many.q{n}.*" for n in range(20)] + ["many.a.*", "many.*.x", "many.b.x"]
    with rsnet.sync.connect(broker_url, token=TOKEN) as client:
        found = blocking.resolve_topics(client, patterns)
    assert {name: ends[1] for name, ends in found.items()} == {"many.a.x": 1, "many.b.x": 2}


def test_publishing_without_a_producer_stores_each_call_and_with_one_stores_each_sequence_once(broker_url):
    """The trio client's ``publish`` makes up a producer when given none; the blocking one
    required one, and the README's example, rerun with other rows under its fixed producer,
    stored nothing new (an outside check): each call without a producer stores its rows."""
    from rsnet.broker import blocking

    with rsnet.sync.connect(broker_url, token=TOKEN) as client:
        assert blocking.publish(client, "producers.t", ["a", "b"]) == 2
        assert blocking.publish(client, "producers.t", ["c"]) == 1
        blocking.publish(client, "producers.t", ["d"], producer="fixed", first_sequence=0)
        blocking.publish(client, "producers.t", ["e"], producer="fixed", first_sequence=0)  # stored already
        values = [r["value"] for chunk in blocking.read_range(client, "producers.t", 0, 4) for r in chunk]
        (info,) = blocking.list_topics(client, ["producers.t"])
    assert values == ["a", "b", "c", "d"] and info["next_offset"] == 4
