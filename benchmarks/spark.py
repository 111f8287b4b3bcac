"""The Spark scenario: ``python -m benchmarks spark [--records N] [--quick]``.

Side by side in one run, on one local[2] SparkSession and one ``rsnet broker`` process
(durable topics, default fsync ``always``), with N small records (a sensor reading of about
60 bytes of JSON):

- batch read: ``spark.read.format("rsnet")`` of the whole topic (minPartitions 2, one task per
  core) vs Spark's own JSON-lines file source on local disk with the same schema (what a user
  would do instead), both into the ``noop`` sink: records/s;
- streaming write: a JSON-lines file read as a stream (availableNow, one micro-batch) into a
  durable topic through ``writeStream.format("rsnet")`` (acknowledged, exactly-once keys), and
  into ``noop`` for the cost of everything but the sink;
- where the time goes: the broker's delivery alone (one blocking client reading the range with
  exact demand, and the broker's CPU share meanwhile), plus Arrow building in the same
  process (what the connector's ``read`` does besides Spark's own work).

Writes ``benchmarks/SPARK.md`` (not for ``--quick``). Timings are never asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import machine

HERE = pathlib.Path(__file__).resolve().parent
SCHEMA = "sensor string, temp double, seq long"


def reading(i: int) -> dict[str, Any]:
    return {"sensor": f"s-{i % 64}", "temp": 21.5 + (i % 10) / 10, "seq": i}


@contextmanager
def broker(directory: pathlib.Path) -> Iterator[tuple[str, int]]:
    """``rsnet broker`` with durable topics in ``directory``; yields its URL and pid."""
    process = subprocess.Popen(
        [sys.executable, "-m", "rsnet.cli", "broker", "--data-dir", str(directory / "data"), "--tcp", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    printed = ""
    try:
        while "serving " not in printed:
            line = process.stderr.readline()
            if not line:
                raise RuntimeError(f"the broker exited: {printed}")
            printed += line
        yield printed.split("serving ", 1)[1].split()[0], process.pid
    finally:
        process.terminate()
        process.wait(10)
        process.stderr.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu(broker_pid: int) -> dict[str, float]:
    """CPU seconds so far of the broker, of Spark's JVM and of Python: Spark's Python workers
    (the processes below this one other than the broker and ``java``) and this process (the
    reader in the rows that read outside Spark; a waiting driver otherwise)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    head, tail = f.read().rsplit(")", 1)
            except OSError:  # it exited meanwhile
                continue
            parents[int(entry)] = int(tail.split()[1])
            names[int(entry)] = head.split("(", 1)[1]
    ours, frontier = set(), [os.getpid()]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        ours.update(children)
        frontier += children
    totals = {"broker": 0.0, "spark_jvm": 0.0, "python": time.process_time()}
    for pid in ours:
        group = "broker" if pid == broker_pid else "spark_jvm" if names[pid] == "java" else "python"
        try:
            totals[group] += cpu_seconds(pid)
        except OSError:
            pass
    return totals


