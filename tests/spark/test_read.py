"""Reading topics with Spark: streaming micro-batches under a row limit, batch reads of an
offset range, minPartitions, user schemas, and the errors users meet."""

from __future__ import annotations

import json

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from .support import READER_TOKEN, TOKEN, ends, publish, wait_until


def reader(spark, url, topic, **options):
    stream = spark.readStream.format("rsnet").option("url", url).option("token", TOKEN).option("topic", topic)
    for key, value in options.items():
        stream = stream.option(key, str(value))
    return stream.load()


def batch(spark, url, topic, **options):
    read = spark.read.format("rsnet").option("url", url).option("token", TOKEN).option("topic", topic)
    for key, value in options.items():
        read = read.option(key, str(value))
    return read.load()


def run_available_now(df, checkpoint, *, partitions=False):
    """Run ``df`` as a streaming query with trigger(availableNow) and return its micro-batches
    as (batch id, rows sorted by offset, number of partitions)."""
    batches = []

    def collect(frame, batch_id):
        rows = sorted(frame.collect(), key=lambda row: (row["topic"], row["offset"]))
        batches.append((batch_id, rows, frame.rdd.getNumPartitions() if partitions else None))

    query = (
        df.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    )
    query.start().awaitTermination(120)
    return batches


def test_streaming_read_in_limited_micro_batches_record_by_record(spark, broker_url, tmp_path):
    publish(broker_url, "orders.stream", [{"n": n, "name": f"order-{n}"} for n in range(250)])
    df = reader(spark, broker_url, "orders.stream", startingOffsets="earliest", maxRecordsPerBatch=100)
    assert df.schema.simpleString() == "struct<topic:string,offset:bigint,timestamp:timestamp,value:string>"

    batches = run_available_now(df, tmp_path / "checkpoint")

    assert [len(rows) for _, rows, _ in batches] == [100, 100, 50]
    rows = [row for _, batch_rows, _ in batches for row in batch_rows]
    assert [row["offset"] for row in rows] == list(range(250))
    assert all(row["topic"] == "orders.stream" for row in rows)
    assert [json.loads(row["value"]) for row in rows] == [{"n": n, "name": f"order-{n}"} for n in range(250)]
    assert all(row["timestamp"] is not None for row in rows)


