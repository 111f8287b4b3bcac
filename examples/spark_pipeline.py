"""A Spark Structured Streaming pipeline between two rsnet broker topics.

It reads sensor readings (JSON values ``{"sensor": str, "temp": float, "time": ms since the
epoch}``) from one topic, counts and averages them per sensor and 10-second event-time window
(a watermark of 10 seconds closes a window once readings 10 s past its end arrive), and writes
one record per closed window to another topic. Exactly once at the sink: a restart from the
checkpoint replays the unfinished micro-batch and the broker drops what it already stored.

    rsnet broker                                                  # serves tcp://127.0.0.1:7600
    python examples/spark_pipeline.py produce                     # readings, in real time
    python examples/spark_pipeline.py run --checkpoint /tmp/cp    # the Spark query
    rsnet sub tcp://127.0.0.1:7600 sensors.windows --from earliest

Needs the ``spark`` extra (in a clone: ``pip install -e '.[spark]'``) and Java 17.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from typing import Any

READING = "sensor string, temp double, time long"


def pipeline(spark: Any, url: str, source: str, *, token: str | None = None) -> Any:
    """The streaming DataFrame of per-window aggregates, as record values for a topic."""
    from pyspark.sql import functions as F

    reader = spark.readStream.format("rsnet").option("url", url).option("topic", source)
    if token:
        reader = reader.option("token", token)
    records = reader.option("startingOffsets", "earliest").load()
    readings = (
        records.select(F.from_json("value", READING).alias("reading"))
        .select("reading.*")
        .where(F.col("sensor").isNotNull() & F.col("time").isNotNull())
        .withColumn("event_time", F.timestamp_millis("time"))
    )
    windows = (
        readings.withWatermark("event_time", "10 seconds")
        .groupBy(F.window("event_time", "10 seconds"), "sensor")
        .agg(F.count("*").alias("readings"), F.avg("temp").alias("avg_temp"), F.max("temp").alias("max_temp"))
    )
    # One record per window: a map whose timestamps the sink writes as ms since the epoch.
    return windows.select(
        F.struct(
            F.col("window.start").alias("start"),
            F.col("window.end").alias("end"),
            "sensor",
            "readings",
            F.round("avg_temp", 3).alias("avg_temp"),
            "max_temp",
        ).alias("value")
    )


def start(
    spark: Any,
    url: str,
    source: str,
    sink: str,
    checkpoint: str,
    *,
    token: str | None = None,
    available_now: bool = False,
) -> Any:
    """Start the query (append mode: a window is written once, when the watermark closes it)."""
    writer = (
        pipeline(spark, url, source, token=token)
        .writeStream.format("rsnet")
        .outputMode("append")
        .option("url", url)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
    )
    if token:
        writer = writer.option("token", token)
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="2 seconds")
    return writer.start()


def session() -> Any:
    """A local Spark session with the rsnet format registered."""
    import rsnet.spark

    rsnet.spark.check_java()
    # Spark's Python workers import rsnet too: run them with this interpreter (its packages).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("rsnet-spark-pipeline")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    rsnet.spark.register(spark)
    return spark


def reach(url: str, token: str | None) -> None:
    """Connect to the broker once (and leave): an unreachable broker or a refused token raises
    here, in a line, rather than as the failure of a started query, which Spark reports with
    both tracebacks and its whole plan."""
    import rsnet.sync

    with rsnet.sync.connect(url, token=token):
        pass


def produce(url: str, topic: str, token: str | None, rate: float) -> None:
    """Publish a reading per sensor every ``1 / rate`` seconds, stamped with the current time."""
    import rsnet.sync
    from rsnet.broker import blocking

    producer = f"sensors-{random.getrandbits(32):08x}"
    sequence = 0
    with rsnet.sync.connect(url, token=token) as client:
        print(f"publishing 3 readings every {1 / rate:g} s to {topic} at {url} (Ctrl-C stops)", file=sys.stderr)
        while True:
            now = int(time.time() * 1000)
            readings = [
                {"sensor": sensor, "temp": round(base + random.uniform(-1, 1), 2), "time": now}
                for sensor, base in (("kitchen", 21.0), ("hall", 18.0), ("garage", 9.0))
            ]
            blocking.publish(client, topic, readings, producer=producer, first_sequence=sequence)
            sequence += len(readings)
            time.sleep(1 / rate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "produce"])
    parser.add_argument("--url", default="tcp://127.0.0.1:7600")
    parser.add_argument("--source", default="sensors.readings")
    parser.add_argument("--sink", default="sensors.windows")
    parser.add_argument("--token")
    parser.add_argument("--checkpoint", default="/tmp/rsnet-spark-pipeline")
    parser.add_argument("--rate", type=float, default=2.0, help="produce: readings per sensor per second")
    parser.add_argument("--available-now", action="store_true", help="run: process what is there, then stop")
    args = parser.parse_args(argv)
    from rsnet import RsnetError

    if args.command == "produce":
        try:
            produce(args.url, args.source, args.token, args.rate)
        except KeyboardInterrupt:
            pass
        except RsnetError as error:  # no broker there, a refused token...: said in a line
            print(f"spark_pipeline produce: {error}", file=sys.stderr)
            return 1
        return 0
    try:
        reach(args.url, args.token)
    except RsnetError as error:  # said in a line before Spark starts, not in its query's failure
        print(f"spark_pipeline run: {error}", file=sys.stderr)
        return 1
    spark = session()
    query = start(
        spark, args.url, args.source, args.sink, args.checkpoint, token=args.token, available_now=args.available_now
    )
    return 130 if run_until_interrupted(spark, query) else 0


def run_until_interrupted(spark: Any, query: Any) -> bool:
    """Wait for the query to end (with ``--available-now``) or for Ctrl-C, which stops it and
    Spark; returns whether Ctrl-C stopped it. Ctrl-C only sets a flag that the wait looks at
    every second: a KeyboardInterrupt raised inside a call into the JVM leaves py4j half-way
    through it, and every call after that fails with tracebacks."""
    interrupted = threading.Event()
    signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    while not interrupted.is_set() and not query.awaitTermination(1):
        pass
    if interrupted.is_set():
        query.stop()
        spark.stop()
    return interrupted.is_set()


if __name__ == "__main__":
    sys.exit(main())
