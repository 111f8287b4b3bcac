"""Writing to topics with Spark: rows become records, acknowledged before the task ends, and a
micro-batch Spark replays after a failure stores nothing twice."""

from __future__ import annotations

import json

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

import rsnet.sync
from rsnet.broker import blocking
from rsnet.broker.broker import DEFAULT_MAX_RECORD_BYTES

from .support import TOKEN, ends, publish, records


def writer(df, url, topic=None):
    write = df.write.format("rsnet").mode("append").option("url", url).option("token", TOKEN)
    return write.option("topic", topic) if topic else write


def test_batch_write_of_a_value_column_and_of_whole_rows(spark, broker_url):
    df = spark.createDataFrame([(n, f"name-{n}") for n in range(50)], "n long, name string").repartition(2)
    writer(df.select(F.col("name").alias("value")), broker_url, "written.values").save()
    writer(df, broker_url, "written.rows").save()

    assert sorted(record["value"] for record in records(broker_url, "written.values")) == sorted(
        f"name-{n}" for n in range(50)
    )
    rows = sorted((record["value"] for record in records(broker_url, "written.rows")), key=lambda row: row["n"])
    assert rows == [{"n": n, "name": f"name-{n}"} for n in range(50)]


def test_a_topic_column_routes_each_row_and_temporal_values_become_plain(spark, broker_url):
    df = spark.sql(
        "SELECT * FROM VALUES "
        "('routed.a', 1, TIMESTAMP '2024-01-02 03:04:05.678 UTC', DATE '2024-01-02', 1.50BD), "
        "('routed.b', 2, TIMESTAMP '1970-01-01 00:00:01 UTC', DATE '1970-01-01', 2.25BD), "
        "('routed.a', 3, TIMESTAMP '1970-01-01 00:00:00 UTC', DATE '1999-12-31', 0.00BD) "
        "AS t(topic, n, at, day, price)"
    ).coalesce(1)
    writer(df, broker_url).save()  # no option topic: the column routes each row
    assert [record["value"] for record in records(broker_url, "routed.a")] == [
        {"n": 1, "at": 1704164645678, "day": "2024-01-02", "price": "1.50"},
        {"n": 3, "at": 0, "day": "1999-12-31", "price": "0.00"},
    ]
    assert [record["value"] for record in records(broker_url, "routed.b")] == [
        {"n": 2, "at": 1000, "day": "1970-01-01", "price": "2.25"}
    ]


def test_option_topic_wins_over_a_topic_column_as_in_kafkas_sink(spark, broker_url):
    # The copy job an outside check ran: read a topic, write its rows to a backup. The rows
    # carry the source's name in their topic column; option topic must decide, or the job
    # writes back into its own source.
    publish(broker_url, "copied.src", [{"id": 1}, {"id": 2}])
    source = spark.read.format("rsnet").option("url", broker_url).option("token", TOKEN).option("topic", "copied.src")
    rows = source.load().select("topic", F.from_json("value", "id long").alias("value"))
    writer(rows, broker_url, "copied.backup").save()
    assert sorted(record["value"]["id"] for record in records(broker_url, "copied.backup")) == [1, 2]
    assert ends(broker_url, "copied.src") == (0, 2), "nothing written back into the source"
    nulls = spark.createDataFrame([("routed.x", 1), (None, 2)], "topic string, n int").coalesce(1)
    with pytest.raises(PySparkException, match=r"has a null topic \(set option topic to write every row there\)"):
        writer(nulls, broker_url).save()


def test_maps_arrays_and_structs_are_written_as_msgpack_maps_and_arrays(spark, broker_url):
    df = spark.sql(
        "SELECT map('a', 1, 'b', 2) AS counts, array(struct(TIMESTAMP '1970-01-01 00:00:02 UTC' AS at)) AS events,"
        " named_struct('inner', map('k', DATE '2000-01-01')) AS nested"
    )
    writer(df, broker_url, "written.nested").save()
    (record,) = records(broker_url, "written.nested")
    assert record["value"] == {
        "counts": {"a": 1, "b": 2},
        "events": [{"at": 2000}],
        "nested": {"inner": {"k": "2000-01-01"}},
    }


def test_writer_errors_are_clear(spark, broker_url):
    df = spark.createDataFrame([(1,)], "n int")
    with pytest.raises(Exception, match="needs option topic or a string column named topic"):
        writer(df, broker_url).save()
    with pytest.raises(Exception, match="topics are append-only"):
        writer(df, broker_url, "written.x").mode("overwrite").save()
    with pytest.raises(Exception, match="column topic must be a string, not int"):
        writer(spark.createDataFrame([(1, 1)], "topic int, n int"), broker_url, "written.x").save()
    with pytest.raises(PySparkException, match="has a null value"):
        writer(spark.createDataFrame([(None,)], "value string"), broker_url, "written.null").save()
    # A bad row is named by its place in its partition: the Spark user check was told "row 0
    # of a batch" for row 50 (its place in an Arrow batch, here 16 rows each).
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "16")
    try:
        fifty = spark.range(100).selectExpr("IF(id = 50, NULL, CAST(id AS STRING)) AS value").coalesce(1)
        with pytest.raises(PySparkException, match=r"row 50 of partition 0 \(from 0\) has a null value"):
            writer(fifty, broker_url, "written.null").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    # Too large to send: said as such, not as the broker's answer about frames.
    large = spark.createDataFrame([("x" * 1_100_000,)], "value string")
    with pytest.raises(PySparkException, match=f"record too large .* at most {DEFAULT_MAX_RECORD_BYTES:,} bytes"):
        writer(large, broker_url, "written.large").save()
    # SPEC 3: map keys are strings or binary. Refused before any row is stored, naming the column
    # (an outside check saw the connection cut with PROTOCOL_ERROR after three rows were stored).
    for ddl, rows, column in [
        ("n int, m map<int, string>", [(1, {1: "a"})], "column m is a map<int,string>"),
        ("value array<struct<m: map<bigint, int>>>", [([{"m": {2: 3}}],)], r"column value\[\]\.m is a map<bigint,int>"),
    ]:
        with pytest.raises(Exception, match=column):
            writer(spark.createDataFrame(rows, ddl), broker_url, "written.keys").save()
    assert ends(broker_url, "written.keys") == (0, 0)


