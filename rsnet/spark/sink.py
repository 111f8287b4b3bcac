"""The ``rsnet`` sink: each row becomes one record, stored exactly once under replay.

A row's record value is its ``value`` column if it has one, else the whole row as a map
(without the ``topic`` column). Option ``topic``, when given, is every row's topic, as in
Spark's Kafka sink (so a job that reads a topic and writes its rows elsewhere never writes back
into the topic its ``topic`` column names); without it a string ``topic`` column routes each
row. A task publishes as an idempotent producer and returns only when the broker
has acknowledged every record (``$acks``), so Spark commits a task only after its records are
stored. A task that loses the broker (a restart) reconnects and publishes what was not yet
acknowledged again (:func:`write_task`).

Idempotency keys: a streaming task publishes as producer ``spark-<query id>-p<partition>``
with sequence ``batch id * 2**32 + index of the row in that topic``; the query id is stable
across restarts from the checkpoint and Spark replays a failed micro-batch with the same rows
in the same partitions, so the replay's records carry the keys the broker already stored and
are dropped. A batch write's producer is minted once per write (``spark-<random>-p<partition>``):
a retried task stores nothing twice.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type information
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..broker import blocking
from . import options as _options
from .arrow import needs_plain_values, plain
from .source import Reconnecting

ROWS_PER_BATCH_ID = 2**32
"""Sequences a streaming task may use per micro-batch and topic."""


class Written(WriterCommitMessage):
    """What one task stored: rows per topic."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts


UNCONFIRMED_ROWS = 50_000
"""Rows a task keeps after publishing them until the broker acknowledged them: what it sends
again on a new connection if it loses the broker (a restart) before they were stored. Each
batch's acknowledgements are awaited only once this many newer rows were published, so the
wait for a topic's fsync overlaps the next rows (50,000 rows per fsync interval, 100 ms by
default: above what one task writes)."""


@dataclasses.dataclass
class _Published:
    """One Arrow batch's rows, published and not yet known stored: (topic, first sequence,
    values) per topic the rows went to."""

    groups: list[tuple[str, int, list[Any]]]

    @property
    def rows(self) -> int:
        return sum(len(values) for _, _, values in self.groups)


def write_task(opts: _options.Options, batches: Iterator[pa.RecordBatch], producer: str, base: int) -> Written:
    """Publish the rows of ``batches`` as ``producer`` with sequences from ``base``; return
    once every record is acknowledged.

    Rows go out batch by batch, and a batch is kept until its acknowledgements came: if the
    connection is lost, or the broker goes away (a restart), the task reconnects
    (:class:`~rsnet.spark.source.Reconnecting`, up to RECONNECT_WITHIN seconds) and publishes
    every batch not known stored again, with the same sequences, so the broker stores each
    row once."""
    counts: dict[str, int] = collections.defaultdict(int)
    unconfirmed: collections.deque[_Published] = collections.deque()
    link = Reconnecting(opts, patient=True)
    resend = False  # the connection was lost: every unconfirmed batch goes out again first

    def publish(client: Any, batch: _Published) -> None:
        nonlocal resend
        for earlier in list(unconfirmed) if resend else [batch]:
            for topic, first, values in earlier.groups:
                blocking.publish(client, topic, values, producer=producer, first_sequence=first, wait=False)
        resend = False

    def confirm(client: Any, batch: _Published) -> None:
        if resend:
            publish(client, batch)
        for topic, first, values in batch.groups:
            blocking.wait_acknowledged(client, topic, producer=producer, last_sequence=first + len(values) - 1)

    def lost() -> None:
        nonlocal resend
        resend = True

    def attempt(operation: Callable[[Any, _Published], None], batch: _Published) -> None:
        link.call(lambda client: operation(client, batch), after_loss=lost)

    rows = 0  # of this task, before the batch: a bad row is named by its place in the task's rows
    with contextlib.closing(link):
        for arrow_batch in batches:
            published = _Published([])
            for topic, values in _groups(arrow_batch, opts, rows):
                if counts[topic] + len(values) >= ROWS_PER_BATCH_ID:
                    raise ValueError(f"rsnet: a task wrote more than 2**32 - 1 rows to {topic!r} in one micro-batch")
                published.groups.append((topic, base + counts[topic], values))
                counts[topic] += len(values)
            rows += arrow_batch.num_rows
            if not published.groups:
                continue
            unconfirmed.append(published)
            attempt(publish, published)
            while sum(batch.rows for batch in unconfirmed) - unconfirmed[0].rows >= UNCONFIRMED_ROWS:
                attempt(confirm, unconfirmed[0])
                unconfirmed.popleft()
        while unconfirmed:
            attempt(confirm, unconfirmed[0])
            unconfirmed.popleft()
    return Written(dict(counts))


def _groups(batch: pa.RecordBatch, opts: _options.Options, first_row: int) -> Iterator[tuple[str, list[Any]]]:
    """The batch's record values per topic: all to option topic if given, else by the ``topic``
    column. ``first_row``: the task's rows before this batch (to name a bad row)."""
    if opts.topics:
        yield opts.topics[0], _record_values(batch, first_row)
    else:
        yield from _by_topic(batch, first_row).items()


def _row(index: int) -> str:
    """A row of the task by its place among the task's rows, for an error."""
    context = TaskContext.get()
    where = f"partition {context.partitionId()}" if context is not None else "this task"
    return f"row {index} of {where} (from 0)"


def _record_values(batch: pa.RecordBatch, first_row: int) -> list[Any]:
    names = batch.schema.names
    if "value" in names:
        column = batch.column(names.index("value"))
        values = column.to_pylist()
        if needs_plain_values(column.type):
            values = [plain(value, column.type) for value in values]
        if column.null_count:
            row = _row(first_row + values.index(None))
            raise ValueError(f"rsnet: {row} has a null value; the broker stores no null records")
        return values
    if "topic" in names:
        batch = batch.drop_columns(["topic"])
    rows = batch.to_pylist()
    if any(needs_plain_values(field.type) for field in batch.schema):
        row_type = pa.struct(list(batch.schema))
        rows = [plain(row, row_type) for row in rows]
    return rows


def _by_topic(batch: pa.RecordBatch, first_row: int) -> dict[str, list[Any]]:
    """The batch's record values per topic, as its ``topic`` column says (option topic is not set)."""
    topics = batch.column(batch.schema.names.index("topic")).to_pylist()
    if None in topics:
        raise ValueError(
            f"rsnet: {_row(first_row + topics.index(None))} has a null topic (set option topic to write every row"
            " there)"
        )
    groups: dict[str, list[Any]] = collections.defaultdict(list)
    for topic, value in zip(topics, _record_values(batch, first_row), strict=True):
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