def timed(action: Callable[[], Any], count: int, runs: int, pid: int) -> dict[str, Any]:
    """Records/s of ``action`` over ``runs`` runs (best and median), the share of one core
    process ``pid`` (the broker) used meanwhile (near 1.0, the broker is the bound), and the
    CPU time a record cost in each process group (median over the runs, µs)."""
    rates, shares, costs = [], [], []
    for _ in range(runs):
        before, started = process_cpu(pid), time.perf_counter()
        action()
        elapsed = time.perf_counter() - started
        after = process_cpu(pid)
        rates.append(count / elapsed)
        shares.append((after["broker"] - before["broker"]) / elapsed)
        costs.append({group: 1e6 * (after[group] - before[group]) / count for group in after})
    rates.sort()
    cpu = {group: sorted(cost[group] for cost in costs)[len(costs) // 2] for group in costs[0]}
    return {"best": rates[-1], "median": rates[len(rates) // 2], "broker_cpu": max(shares), "cpu_us": cpu}


def session() -> Any:
    import rsnet.spark

    rsnet.spark.check_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    fast_jvm = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("rsnet-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.extraJavaOptions", fast_jvm)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rsnet.spark.register(spark)
    return spark


def run(records: int, runs: int, work: pathlib.Path) -> dict[str, Any]:
    import rsnet.sync
    from rsnet.broker import blocking
    from rsnet.spark.arrow import RecordBatches

    results: dict[str, Any] = {"records": records, "runs": runs}
    lines = work / "readings"
    lines.mkdir()
    with open(lines / "part-0.json", "w") as f:
        for i in range(records):
            f.write(json.dumps(reading(i)) + "\n")
    with broker(work) as (url, broker_pid):
        with rsnet.sync.connect(url) as client:
            started = time.perf_counter()
            blocking.publish(
                client, "bench.readings", (reading(i) for i in range(records)), producer="fill", first_sequence=0
            )
            results["fill_records_per_s"] = records / (time.perf_counter() - started)

        # Where the time goes, outside Spark: the broker's delivery, then Arrow building.
        def deliver(build: bool) -> None:
            batches = RecordBatches(spark_schema) if build else None
            with rsnet.sync.connect(url) as client:
                for chunk in blocking.read_range(client, "bench.readings", 0, records, items="stored"):
                    if batches is not None:
                        batches.build("bench.readings", chunk)

        spark = session()
        from pyspark.sql import functions as F

        spark_schema = spark.read.format("rsnet").option("url", url).option("topic", "bench.readings").load().schema
        results["broker_delivery"] = timed(lambda: deliver(False), records, 1, broker_pid)
        results["delivery_and_arrow"] = timed(lambda: deliver(True), records, 1, broker_pid)

        def rsnet_read(partitions: int, schema: str | None = None) -> Callable[[], None]:
            read = spark.read.format("rsnet")
            if schema:
                read = read.schema(schema)
            df = (
                read.option("url", url)
                .option("topic", "bench.readings")
                .option("minPartitions", str(partitions))
                .load()
            )
            return lambda: df.write.format("noop").mode("overwrite").save()

        file_df = spark.read.schema(SCHEMA).json(str(lines))
        rsnet_read(2)()  # warm up the Python workers and the JIT once
        results["rsnet_batch_read"] = timed(rsnet_read(2), records, runs, broker_pid)
        results["rsnet_batch_read_1_partition"] = timed(rsnet_read(1), records, runs, broker_pid)
        results["rsnet_batch_read_schema"] = timed(rsnet_read(2, SCHEMA), records, runs, broker_pid)
        results["json_file_read"] = timed(
            lambda: file_df.write.format("noop").mode("overwrite").save(), records, runs, broker_pid
        )

        def stream_write(sink: str) -> Callable[[], None]:
            def go() -> None:
                stream = spark.readStream.schema(SCHEMA).json(str(lines)).select(F.struct("*").alias("value"))
                writer = stream.writeStream.trigger(availableNow=True)
                writer = writer.option("checkpointLocation", str(work / f"cp-{time.monotonic_ns()}"))
                if sink == "rsnet":
                    topic = f"bench.written-{time.monotonic_ns()}"
                    writer = writer.format("rsnet").option("url", url).option("topic", topic)
                else:
                    writer = writer.format("noop")
                writer.start().awaitTermination()

            return go

        results["stream_write_rsnet"] = timed(stream_write("rsnet"), records, runs, broker_pid)
        results["stream_write_noop"] = timed(stream_write("noop"), records, runs, broker_pid)
        spark.stop()
    return results


def markdown(results: dict[str, Any], command: str) -> str:
    def rate(key: str) -> str:
        value = results[key]
        cpu = value["cpu_us"]
        return (
            f"{value['median']:,.0f} (best {value['best']:,.0f}) | {value['broker_cpu']:.2f} | "
            f"{cpu['broker']:.2f} | {cpu['spark_jvm']:.2f} | {cpu['python']:.2f}"
        )

    read, file_read = results["rsnet_batch_read"]["median"], results["json_file_read"]["median"]
    meta = machine.describe(command)
    return "\n".join(
        [
            "# Spark scenario",
            "",
            f"`{command}`, {results['records']:,} records, median of {results['runs']} runs, "
            f"{meta.get('cpu', '')} ({meta.get('cores', '?')} cores, load {meta.get('load_average')}), commit {meta.get('commit')}, local[2], records/s.",
            "",
            "| measurement | records/s | broker CPU share | CPU µs/record: broker | Spark JVM | Python |",
            "|---|---|---|---|---|---|",
            f"| batch read, rsnet topic (minPartitions 2) -> noop | {rate('rsnet_batch_read')} |",
            f"| batch read, rsnet topic (1 partition) -> noop | {rate('rsnet_batch_read_1_partition')} |",
            f"| batch read, rsnet topic (minPartitions 2) with a user schema (no JSON text) -> noop | "
            f"{rate('rsnet_batch_read_schema')} |",
            f"| batch read, JSON-lines file on local disk -> noop | {rate('json_file_read')} |",
            f"| rsnet / file | {read / file_read:.2f}x | | | | |",
            f"| streaming write, JSON file -> durable rsnet topic (acknowledged) | {rate('stream_write_rsnet')} |",
            f"| streaming write, JSON file -> noop (all but the sink) | {rate('stream_write_noop')} |",
            f"| where the time goes: broker delivery alone (one blocking client, exact demand) | {rate('broker_delivery')} |",
            f"| where the time goes: delivery + Arrow building (default schema: JSON text) in one process | "
            f"{rate('delivery_and_arrow')} |",
            f"| filling the topic (one blocking producer, acknowledged) | {results['fill_records_per_s']:,.0f} | | | | |",
            "",
            "Reading the numbers: the broker CPU share is of one core, measured during the row (the broker is",
            "one process, one thread): near 1.0 the broker's delivery is the bound. The CPU columns say where",
            "the time goes, as CPU time a record cost in the broker, in Spark's JVM (driver and executor",
            "threads: Arrow to rows, the sink) and in Python: Spark's Python workers (the connector: decoding",
            "the records, Arrow building, JSON text for the default schema), or the reading process in the",
            "rows outside Spark. On two cores their sum bounds",
            "the rate at 2 / sum. The file source's cost is all in the JVM (its JSON parsing). For writes into",
            "a durable topic the broker fsyncs (`always`) each append, and a producer gets demand back only",
            "after its append. Spark's own fixed costs (query start, checkpoint) weigh on small runs; this",
            "machine is shared, so compare rows of one run, not runs.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks spark", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20,000 records, one run, no SPARK.md")
    args = parser.parse_args(argv)
    records, runs = (20_000, 1) if args.quick else (args.records, args.runs)
    work = pathlib.Path(tempfile.mkdtemp(prefix="rsnet-spark-bench-"))
    try:
        results = run(records, runs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    command = "python -m benchmarks spark " + " ".join(argv if argv is not None else sys.argv[2:])
    page = markdown(results, command.strip())
    print(page)
    if not args.quick:
        (HERE / "SPARK.md").write_text(page)
    return 0
