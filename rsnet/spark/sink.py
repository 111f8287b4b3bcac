"""The ``rsnet`` sink: each row becomes one record, stored exactly once under replay.

A row's record value is its ``value`` column if it has one, else the whole row as a map
(without the ``topic`` column). Option ``topic``, when given, is every row's topic, as in
Spark's Kafka sink (so a job that reads a topic and writes its rows elsewhere never writes back
into the topic its ``topic`` column names); without it a string ``topic`` column routes each
row. A task publishes as an idempotent producer and returns only when the broker
has acknowledged every record (``$acks``), so Spark commits a task only after its records are
stored.

Idempotency keys: a streaming task publishes as producer ``spark-<query id>-p<partition>``
with sequence ``batch id * 2**32 + index of the row in that topic``; the query id is stable
across restarts from the checkpoint and Spark replays a failed micro-batch with the same rows
in the same partitions, so the replay's records carry the keys the broker already stored and
are dropped. A batch write's producer is minted once per write (``spark-<random>-p<partition>``):
a retried task stores nothing twice.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type information
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..broker import blocking
from . import options as _options
from .arrow import needs_plain_values, plain
from .source import connected

ROWS_PER_BATCH_ID = 2**32
"""Sequences a streaming task may use per micro-batch and topic."""


class Written(WriterCommitMessage):
    """What one task stored: rows per topic."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts


def write_task(opts: _options.Options, batches: Iterator[pa.RecordBatch], producer: str, base: int) -> Written:
    """Publish the rows of ``batches`` as ``producer`` with sequences from ``base``; return
    once every record is acknowledged."""
    counts: dict[str, int] = collections.defaultdict(int)
    with connected(opts) as client:
        first = next(batches, None)
        if first is not None and opts.topics:
            # One topic, the option's, whatever a topic column says: one offer streams every row.
            rows = _values(itertools.chain([first], batches))
            counts[opts.topics[0]] = blocking.publish(
                client, opts.topics[0], rows, producer=producer, first_sequence=base, wait=False
            )
        elif first is not None:
            for batch in itertools.chain([first], batches):
                for topic, values in _by_topic(batch).items():
                    counts[topic] += blocking.publish(
                        client, topic, values, producer=producer, first_sequence=base + counts[topic], wait=False
                    )
        for topic, count in counts.items():
            if count >= ROWS_PER_BATCH_ID:
                raise ValueError(f"rsnet: a task wrote {count} rows to {topic!r}; at most 2**32 - 1 per micro-batch")
            if count:
                blocking.wait_acknowledged(client, topic, producer=producer, last_sequence=base + count - 1)
    return Written(dict(counts))


def _values(batches: Iterator[pa.RecordBatch]) -> Iterator[Any]:
    for batch in batches:
        yield from _record_values(batch)


def _record_values(batch: pa.RecordBatch) -> list[Any]:
    names = batch.schema.names
    if "value" in names:
        column = batch.column(names.index("value"))
        values = column.to_pylist()
        if needs_plain_values(column.type):
            values = [plain(value, column.type) for value in values]
        if column.null_count:
            row = values.index(None)
            raise ValueError(f"rsnet: row {row} of a batch has a null value; the broker stores no null records")
        return values
    if "topic" in names:
        batch = batch.drop_columns(["topic"])
    rows = batch.to_pylist()
    if any(needs_plain_values(field.type) for field in batch.schema):
        row_type = pa.struct(list(batch.schema))
        rows = [plain(row, row_type) for row in rows]
    return rows


def _by_topic(batch: pa.RecordBatch) -> dict[str, list[Any]]:
    """The batch's record values per topic, as its ``topic`` column says (option topic is not set)."""
    topics = batch.column(batch.schema.names.index("topic")).to_pylist()
    if None in topics:
        raise ValueError(
            f"rsnet: row {topics.index(None)} of a batch has a null topic (set option topic to write every row there)"
        )
    groups: dict[str, list[Any]] = collections.defaultdict(list)
    for topic, value in zip(topics, _record_values(batch), strict=True):
        groups[topic].append(value)
    return groups


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("rsnet")``."""

    def __init__(self, opts: _options.Options, schema: StructType, *, producer: str) -> None:
        self.opts, self.schema, self.producer = opts, schema, producer

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        context = TaskContext.get()
        assert context is not None
        return write_task(self.opts, iterator, f"{self.producer}-p{context.partitionId()}", 0)


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("rsnet")``: exactly once at the sink under replay."""

    def __init__(self, opts: _options.Options, schema: StructType) -> None:
        self.opts, self.schema = opts, schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        context = TaskContext.get()
        assert context is not None
        query = context.getLocalProperty("sql.streaming.queryId")
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        if not query or batch_id is None:
            raise RuntimeError("rsnet: the streaming writer ran outside a streaming query (no query or batch id)")
        producer = f"spark-{query}-p{context.partitionId()}"
        return write_task(self.opts, iterator, producer, int(batch_id) * ROWS_PER_BATCH_ID)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: every task's records were acknowledged before it finished."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what a failed batch stored is deduplicated when Spark replays it."""
