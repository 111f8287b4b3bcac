"""The stream reader's planning, without Spark: the per-batch bound and the split into tasks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable

from rsnet.spark.source import plan, share

counts = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 10_000), min_size=1)


@given(counts, st.integers(1, 20_000))
def test_max_records_per_batch_is_an_exact_bound_split_across_topics(available, limit):
    shares = share(available, limit)
    assert set(shares) == set(available)
    assert all(0 <= shares[topic] <= available[topic] for topic in available)
    assert sum(shares.values()) == min(limit, sum(available.values()))
    having = [topic for topic, count in available.items() if count]
    if sum(available.values()) > limit >= len(having):  # each topic with records moves on
        assert all(shares[topic] >= 1 for topic in having)


def test_a_small_topic_beside_a_busy_one_moves_on_every_batch():
    # It got nothing for as long as the busy topic's backlog lasted (rounded down, and the
    # remainder went to names in order), as in Kafka's source it would not.
    assert share({"s.big": 3000, "s.small": 5}, 100) == {"s.big": 99, "s.small": 1}
    assert share({"a": 10, "b": 1000, "c": 0}, 2) == {"a": 1, "b": 1, "c": 0}


def test_more_topics_than_the_limit_take_turns():
    # Spark user check: with maxRecordsPerBatch 2 over three busy topics, the third waited for
    # as long as the first two had records (for ever, with their producers running).
    positions = {"a": 0, "b": 0, "c": 0}
    for _ in range(3):
        shares = share(dict.fromkeys(positions, 1000), 2, turn=sum(positions.values()))
        assert sum(shares.values()) == 2
        for topic, count in shares.items():
            positions[topic] += count
    assert positions == {"a": 2, "b": 2, "c": 2}


def test_a_replayed_batch_is_split_as_its_first_run_was_whatever_min_partitions_says_now():
    # A sink's exactly-once keys follow the partitions: a crash, then a restart with another
    # minPartitions, must not split the replayed batch otherwise (it wrote duplicates).
    from rsnet.spark import options
    from rsnet.spark.source import StreamReader

    now = options.parse({"url": "tcp://127.0.0.1:1", "topic": "t", "minPartitions": "1"})
    reader = StreamReader(now, schema=None)  # type: ignore[arg-type]  # planning only
    start = {"topics": {"t": 0}, "query": "q"}
    planned = {"topics": {"t": 100}, "query": "q", "minPartitions": 4}
    assert [(r.start, r.end) for r in reader.partitions(start, planned)] == [(0, 25), (25, 50), (50, 75), (75, 100)]
    older = {"topics": {"t": 100}, "query": "q"}  # a checkpoint from before the split was kept
    assert [(r.start, r.end) for r in reader.partitions(start, older)] == [(0, 100)]


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


def test_the_planner_reconnects_after_the_broker_restarts(tmp_path):
    """The stream reader's planning calls run in one long-lived process: a broker restart
    between two micro-batches costs a reconnect, not the query."""
    import socket

    from rsnet.spark import options
    from rsnet.spark.source import StreamReader

    from .support import TOKEN, broker_process, publish

    with socket.socket() as probe:  # a free port the restarted broker can listen on again
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    opts = options.parse({"url": f"tcp://127.0.0.1:{port}", "token": TOKEN, "topic": "restart.t", "cursor": "c"})
    reader = StreamReader(opts, None)
    with broker_process(tmp_path, port=port, durable=True) as url:
        start = reader.initialOffset()
        publish(url, "restart.t", [1, 2, 3])
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end["topics"] == {"restart.t": 3}
    with broker_process(tmp_path, port=port, durable=True) as url:
        publish(url, "restart.t", [4, 5], producer="after")
        later = reader.latestOffset(end, ReadAllAvailable())  # commits 3 to cursor c, then looks
        assert later["topics"] == {"restart.t": 5}
        reader.stop()
        assert [record["offset"] for record in records_from(url, "restart.t", "c")] == [3]


def records_from(url, topic, cursor):
    import rsnet.sync
    from rsnet.broker import blocking

    from .support import TOKEN

    with rsnet.sync.connect(url, token=TOKEN) as client:
        for record in blocking.subscribe(client, topic, {"cursor": cursor, "from": "earliest"}, 1):
            return [record]


def _default_schema():
    """The default schema (DEFAULT_SCHEMA), without a Spark session to parse it."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType(
        [
            StructField("topic", StringType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("value", StringType()),
        ]
    )