def test_streaming_read_starts_at_latest_by_default_and_sees_only_new_records(spark, broker_url, tmp_path):
    publish(broker_url, "orders.latest", ["old"] * 5)
    df = reader(spark, broker_url, "orders.latest")
    seen = []
    query = (
        df.writeStream.foreachBatch(lambda frame, _: seen.extend(frame.collect()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        publish(broker_url, "orders.latest", ["new-1", "new-2"], producer="second")
        query.processAllAvailable()
    finally:
        query.stop()
    assert [(row["offset"], json.loads(row["value"])) for row in seen] == [(5, "new-1"), (6, "new-2")]


def test_batch_read_of_an_offset_range_split_by_min_partitions(spark, broker_url):
    publish(broker_url, "orders.range", list(range(1000)))
    df = batch(
        spark,
        broker_url,
        "orders.range",
        startingOffsets='{"orders.range": 100}',
        endingOffsets='{"orders.range": 900}',
        minPartitions=4,
    )
    assert df.rdd.getNumPartitions() == 4
    per_task = (
        df.groupBy(F.spark_partition_id().alias("task"))
        .agg(F.min("offset").alias("first"), F.max("offset").alias("last"), F.count("*").alias("rows"))
        .orderBy("task")
        .collect()
    )
    assert [(row["first"], row["last"], row["rows"]) for row in per_task] == [
        (100, 299, 200),
        (300, 499, 200),
        (500, 699, 200),
        (700, 899, 200),
    ]
    rows = df.orderBy("offset").collect()
    assert [(row["offset"], json.loads(row["value"])) for row in rows] == [(n, n) for n in range(100, 900)]


def test_a_batch_read_with_nothing_to_read_is_empty_not_an_error(spark, broker_url):
    # A scheduled job that runs when nothing new arrived must get no rows, not a failure.
    publish(broker_url, "empty.some", list(range(100)))
    for topic, options in [
        ("empty.some", {"startingOffsets": "latest"}),
        ("empty.some", {"startingOffsets": '{"empty.some": 100}'}),  # an incremental read from the end
        ("empty.absent", {}),  # a missing topic reads as empty
        ("nomatch.*", {}),  # a pattern that matches nothing
    ]:
        assert batch(spark, broker_url, topic, **options).collect() == [], (topic, options)
    with pytest.raises(PySparkException, match=r"startingOffsets after endingOffsets for: empty.some 60 > 50"):
        batch(
            spark,
            broker_url,
            "empty.some",
            startingOffsets='{"empty.some": 60}',
            endingOffsets='{"empty.some": 50}',
        ).collect()


def test_batch_read_of_a_pattern_with_a_user_schema(spark, broker_url):
    publish(broker_url, "sensors.kitchen", [{"room": "kitchen", "temp": 21.5, "on": True, "count": 3}])
    publish(broker_url, "sensors.hall", [{"room": "hall", "temp": "warm", "count": 2**40}, "not a map"])
    publish(broker_url, "sensors.attic", [{"room": "attic", "temp": 3, "on": 1, "count": 1.5}])
    df = (
        spark.read.format("rsnet")
        .schema("room string, temp double, on boolean, count long, missing string")
        .option("url", broker_url)
        .option("token", TOKEN)
        .option("topic", "sensors.*")
        .load()
    )
    rows = sorted(df.collect(), key=lambda row: (row["room"] is None, row["room"] or ""))
    assert [row.asDict() for row in rows] == [
        {"room": "attic", "temp": 3.0, "on": None, "count": None, "missing": None},  # 1 is no bool, 1.5 no long
        {"room": "hall", "temp": None, "on": None, "count": 2**40, "missing": None},  # "warm" is no double
        {"room": "kitchen", "temp": 21.5, "on": True, "count": 3, "missing": None},
        {"room": None, "temp": None, "on": None, "count": None, "missing": None},  # the value is not a map
    ]


def test_streaming_min_partitions_splits_each_micro_batch(spark, broker_url, tmp_path):
    publish(broker_url, "orders.split", list(range(300)))
    df = reader(spark, broker_url, "orders.split", startingOffsets="earliest", maxRecordsPerBatch=150, minPartitions=3)
    batches = run_available_now(df, tmp_path / "checkpoint", partitions=True)
    assert [(len(rows), parts) for _, rows, parts in batches] == [(150, 3), (150, 3)]
    assert [row["offset"] for _, rows, _ in batches for row in rows] == list(range(300))


def test_bad_option_values_are_named(spark, broker_url):
    with pytest.raises(Exception, match=r"maxRecordsPerBatch must be a positive integer, got 'lots'"):
        reader(spark, broker_url, "orders.stream", maxRecordsPerBatch="lots")
    with pytest.raises(Exception, match=r"startingOffsets must be 'earliest' or 'latest' or JSON"):
        batch(spark, broker_url, "orders.stream", startingOffsets="yesterday").collect()
    with pytest.raises(
        Exception, match=r"startingOffsets is beyond the end of: orders.stream 999999 \(its next is \d+\)"
    ):
        batch(spark, broker_url, "orders.stream", startingOffsets='{"orders.stream": 999999}').collect()
    with pytest.raises(Exception, match=r"unknown option\(s\) maxoffsetspertrigger; known: cursor, endingOffsets"):
        reader(spark, broker_url, "orders.stream", maxOffsetsPerTrigger=10)
    # An option where it means nothing is refused, not ignored (a batch read has no batches to
    # bound, a stream no end, a writer no offsets).
    with pytest.raises(Exception, match=r"option\(s\) cursor, maxRecordsPerBatch mean nothing for a batch read"):
        batch(spark, broker_url, "orders.stream", maxRecordsPerBatch=5, cursor="c").collect()
    with pytest.raises(
        Exception, match=r"option\(s\) startingOffsets mean nothing for a write \(it takes token, topic, url\)"
    ):
        spark.createDataFrame([("x",)], "value string").write.format("rsnet").mode("append").option(
            "url", broker_url
        ).option("token", TOKEN).option("topic", "orders.x").option("startingOffsets", "earliest").save()
    query = (
        reader(spark, broker_url, "orders.stream", endingOffsets="latest")
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=r"option\(s\) endingOffsets mean nothing for a stream read"):
        query.awaitTermination(60)
    publish(broker_url, "orders.case", [1, 2])
    assert batch(spark, broker_url, "orders.case", startingOffsets="Latest").collect() == []  # as Kafka's


def test_unreachable_broker_unknown_topic_and_bad_token_say_so(spark, broker_url):
    with pytest.raises(PySparkException, match=r"cannot reach the broker at tcp://127.0.0.1:1"):
        batch(spark, "tcp://127.0.0.1:1", "orders.stream").collect()
    with pytest.raises(
        PySparkException, match=r"no topic named 'strict.absent'.*refuses subscriptions to missing topics"
    ):
        batch(spark, broker_url, "strict.absent").collect()
    with pytest.raises(PySparkException, match=r"refused the token \(option token\)"):
        batch(spark, broker_url, "orders.stream", token="wrong").collect()
    with pytest.raises(PySparkException, match=r"the token is not allowed this .*not allowed to subscribe 'secret.t'"):
        batch(spark, broker_url, "secret.t", token=READER_TOKEN).collect()
    df = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(PySparkException, match=r"the token is not allowed this .*not allowed to publish 'allowed.t'"):
        df.write.format("rsnet").mode("append").option("url", broker_url).option("token", READER_TOKEN).option(
            "topic", "allowed.t"
        ).save()


def test_retention_trimmed_offsets_fail_the_read_or_are_skipped(spark, broker_url):
    publish(broker_url, "trim.me", list(range(300)))  # the topic keeps the last 100
    wait_until(lambda: ends(broker_url, "trim.me") == (200, 300), "the retention sweep")
    with pytest.raises(
        PySparkException, match=r"offsets 0 to 199 of topic 'trim.me' .* are gone \(removed by retention or a purge\)"
    ):
        batch(spark, broker_url, "trim.me", startingOffsets='{"trim.me": 0}').collect()
    rows = batch(spark, broker_url, "trim.me", startingOffsets='{"trim.me": 0}', failOnDataLoss="false").collect()
    assert sorted(row["offset"] for row in rows) == list(range(200, 300))


def test_user_schema_nested_types_and_timestamps(spark, broker_url):
    publish(
        broker_url,
        "nested.t",
        [
            {
                "tags": ["a", "b"],
                "attrs": {"x": 1},
                "at": 1_700_000_000_123,
                "pos": {"x": 1.5, "y": -2.0},
                "raw": b"\x00\xff",
            },
            {"tags": "not a list", "attrs": None, "at": "not a time", "pos": {"x": 0.0}},
        ],
    )
    df = (
        spark.read.format("rsnet")
        .schema("tags array<string>, attrs map<string,long>, at timestamp, pos struct<x:double,y:double>, raw binary")
        .option("url", broker_url)
        .option("token", TOKEN)
        .option("topic", "nested.t")
        .load()
    )
    first, second = df.select("tags", "attrs", F.unix_millis("at").alias("at"), "pos", "raw").collect()
    assert first.asDict(recursive=True) == {
        "tags": ["a", "b"],
        "attrs": {"x": 1},
        "at": 1_700_000_000_123,
        "pos": {"x": 1.5, "y": -2.0},
        "raw": bytearray(b"\x00\xff"),
    }
    assert second.asDict(recursive=True) == {
        "tags": None,
        "attrs": None,
        "at": None,
        "pos": {"x": 0.0, "y": None},
        "raw": None,
    }


@pytest.mark.parametrize(
    ("shown", "major"), [('openjdk version "11.0.22" 2024-01-16', 11), ('java version "1.8.0_402"', 8)]
)
def test_a_java_older_than_17_is_named_before_spark_fails_obscurely(monkeypatch, tmp_path, shown, major):
    import rsnet.spark

    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text(f"#!/bin/sh\necho '{shown}' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match=rf"needs Java 17 or later, and .*/bin/java is Java {major}; install"):
        rsnet.spark.check_java()


def test_the_java_the_tests_run_on_passes_the_check():
    import rsnet.spark

    assert rsnet.spark.java_major_version(rsnet.spark.check_java()) >= 17


def test_a_missing_java_is_named_before_spark_fails_obscurely(monkeypatch, tmp_path):
    import rsnet.spark

    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(
        RuntimeError, match=r"Spark needs Java 17 \(JAVA_HOME=.* has no bin/java\).*openjdk-17-jre-headless"
    ):
        rsnet.spark.check_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"no java on PATH and JAVA_HOME is not set"):
        rsnet.spark.check_java()


def test_a_pattern_picks_up_topics_created_while_the_query_runs(spark, broker_url, tmp_path):
    publish(broker_url, "grow.a", ["a0", "a1"])
    df = reader(spark, broker_url, "grow.*", startingOffsets="earliest")
    first = run_available_now(df, tmp_path / "checkpoint")
    assert [(row["topic"], json.loads(row["value"])) for _, rows, _ in first for row in rows] == [
        ("grow.a", "a0"),
        ("grow.a", "a1"),
    ]
    publish(broker_url, "grow.b", ["b0", "b1", "b2"])  # a new topic: read from its start
    publish(broker_url, "grow.a", ["a2"], producer="more")
    second = run_available_now(df, tmp_path / "checkpoint")
    assert sorted((row["topic"], row["offset"], json.loads(row["value"])) for _, rows, _ in second for row in rows) == [
        ("grow.a", 2, "a2"),
        ("grow.b", 0, "b0"),
        ("grow.b", 1, "b1"),
        ("grow.b", 2, "b2"),
    ]