def test_streaming_pipeline_replayed_after_a_failed_write_stores_every_record_once(spark, broker_url, tmp_path):
    """Batch 1 fails after one of its two tasks stored its records; the restarted query replays
    batch 1 whole, and the broker drops what the first attempt stored (idempotent producer
    keys from query id, partition, batch id and row)."""
    publish(broker_url, "pipe.in", [{"n": n} for n in range(400)])
    flag = tmp_path / "fail-once"
    flag.write_text("")
    url, flag_path = broker_url, str(flag)

    def gate(n):
        # In batch 1's second task (offsets 300-399): wait until the first task's records are
        # stored (200 of batch 0 + 100), then fail the batch, once.
        import os
        import time

        if n == 350 and os.path.exists(flag_path):
            with rsnet.sync.connect(url, token=TOKEN) as client:
                while blocking.resolve_topics(client, ["pipe.out"])["pipe.out"][1] < 300:
                    time.sleep(0.02)  # another task's progress: poll the broker
            raise RuntimeError("injected failure in batch 1")
        return n

    gated = F.udf(gate, "long", useArrow=False)
    source = (
        spark.readStream.format("rsnet")
        .option("url", broker_url)
        .option("token", TOKEN)
        .option("topic", "pipe.in")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerBatch", "200")
        .option("minPartitions", "2")
        .load()
    )
    out = source.select(F.struct(gated(F.get_json_object("value", "$.n").cast("long")).alias("n")).alias("value"))

    def run():
        query = (
            out.writeStream.format("rsnet")
            .option("url", broker_url)
            .option("token", TOKEN)
            .option("topic", "pipe.out")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)

    with pytest.raises(PySparkException, match="injected failure in batch 1"):
        run()
    stored_before_replay = ends(broker_url, "pipe.out")[1]
    assert 300 <= stored_before_replay < 400  # batch 1 was partly stored

    flag.unlink()
    run()
    values = [record["value"]["n"] for record in records(broker_url, "pipe.out")]
    assert sorted(values) == list(range(400))  # none lost, none twice


def test_restart_from_the_checkpoint_resumes_where_it_left_off_and_commits_the_cursor(spark, broker_url, tmp_path):
    publish(broker_url, "resume.in", list(range(120)))

    def run():
        seen = []
        query = (
            spark.readStream.format("rsnet")
            .option("url", broker_url)
            .option("token", TOKEN)
            .option("topic", "resume.in")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerBatch", "50")
            .option("cursor", "resume-test")
            .load()
            .writeStream.foreachBatch(lambda frame, _: seen.extend(row["offset"] for row in frame.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        return seen

    assert sorted(run()) == list(range(120))
    publish(broker_url, "resume.in", list(range(120, 150)), producer="more")
    assert sorted(run()) == list(range(120, 150))

    # The cursor is where the query's last micro-batch ended.
    publish(broker_url, "resume.in", ["after"], producer="after")
    with rsnet.sync.connect(broker_url, token=TOKEN) as client:
        first = next(blocking.subscribe(client, "resume.in", {"cursor": "resume-test", "from": "earliest"}, 1))
    assert (first["offset"], first["value"]) == (150, "after")


def test_json_value_column_round_trip(spark, broker_url):
    publish(broker_url, "roundtrip.in", [{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    df = (
        spark.read.format("rsnet")
        .option("url", broker_url)
        .option("token", TOKEN)
        .option("topic", "roundtrip.in")
        .load()
    )
    parsed = df.select(F.from_json("value", "k string, v long").alias("value"))
    writer(parsed, broker_url, "roundtrip.out").save()
    assert sorted(json.dumps(r["value"], sort_keys=True) for r in records(broker_url, "roundtrip.out")) == [
        '{"k": "a", "v": 1}',
        '{"k": "b", "v": 2}',
    ]


def test_a_topic_that_ends_before_the_query_position_fails_or_restarts_from_its_beginning(spark, broker_url, tmp_path):
    """An in-memory broker restarted empty: the checkpoint's position is beyond the topic's end."""
    from .support import broker_process

    publish(broker_url, "reset.t", list(range(5)))

    def run(url, **options):
        seen = []
        stream = spark.readStream.format("rsnet").option("url", url).option("token", TOKEN)
        for key, value in {"topic": "reset.t", "startingOffsets": "earliest", **options}.items():
            stream = stream.option(key, value)
        query = (
            stream.load()
            .writeStream.foreachBatch(lambda frame, _: seen.extend(json.loads(r["value"]) for r in frame.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        return seen

    assert run(broker_url) == [0, 1, 2, 3, 4]
    (tmp_path / "fresh").mkdir()
    with broker_process(tmp_path / "fresh") as fresh:
        publish(fresh, "reset.t", ["a", "b"])
        with pytest.raises(
            PySparkException, match=r"topic 'reset.t' .* ends at offset 2, before the query's position 5"
        ):
            run(fresh)
        assert sorted(run(fresh, failOnDataLoss="false")) == ["a", "b"]
