"""The ``rsnet`` data source: broker topics as a Spark batch and streaming source and sink.

Where each part runs: ``RsnetDataSource`` is created on the driver; the planning calls of a
stream reader (``initialOffset``, ``latestOffset``, ``partitions``, ``commit``) run in one
long-lived Python process the JVM starts; ``read`` and the writers' ``write`` run in executor
worker processes. So offsets are plain JSON, and ``read`` opens its own blocking connection per
partition (no event loop can be yielded out of).

Offsets are ``{"topics": {topic: next offset}, "query": id}``: the broker's own per-topic
offsets, and an id minted when the query first starts, kept in the checkpoint with them (the
default cursor name ``spark-<id>`` comes from it, so it survives restarts).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType

from ..broker import blocking
from ..broker.codes import BrokerCode
from ..errors import ConnectionLost, HandshakeError, StreamError
from ..protocol import ErrorCode
from . import options as _options
from .arrow import DEFAULT_SCHEMA, ROWS_PER_BATCH, RecordBatches

log = logging.getLogger("rsnet.spark")

CONNECT_TIMEOUT = 10.0
"""Seconds to reach the broker and complete the handshake."""

RECONNECT_WITHIN = 60.0
"""Seconds a running query keeps reconnecting to a broker it lost (a restart, a deploy: the
broker said GOING_AWAY, or the connection broke, or nobody answers) before it fails."""

RETRY_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0)
"""Seconds between reconnection attempts, the last repeated."""

_T = TypeVar("_T")


COLLECT_AFTER = 100_000
"""Python's young-generation threshold while a partition is read (the default is 700)."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Run Python's cyclic garbage collector less often, until the block ends.

    A read holds each record (a list) until its Arrow batch is built: at the default
    threshold the collector runs every 700 of them, and promoting them brings full
    collections over the worker's whole heap (pyspark, pyarrow). Measured: a third of the
    read's CPU in the worker (2.0 -> 1.3 µs a record). The collector still runs, after
    COLLECT_AFTER allocations, so the memory garbage cycles can hold stays bounded; the
    worker's own threshold is back when the read ends, as it was.
    """
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], COLLECT_AFTER), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


class DataLossError(RuntimeError):
    """Records the query needs were removed by retention or a purge (``failOnDataLoss`` is true)."""


class RsnetDataSource(DataSource):
    """Format ``rsnet``: see the README's Spark section for the options."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = _options.parse(options, need_topic=False)  # bad values fail at load()/save()

    @classmethod
    def name(cls) -> str:
        return "rsnet"

    def schema(self) -> str:
        return DEFAULT_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        self.parsed.check_applies("batch read")
        return RangeReader(_with_topic(self.parsed), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self.parsed.check_applies("stream read")
        return StreamReader(_with_topic(self.parsed), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import BatchWriter

        _check_writable(self.parsed, schema, overwrite)
        return BatchWriter(self.parsed, schema, producer=f"spark-{uuid.uuid4().hex[:12]}")

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import StreamWriter

        _check_writable(self.parsed, schema, overwrite)
        return StreamWriter(self.parsed, schema)


def _with_topic(opts: _options.Options) -> _options.Options:
    if not opts.topics:
        raise ValueError("rsnet: option topic is required: a topic, a comma-separated list, or a pattern (orders.*)")
    return opts


def _check_writable(opts: _options.Options, schema: StructType, overwrite: bool) -> None:
    opts.check_applies("write")
    if overwrite:
        raise ValueError("rsnet: topics are append-only; write with mode 'append'")
    if len(opts.topics) > 1 or any("*" in name or ">" in name for name in opts.topics):
        raise ValueError(f"rsnet: a writer's option topic must be one topic name, got {','.join(opts.topics)!r}")
    if "topic" in schema.fieldNames():
        if schema["topic"].dataType.simpleString() != "string":
            raise ValueError(f"rsnet: column topic must be a string, not {schema['topic'].dataType.simpleString()}")
    elif not opts.topics:
        raise ValueError("rsnet: a writer needs option topic or a string column named topic")
    for field in schema.fields:
        _check_map_keys(field.name, field.dataType)


def _check_map_keys(path: str, data_type: DataType) -> None:
    """SPEC 3: a map's keys are strings or bytes. A map column keyed otherwise is refused before
    a row is written, naming the column (the broker would refuse the frame, and end the write
    partway, after storing the rows before it)."""
    if isinstance(data_type, MapType):
        if not isinstance(data_type.keyType, StringType | BinaryType):
            raise ValueError(
                f"rsnet: column {path} is a {data_type.simpleString()}: map keys must be strings or binary "
                f"(cast them, e.g. F.transform_keys(col, lambda k, v: k.cast('string')))"
            )
        _check_map_keys(f"{path}[value]", data_type.valueType)
    elif isinstance(data_type, ArrayType):
        _check_map_keys(f"{path}[]", data_type.elementType)
    elif isinstance(data_type, StructType):
        for field in data_type.fields:
            _check_map_keys(f"{path}.{field.name}", field.dataType)


# -- connections and the errors users meet -------------------------------------------------------


def _explained(opts: _options.Options, error: StreamError) -> Exception:
    if error.code == ErrorCode.UNKNOWN_PUBLISHER:
        return LookupError(
            f"rsnet: {error.message} at {opts.url} (and the broker refuses subscriptions to missing topics)"
        )
    if error.code == ErrorCode.UNAUTHORIZED:
        return PermissionError(f"rsnet: the token is not allowed this at {opts.url}: {error.message}")
    if error.code == ErrorCode.REJECTED:
        return ValueError(f"rsnet: the broker at {opts.url} rejected a request: {error.message}")
    if error.code == ErrorCode.FRAME_TOO_LARGE:  # refused here, before it was sent
        return ValueError(
            f"rsnet: record too large for the broker at {opts.url} ({error.message}): a record may take at most"
            " 1,047,552 bytes encoded"
        )
    return RuntimeError(f"rsnet: the broker at {opts.url} answered {error}")


class Reconnecting:
    """A connection to the broker that outlives the broker's restarts.

    :meth:`call` runs an operation with the client; when the connection is lost, or the
    broker is going away (SIGTERM: it refuses new streams, then closes), it reconnects, backing
    off (:data:`RETRY_DELAYS`), and runs the operation again, for up to
    :data:`RECONNECT_WITHIN` seconds in a row; then it raises ConnectionError. So operations
    must be safe to run again: reading offsets, committing a cursor, reading a range from
    where the last attempt got to. ``patient``: a failure to reach the broker at the very
    first attempt is retried too (a task: the planner has just reached it); otherwise it
    fails at once (a query, or a batch read, starting against a wrong address). Errors are
    what users meet: ValueError (the url), PermissionError (the token), ConnectionError,
    and :func:`_explained`'s for the broker's refusals.
    """

    def __init__(self, opts: _options.Options, *, patient: bool) -> None:
        self.opts = opts
        self._client: Any = None
        self._reached = patient  # once reached, a lost broker is waited for
        self._failing_since: float | None = None
        self._attempt = 0

    def client(self) -> Any:
        """The connection, opened if it is not (raises as :meth:`lost` says)."""
        if self._client is None or self._client.closed:
            try:
                self._client = blocking.connect(self.opts.url, token=self.opts.token, timeout=CONNECT_TIMEOUT)
            except ValueError as bad:
                raise ValueError(f"rsnet: option url {self.opts.url!r} is not usable: {bad}") from None
            self._reached = True
        return self._client

    def call(self, operation: Callable[[Any], _T], *, after_loss: Callable[[], None] | None = None) -> _T:
        """``operation(client)``, again on a new connection after a transient failure (and
        ``after_loss()`` before each new attempt)."""
        while True:
            try:
                result = operation(self.client())
            except (ConnectionLost, StreamError) as error:
                self.lost(error)
                if after_loss is not None:
                    after_loss()
                continue
            self.succeeded()
            return result

    def succeeded(self) -> None:
        """An operation went through: the next failure starts a new RECONNECT_WITHIN."""
        self._failing_since, self._attempt = None, 0

    def lost(self, error: ConnectionLost | StreamError) -> None:
        """``error`` ended the last attempt: wait before the next one if it is transient and
        RECONNECT_WITHIN has not passed; otherwise raise what it means for the user."""
        if isinstance(error, StreamError) and error.code != ErrorCode.GOING_AWAY:
            raise _explained(self.opts, error) from None
        if isinstance(error, HandshakeError) and error.code == ErrorCode.UNAUTHORIZED:
            raise PermissionError(
                f"rsnet: the broker at {self.opts.url} refused the token (option token): {error}"
            ) from None
        self.close()
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if not self._reached:
            raise ConnectionError(f"rsnet: cannot reach the broker at {self.opts.url}: {error}") from None
        if now - self._failing_since >= RECONNECT_WITHIN:
            raise ConnectionError(
                f"rsnet: lost the broker at {self.opts.url} and could not reconnect for {RECONNECT_WITHIN:g} s: {error}"
            ) from None
        delay = RETRY_DELAYS[min(self._attempt, len(RETRY_DELAYS) - 1)]
        self._attempt += 1
        log.warning("rsnet: %s; reconnecting to %s in %g s", error, self.opts.url, delay)
        time.sleep(delay)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


# -- offsets and partitions ----------------------------------------------------------------------


class Range(InputPartition):
    """One Spark task's share: offsets ``[start, end)`` of one topic."""

    def __init__(self, topic: str, start: int, end: int) -> None:
        super().__init__((topic, start, end))
        self.topic, self.start, self.end = topic, start, end


def plan(start: dict[str, int], end: dict[str, int], min_partitions: int | None) -> list[Range]:
    """Ranges covering ``start``..``end`` per topic: one per topic with records, or, with
    ``min_partitions``, about that many in all, each topic's range split in proportion to its
    size (like the Kafka source's minPartitions)."""
    sizes = {topic: end[topic] - start.get(topic, end[topic]) for topic in end}
    sizes = {topic: size for topic, size in sizes.items() if size > 0}
    total = sum(sizes.values())
    ranges = []
    for topic, size in sizes.items():
        pieces = 1
        if min_partitions is not None and min_partitions > len(sizes):
            pieces = min(size, max(1, round(min_partitions * size / total)))
        first = start[topic]
        for index in range(pieces):
            lo, hi = first + size * index // pieces, first + size * (index + 1) // pieces
            ranges.append(Range(topic, lo, hi))
    return ranges


def read_ranges(opts: _options.Options, builder: RecordBatches, part: Range) -> Iterator[Any]:
    """The records of ``part`` as Arrow record batches: exactly the offsets of its range that
    the broker still has (a gap, trimmed by retention, damaged on disk, or skipped because
    the read lagged on a ``drop`` topic, fails the read, or, with failOnDataLoss=false, is
    logged and skipped)."""
    position, end = part.start, part.end
    pending: list[list[Any]] = []  # [offset, timestamp, value, producer, sequence] each
    link = Reconnecting(opts, patient=True)
    with fewer_collections(), contextlib.closing(link):
        while position < end:
            try:
                # After a lost connection, from where the last attempt got to: no record twice.
                for chunk in blocking.read_range(link.client(), part.topic, position, end, items="stored"):
                    if not chunk:
                        continue
                    first = chunk[0][0]
                    if first != position or chunk[-1][0] - first + 1 != len(chunk):
                        missing = _first_gap(chunk, position)
                        _lost(opts, part.topic, missing, SKIPPED)
                    position = chunk[-1][0] + 1
                    link.succeeded()
                    pending.extend(chunk)
                    while len(pending) >= ROWS_PER_BATCH:
                        yield builder.build(part.topic, pending[:ROWS_PER_BATCH])
                        del pending[:ROWS_PER_BATCH]
                if position < end:  # the broker moved the read past the rest of the range
                    _lost(opts, part.topic, (position, end), SKIPPED)
                break
            except ConnectionLost as lost:
                link.lost(lost)
                continue
            except StreamError as error:
                if error.code not in (BrokerCode.OFFSET_TRIMMED, BrokerCode.OFFSET_DAMAGED) or not isinstance(
                    error.data, dict
                ):
                    link.lost(error)  # GOING_AWAY: again on a new connection; others raise
                    continue
                if error.code == BrokerCode.OFFSET_TRIMMED:
                    available = int(error.data["first_available"])
                    _lost(opts, part.topic, (position, min(available, end)), "removed by retention or a purge")
                elif error.code == BrokerCode.OFFSET_DAMAGED:
                    available = int(error.data["next_intact"])
                    damaged = (int(error.data["first"]), min(available, end))
                    _lost(opts, part.topic, damaged, "damaged on the broker's disk")
                position = max(position, available)
    if pending:
        yield builder.build(part.topic, pending)


SKIPPED = (
    "skipped by the broker: the topic's slow_subscriber policy is drop, and this read lagged more than its max_lag "
    "behind the newest record"
)


def _first_gap(chunk: list[list[Any]], position: int) -> tuple[int, int]:
    expected = position
    for offset, *_ in chunk:
        if offset != expected:
            return expected, offset
        expected += 1
    return expected, expected


def _lost(opts: _options.Options, topic: str, missing: tuple[int, int], why: str) -> None:
    message = f"rsnet: offsets {missing[0]} to {missing[1] - 1} of topic {topic!r} at {opts.url} are gone ({why})"
    if opts.fail_on_data_loss:
        raise DataLossError(f"{message}; set option failOnDataLoss to false to skip them with a warning")
    log.warning("%s; skipped (failOnDataLoss=false)", message)


def _initial(opts: _options.Options, ends: dict[str, tuple[int, int]], default: str) -> dict[str, int]:
    starting = opts.starting or default
    if starting == "earliest":
        return {topic: first for topic, (first, _) in ends.items()}
    if starting == "latest":
        return {topic: last for topic, (_, last) in ends.items()}
    assert isinstance(starting, dict)
    unknown = sorted(set(starting) - set(ends))
    if unknown:
        raise ValueError(f"rsnet: option startingOffsets names topics not read: {', '.join(unknown)}")
    beyond = {topic: offset for topic, offset in starting.items() if offset > ends[topic][1]}
    if beyond:
        detail = ", ".join(f"{topic} {offset} (its next is {ends[topic][1]})" for topic, offset in beyond.items())
        raise ValueError(f"rsnet: option startingOffsets is beyond the end of: {detail}")
    # Topics the JSON does not name start at their earliest retained record.
    return {topic: starting.get(topic, first) for topic, (first, _) in ends.items()}


# -- batch reads ---------------------------------------------------------------------------------


class RangeReader(DataSourceReader):
    """``spark.read``: the offsets from ``startingOffsets`` (default earliest) to
    ``endingOffsets`` (default latest), resolved when the read is planned."""

    def __init__(self, opts: _options.Options, schema: StructType) -> None:
        self.opts, self.schema = opts, schema

    def partitions(self) -> list[Range]:
        opts = self.opts
        with contextlib.closing(Reconnecting(opts, patient=False)) as link:
            ends = link.call(lambda client: blocking.resolve_topics(client, opts.topics))
        start = _initial(opts, ends, "earliest")
        if opts.ending == "latest":
            end = {topic: last for topic, (_, last) in ends.items()}
        else:
            assert isinstance(opts.ending, dict)
            end = {topic: opts.ending.get(topic, last) for topic, (_, last) in ends.items()}
            beyond = {topic: (end[topic], ends[topic][1]) for topic in end if end[topic] > ends[topic][1]}
            if beyond:
                raise ValueError(f"rsnet: endingOffsets beyond the end of the topic (asked, next): {beyond}")
        backwards = {topic: (start[topic], end[topic]) for topic in end if start[topic] > end[topic]}
        if backwards:
            detail = ", ".join(f"{topic} {first} > {last}" for topic, (first, last) in backwards.items())
            raise ValueError(f"rsnet: startingOffsets after endingOffsets for: {detail}")
        return plan(start, end, opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, Range):
            # Nothing to read (no topic, or no record in the range): for an empty plan Spark
            # runs one task with a placeholder partition, which reads nothing.
            return iter(())
        return read_ranges(self.opts, RecordBatches(self.schema), partition)


# -- streaming reads -----------------------------------------------------------------------------


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches of the records published since the last one."""

    def __init__(self, opts: _options.Options, schema: StructType) -> None:
        self.opts, self.schema = opts, schema
        # The planner process is long-lived: one connection, reopened when the broker restarts.
        self._link = Reconnecting(opts, patient=False)
        self._target: dict[str, tuple[int, int]] | None = None  # availableNow's fixed end
        self._committed: dict[str, int] = {}  # the cursor's offsets as last committed

    def _ends(self) -> dict[str, tuple[int, int]]:
        if self._target is not None:
            return self._target
        topics = self.opts.topics
        return self._link.call(lambda client: blocking.resolve_topics(client, topics))

    def initialOffset(self) -> dict[str, Any]:
        start = _initial(self.opts, self._ends(), "latest")
        return {"topics": start, "query": uuid.uuid4().hex[:12]}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_batch is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_records_per_batch)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        ends = self._ends()
        begin = start["topics"]
        for topic, (first, last) in ends.items():
            if begin.get(topic, first) > last:
                self._moved_back(topic, begin[topic], first, last)
        # Spark plans the next micro-batch only once the one ending at ``start`` is done (and
        # a restart re-runs an unfinished batch before planning): ``start`` is processed.
        # Committing it here too keeps the cursor current after the last batch of an
        # availableNow run, which is never followed by a commit() call.
        self.commit(start)
        # A topic seen for the first time (a pattern matched a new one) enters this batch's end
        # at its earliest retained record, with no records (``start`` does not name it, so the
        # batch could not read a range of it): it is read from the next micro-batch on.
        end = {topic: begin.get(topic, first) for topic, (first, _) in ends.items()}
        # Records removed before they were read (retention, a purge) are not counted against
        # the limit: the batch reads from the topic's first record, and reports the rest
        # missing (failOnDataLoss) once, not limit by limit over many batches.
        start_at = {topic: max(end[topic], ends[topic][0]) for topic in end}
        available = {topic: max(0, ends[topic][1] - start_at[topic]) if topic in begin else 0 for topic in end}
        for topic, (first, last) in ends.items():
            if end[topic] > last:  # skipped (failOnDataLoss=false): this batch moves to the
                end[topic] = first  # topic's start, the next reads from there
                available[topic] = 0
        if isinstance(limit, ReadMaxRows):
            # The turn moves on by the limit every batch (what it reads): round robin.
            available = share(available, limit.max_rows, turn=sum(start_at.values()))
        for topic, count in available.items():
            if count:
                end[topic] = start_at[topic] + count
        for topic, offset in begin.items():  # a topic no longer listed keeps its position
            end.setdefault(topic, offset)
        # The split is the batch's own: a replay after a crash splits its rows as the first
        # run did, whatever minPartitions says by then (a sink's exactly-once keys follow the
        # partitions), and a new batch follows the option.
        return {"topics": end, "query": start["query"], "minPartitions": self.opts.min_partitions}

    def _moved_back(self, topic: str, position: int, first: int, last: int) -> None:
        message = (
            f"rsnet: topic {topic!r} at {self.opts.url} ends at offset {last}, before the query's position "
            f"{position} (was it deleted and created again, or did an in-memory broker restart?)"
        )
        if self.opts.fail_on_data_loss:
            raise DataLossError(f"{message}; set option failOnDataLoss to false to go on from offset {first}")
        log.warning("%s; going on from offset %d (failOnDataLoss=false)", message, first)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._ends()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[Range]:
        split = end["minPartitions"] if "minPartitions" in end else self.opts.min_partitions  # (older checkpoints)
        return plan(start["topics"], end["topics"], split)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, Range):  # as for a batch read: nothing to read
            return iter(())
        return read_ranges(self.opts, RecordBatches(self.schema), partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Advance the query's cursor on every topic to ``end`` (records before it are
        processed), so an operator can see how far the query has come. Spark's checkpoint,
        not the cursor, is what a restart resumes from."""
        cursor = self.opts.cursor or f"spark-{end['query']}"
        for topic, offset in end["topics"].items():
            if self._committed.get(topic) == offset:
                continue
            try:
                blocking.commit(self._link.client(), topic, cursor, offset)
            except (StreamError, ConnectionLost, ConnectionError) as error:
                # The cursor only informs operators: a topic that moved back (reported by
                # latestOffset), a topic gone, or a lost connection (the next planning call
                # reconnects, and commits again) must not stop the query here. A topic not
                # created yet (a query may start first) has nothing to say: no warning.
                missing = isinstance(error, StreamError) and error.code == ErrorCode.UNKNOWN_PUBLISHER
                (log.debug if missing else log.warning)(
                    "rsnet: cannot commit cursor %r of %r at %d: %s", cursor, topic, offset, error
                )
                if missing:
                    continue  # committed once the topic exists
                if not isinstance(error, StreamError) or error.code == ErrorCode.GOING_AWAY:
                    self._link.close()
                    return
            self._committed[topic] = offset

    def stop(self) -> None:
        self._link.close()


def share(available: dict[str, int], limit: int, turn: int = 0) -> dict[str, int]:
    """At most ``limit`` records in all (the exact per-batch bound of maxRecordsPerBatch): one
    for every topic that has some, so each moves on every batch as in Kafka's source, the rest
    in proportion to what each has left, the remainder to the largest fractions. If more than
    ``limit`` topics have some, ``limit`` of them get one each, in name order from the
    ``turn``-th (modulo their number): a caller whose turn moves on by ``limit`` each batch
    reads them round robin (in name order from the first, the last ones waited as long as the
    first ones had records)."""
    total = sum(available.values())
    if total <= limit:
        return available
    having = sorted(topic for topic, count in available.items() if count > 0)
    if len(having) > limit:
        first = turn % len(having)
        having = having[first:] + having[:first]
    shares = dict.fromkeys(available, 0)
    for topic in having[:limit]:
        shares[topic] = 1
    left = limit - min(limit, len(having))
    if left:
        rest = {topic: available[topic] - 1 for topic in having}
        rest_total = sum(rest.values())  # more than left: total > limit
        for topic in having:
            shares[topic] += rest[topic] * left // rest_total
        remainder = limit - sum(shares.values())
        by_fraction = sorted(having, key=lambda topic: (-(rest[topic] * left % rest_total), topic))
        for topic in by_fraction[:remainder]:
            shares[topic] += 1
    return shares