def _free_port() -> int:
    """A port on 127.0.0.1 that a broker, and the broker replacing it, can listen on."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_planner_rides_out_a_deploy_going_away_then_nobody_then_a_new_broker(tmp_path):
    """SIGTERM: the broker says GOING_AWAY, refuses new streams, and closes after its grace;
    a new one listens on the port a moment later. A planning call made meanwhile waits for it
    instead of failing the query (an outside check saw a query die within a second)."""
    import signal
    import threading

    from rsnet.spark import options
    from rsnet.spark.source import StreamReader

    from .support import TOKEN, broker_daemon, publish

    port = _free_port()
    opts = options.parse({"url": f"tcp://127.0.0.1:{port}", "token": TOKEN, "topic": "deploy.t"})
    reader = StreamReader(opts, None)
    done, replaced = threading.Event(), threading.Event()

    def replace(old) -> None:
        old.wait(30)  # its port is free: the new broker takes it
        with broker_daemon(tmp_path, port=port, durable=True) as (url, _):
            publish(url, "deploy.t", [4, 5], producer="after")
            replaced.set()
            done.wait(60)

    with broker_daemon(tmp_path, port=port, durable=True, grace=2) as (url, old):
        start = reader.initialOffset()
        publish(url, "deploy.t", [1, 2, 3])
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end["topics"] == {"deploy.t": 3}
        old.send_signal(signal.SIGTERM)
        while "shutting down" not in old.stderr.readline():  # GO_AWAY is on its way to the planner
            pass
        replacement = threading.Thread(target=replace, args=(old,))
        replacement.start()
        try:
            during = reader.latestOffset(end, ReadAllAvailable())  # GOING_AWAY, refused, then the new one
            assert during["topics"]["deploy.t"] in (3, 5)
            assert replaced.wait(30)
            after = reader.latestOffset(during, ReadAllAvailable())
            assert after["topics"] == {"deploy.t": 5}
        finally:
            reader.stop()
            done.set()
            replacement.join(60)


def test_a_read_task_goes_on_from_where_it_was_across_a_broker_restart(tmp_path):
    """A task reading a range when the broker restarts reconnects and reads the rest: every
    offset of the range once (in local mode Spark does not retry a failed task)."""
    import pyarrow as pa

    from rsnet.spark import options
    from rsnet.spark.arrow import ROWS_PER_BATCH, RecordBatches
    from rsnet.spark.source import Range, read_ranges

    from .support import TOKEN, broker_daemon, publish

    port, count = _free_port(), 3 * ROWS_PER_BATCH
    opts = options.parse({"url": f"tcp://127.0.0.1:{port}", "token": TOKEN, "topic": "restart.read"})
    with broker_daemon(tmp_path, port=port, durable=True) as (url, old):
        publish(url, "restart.read", list(range(count)))
        batches = read_ranges(opts, RecordBatches(_default_schema()), Range("restart.read", 0, count))
        first = next(batches)
        old.terminate()  # a restart while the task has the rest of its range to read
        old.wait(30)
    with broker_daemon(tmp_path, port=port, durable=True):
        read = pa.Table.from_batches([first, *batches])
    assert read.column("offset").to_pylist() == list(range(count))
    assert read.column("value").to_pylist() == [str(n) for n in range(count)]


def _topic_dropped(url: str, topic: str) -> int:
    import rsnet.sync
    from rsnet.broker import blocking

    from .support import TOKEN

    with rsnet.sync.connect(url, token=TOKEN) as client:
        (entry,) = blocking.list_topics(client, [topic])
        return int(entry["dropped"])


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_records_a_drop_topic_skipped_while_a_read_lagged_fail_it_or_are_skipped(broker_url, caplog, fail_on_data_loss):
    """On a topic whose slow-subscriber policy is drop, the broker moves a read that lags ahead,
    past records of its range (and here past its end): the read fails (DataLossError), or
    with failOnDataLoss=false says so and ends; it used to end quietly with what it had."""
    import pyarrow as pa

    from rsnet.spark import options
    from rsnet.spark.arrow import ROWS_PER_BATCH, RecordBatches
    from rsnet.spark.source import DataLossError, Range, read_ranges

    from .support import TOKEN, publish

    count = 3 * ROWS_PER_BATCH
    topic = f"drop.read-{fail_on_data_loss}"
    raw = {"url": broker_url, "token": TOKEN, "topic": topic, "failOnDataLoss": str(fail_on_data_loss).lower()}
    opts = options.parse(raw)
    publish(broker_url, topic, list(range(count)), producer="before")
    batches = read_ranges(opts, RecordBatches(_default_schema()), Range(topic, 0, count))
    first = next(batches)  # the read has its first rows and lags: it takes no more for now
    more = 0
    while not _topic_dropped(broker_url, topic):  # records arrive: the broker moves the read ahead
        publish(broker_url, topic, list(range(100)), producer="after", first_sequence=more)
        more += 100
        assert more < 100_000, "the broker never moved the lagging read ahead"
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=rf"of topic '{topic}' .* are gone \(skipped by the broker: .*drop"):
            list(batches)
    else:
        read = pa.Table.from_batches([first, *batches]).column("offset").to_pylist()
        assert read == sorted(read) and len(set(read)) == len(read) and len(read) < count
        assert all(0 <= offset < count for offset in read)
        assert "skipped by the broker" in caplog.text and "failOnDataLoss=false" in caplog.text


def test_records_removed_before_they_were_read_do_not_count_against_the_batch_limit(broker_url):
    # Over a range retention removed, the next batch goes to the first retained record and on
    # by the limit (its read reports the gap once); it used to cover the removed range 10
    # offsets a batch, a warning each (failOnDataLoss=false), before reaching new records.
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from rsnet.spark import options
    from rsnet.spark.source import StreamReader

    from .support import TOKEN, ends, publish, wait_until

    publish(broker_url, "trim.plan", list(range(300)))  # the topic keeps the last 100
    wait_until(lambda: ends(broker_url, "trim.plan") == (200, 300), "the retention sweep")
    raw = {"url": broker_url, "token": TOKEN, "topic": "trim.plan", "failOnDataLoss": "false"}
    reader = StreamReader(options.parse(raw), schema=None)  # type: ignore[arg-type]  # planning only
    try:
        end = reader.latestOffset({"topics": {"trim.plan": 0}, "query": "q"}, ReadMaxRows(10))
    finally:
        reader.stop()
    assert end["topics"] == {"trim.plan": 210}
