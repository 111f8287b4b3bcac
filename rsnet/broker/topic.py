"""A topic: an append-only log, the producers feeding it, and the subscriptions reading it.

Every record gets the next offset of its topic and a timestamp. A subscription reads the log
from its own position at its own pace (its demand); what a subscriber receives is a map
``{"topic", "offset", "timestamp", "value"}``, plus ``"skipped": n`` on the first record after
the ``drop`` policy made it skip ``n`` records.

Slow subscribers, per topic (``max_lag`` is in records):

- ``backpressure``: producers are asked for no more than keeps the slowest subscriber within
  ``max_lag`` records of the head, so nothing is skipped and producers slow down instead;
- ``drop``: a subscriber more than ``max_lag`` behind skips ahead to half that lag and is told
  how many records it missed;
- ``disconnect``: a subscriber more than ``max_lag`` behind is ended with ``SLOW_SUBSCRIBER``.

Everything here runs on the broker's trio thread; nothing awaits, except the topic's writer,
which batches what producers sent into one ``append`` per turn of the event loop, and its
syncer, which runs the log's fsyncs in a worker thread (one at a time, each covering every
append made while the previous one ran: group commit), so that no fsync stops the event loop.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import logging
import reprlib
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import msgpack
import trio

from ..errors import StreamError, single_errors
from ..net.failures import TRACEBACKS_PER_MINUTE, RateLimitedLog
from ..protocol import DEFAULT_MAX_FRAME_SIZE, MAX_INT, Encoded, ErrorCode
from ..streams import Subscriber, Subscription
from ..streams.rules import MAX_DEMAND, add_demand, check_signal_argument, invalid_request, validate_subscription
from ..streams.subscriptions import DrainLoop, deliver_safely
from .codes import BrokerCode
from .fences import Fences
from .recent import RecentBudget, RecentItems
from .storage import CorruptData, OffsetDamaged, StorageError, TopicLog, WriteFailed

log = logging.getLogger("rsnet.broker")

STORAGE_LINES_PER_MINUTE = 30
"""Lines saying a topic's storage failed, or works again, that the log takes a minute, all
topics of a broker together (the rest are counted in one line): memory topics share one
budget, so a client that fills it and purges it makes every memory topic fail and recover in
turn, a line each (attack round 6). ``/health`` and the ``storage_failing`` metric still show
every topic."""

READ_BATCH = 256
"""Records read from the log per step of a subscription's drain loop."""

MAX_SEQUENCE = MAX_INT - 1
"""The highest producer sequence a record may carry: the sequence after it, where the producer
resumes (``$acks``), must be a protocol integer too."""


class SlowPolicy(enum.StrEnum):
    BACKPRESSURE = "backpressure"
    DROP = "drop"
    DISCONNECT = "disconnect"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Topic:
    """One topic's log and its live readers and writers (see the module docstring)."""

    def __init__(
        self,
        name: str,
        log: TopicLog,
        *,
        policy: SlowPolicy = SlowPolicy.BACKPRESSURE,
        max_lag: int = 10_000,
        on_stored: Callable[[Topic, list[tuple[str, int]]], None] | None = None,
        failure_log: RateLimitedLog | None = None,
        storage_log: RateLimitedLog | None = None,
        on_storage_failed: Callable[[Topic, StreamError, list[str]], None] | None = None,
        recent_budget: RecentBudget | None = None,
        fences: Fences | None = None,
        on_damage_found: Callable[[Topic], None] | None = None,
    ) -> None:
        self.name = name
        self.log = log
        self.recent = RecentItems(name, recent_budget or RecentBudget())
        """The newest records as encoded items, shared by the subscribers at the head."""
        self.policy = policy
        self.max_lag = max_lag
        self.readers: set[TopicReader] = set()
        self.sinks: set[TopicSink] = set()
        # Open offers of one producer on one connection, oldest first: only the first gets
        # demand (TopicSink.in_line).
        self.offer_lines: dict[tuple[str, object], list[TopicSink]] = {}
        self.records_in = 0
        self.records_out = 0
        self.dropped = 0
        self.disconnected = 0  # subscribers ended by the disconnect policy
        self._pending: list[TopicSink] = []  # sinks holding records for the writer
        self._refill_due = False  # readers moved: the writer refills the producers' demand
        # (end, producer, sequence): $acks first items waiting for their records' sync
        self._awaited: list[tuple[int, str, int]] = []
        self._wakeup = trio.Event()
        self._sync_wanted = trio.Event()  # the writer appended records for the syncer to sync
        self._on_stored = on_stored  # (producer, last sequence) pairs that became durable
        self.failure_log = failure_log or RateLimitedLog(logging.getLogger("rsnet.broker"), TRACEBACKS_PER_MINUTE)
        self.storage_log = storage_log or storage_state_log()
        self._on_storage_failed = on_storage_failed  # the error and the producers refused (storage, or a record)
        self.storage_failure: str | None = None  # why the last append or sync failed, until an append succeeds
        self.storage_failures = 0  # appends and syncs that failed
        self.fences = Fences() if fences is None else fences  # producers a failure refused (fences.py)
        self.on_damage_found = on_damage_found  # a read found records damaged since the log opened

    @property
    def idle(self) -> bool:
        """No producer, no subscriber, nothing waiting to be written: the log may be closed."""
        return not self.readers and not self.sinks and not self._pending

    # -- producers ------------------------------------------------------------------------

    def capacity(self) -> int:
        """How many more records producers may send now without breaking the lag bound."""
        if self.policy is not SlowPolicy.BACKPRESSURE:
            return MAX_DEMAND
        # Count what producers were granted and have not appended yet as if it were in:
        # it may arrive at any moment.
        head = self.log.next_offset + sum(sink.in_flight for sink in self.sinks)
        slowest = min((reader.positions[self] for reader in self.readers), default=head)
        return max(0, self.max_lag - (head - slowest))

    def submit(self, sink: TopicSink) -> None:
        """The sink has records buffered: the writer appends them, one batch per sink."""
        self._pending.append(sink)
        self._wakeup.set()

    async def run_writer(
        self,
        sync_interval: float | None = None,
        *,
        sync_each_append: bool = False,
        sync_threads: trio.CapacityLimiter | None = None,
    ) -> None:
        """Append what producers sent, batched, then tell the sinks what is stored.

        How records become durable is the log's fsync policy: ``sync_each_append`` (ALWAYS)
        syncs after appending, ``sync_interval`` (INTERVAL) every that many seconds, neither
        (NEVER, in memory) never. Syncs run in a worker thread taken from ``sync_threads``
        (the broker's bound on them; trio's default limiter if None), at most one per topic,
        while the writer goes on appending: each sync covers everything appended before it
        began, so under load one fsync covers many appends. Records count as stored, for
        ``$acks`` and for readers, only once the sync covering them has returned.

        Cancelling it waits for a sync a thread is running (a thread cannot be interrupted).
        """
        with single_errors():  # the broker contains a topic's failure by its own exception
            async with trio.open_nursery() as nursery:
                if sync_each_append or sync_interval:
                    nursery.start_soon(self._run_syncer, sync_interval, sync_threads)
                while True:
                    await self._wakeup.wait()
                    self._wakeup = trio.Event()
                    if self._refill_due:
                        self._refill_due = False
                        self._refill_sinks()
                    if self._pending:
                        self._append_pending(sync=not sync_each_append)
                        if sync_each_append:
                            self._sync_wanted.set()
                    self._settle()

    async def _run_syncer(self, sync_interval: float | None, threads: trio.CapacityLimiter | None) -> None:
        """Sync whenever the writer appended (or every ``sync_interval`` seconds), one sync at
        a time: appends made while one runs wait for the next."""
        next_sync = trio.current_time() + (sync_interval or 0)
        while True:
            if sync_interval:
                # Every interval from the last one's start, not from its end: a sync's own time
                # must not stretch the period (readers see records only once synced).
                await trio.sleep_until(next_sync)
                next_sync = max(next_sync + sync_interval, trio.current_time())
            else:
                await self._sync_wanted.wait()
                self._sync_wanted = trio.Event()
            await self._sync(threads)

    async def _sync(self, threads: trio.CapacityLimiter | None) -> None:
        """One fsync of what the log has written, in a worker thread; then acknowledge and
        deliver what it made durable, or refuse the producers if it failed."""
        try:
            pending = self.log.begin_sync()
        except StorageError as refused:  # the log is failed, or a sync before this one failed
            self._storage_failed(refused)
            return
        if pending is None:
            return
        failure: OSError | None = None
        try:
            await trio.to_thread.run_sync(pending.run, limiter=threads)
        except OSError as exc:
            failure = exc
        finally:
            pending.close()  # if no thread ever took it (cancelled while waiting for one)
        try:
            self.log.finish_sync(pending, failure)
        except StorageError as error:
            self._storage_failed(error)
            return
        # storage_failure stays: an append may have failed (a full disk) after this sync began,
        # and it is the next append that shows the disk takes writes again.
        for reader in list(self.readers):
            reader.appended(self)  # more is durable: readers may go on
        self._settle()

    def _append_pending(self, sync: bool = True) -> None:
        if self.storage_failure is not None:
            try:  # a log left failed by an earlier fault may work again (space freed): look
                self.log.repair()
            except StorageError as failure:
                self._storage_failed(failure)
                return
        pending, self._pending = self._pending, []
        timestamp = now_ms()
        recent = self.recent if self.readers else None
        if recent is not None and recent.items:  # what every live subscriber has read goes
            recent.trim(min(reader.positions[self] for reader in self.readers))
        arrays = recent is not None and any(reader.shares_arrays for reader in self.readers)
        durable = self.log.durable_offset
        for sink in pending:
            values, sink.buffer = sink.buffer, []
            if not values or self._past_a_gap(sink):
                continue
            size = self.log.size_bytes
            try:
                offsets = self.log.append(
                    values,
                    timestamp_ms=timestamp,
                    producer=sink.producer,
                    first_sequence=sink.next_sequence if sink.producer is not None else None,
                    sync=sync,
                )
            except StorageError as failure:
                self._storage_failed(failure)
                break
            except (TypeError, ValueError) as unstorable:
                # A record of this producer cannot be stored (one nesting too deep or too large
                # to deliver, say): append stored none of the batch; this producer is refused,
                # not the topic. It hears why on its $acks too: its offer may have completed
                # before the record reached the log, so that its stream cannot carry the error.
                data: dict[str, Any] = {"topic": self.name, "producer": sink.producer}
                if sink.producer is not None:  # where its stored records end: it resumes there
                    data["sequence"] = sink.next_sequence
                refusal = StreamError(
                    ErrorCode.REJECTED,
                    f"a record cannot be stored in {self.name!r}: {unstorable}; nothing after your last "
                    "acknowledged sequence was stored",
                    data,
                )
                sink.fail(refusal)
                if sink.producer is not None:  # its next offer, pipelined, is past a gap now
                    self.fences.fence(self.name, {sink.producer: sink.next_sequence})
                    if self._on_storage_failed is not None:
                        self._on_storage_failed(self, refusal, [sink.producer])
                continue
            if any(offset is not None for offset in offsets):  # written: the disk takes writes
                self.storage_failure = None
            if recent is not None:
                appended = [(o, v) for o, v in zip(offsets, values, strict=True) if o is not None]
                recent.add(timestamp, appended, arrays)
            sink.appended(offsets, self.log.next_offset - 1, self.log.size_bytes - size)
            self.records_in += sum(offset is not None for offset in offsets)
        if recent is None:
            self.recent.clear()  # nobody to share them with; a new reader starts from storage
        if self.log.durable_offset != durable or self.policy is not SlowPolicy.BACKPRESSURE:
            # Readers see only durable records: until a sync, only the lag policies have news.
            for reader in list(self.readers):
                reader.appended(self)

    def _past_a_gap(self, sink: TopicSink) -> bool:
        """Whether ``sink``'s records come after a gap its producer's failure left (fences.py):
        then they are refused, REJECTED on the offer and on the producer's ``$acks`` (its offer
        may have completed already); else the producer's fence, if any, is lifted."""
        producer = sink.producer
        resume = self.resume_point(producer)
        if producer is None or resume is None:
            return False
        if sink.next_sequence > resume:
            refusal = self.gap_refusal(producer, sink.next_sequence, resume)
            sink.fail(refusal)
            if self._on_storage_failed is not None:
                self._on_storage_failed(self, refusal, [producer])
            return True
        self.fences.lift(self.name, producer)
        return False

    def resume_point(self, producer: str | None) -> int | None:
        """The sequence ``producer``, fenced after a failure (fences.py), is to offer again
        from; None if it is not fenced."""
        if producer is None:
            return None
        resume = self.fences.resume(self.name, producer)
        if resume is None:
            return None
        stored = self.log.last_sequence(producer)  # records of a refused offer may have been kept
        return resume if stored is None else max(resume, stored + 1)

    def gap_refusal(self, producer: str, sequence: int, resume: int) -> StreamError:
        """REJECTED for records of fenced ``producer`` from ``sequence``, past its ``resume``."""
        return StreamError(
            ErrorCode.REJECTED,
            f"records of producer {producer!r} from sequence {resume} on were refused by {self.name!r} (one of them"
            f" could not be stored, or its storage failed) and not stored: offer again from sequence {resume},"
            f" not {sequence}",
            {"topic": self.name, "producer": producer, "sequence": resume},
        )

    def _storage_failed(self, failure: StorageError) -> None:
        """The log could not store (or sync) records: every producer of the topic is refused
        with STORAGE_FULL or STORAGE_ERROR and resends from its last acknowledged sequence.

        What the log holds is unchanged by the failed call (see ``WriteFailed``), so nothing
        acknowledged is lost and readers go on. What producers sent and were not told is
        stored counts for nothing: their unacknowledged offsets may be given to other records
        now, so no acknowledgement may come from them. The next offer tries again: appends
        resume as soon as the disk takes them.
        """
        error = storage_refusal(
            self.name,
            failure,
            f"topic {self.name!r} cannot store records now ({failure}); nothing after your last acknowledged "
            "sequence was stored: offer them again later",
        )
        if self.storage_failure is None:  # one line per failing spell, not per refused offer
            self.storage_log.log(
                logging.ERROR,
                "topic %s: storage failed, producers refused until it works again: %s",
                self.name,
                failure,
            )
        self.storage_failure = str(failure)
        self.storage_failures += 1
        self.recent.clear()  # offsets not acknowledged may now go to other records
        self._awaited.clear()  # (the same: those records may be gone)
        resume = _first_unacknowledged(list(self.sinks) + self._pending)  # by producer: those refused
        for sink in list(self.sinks) + self._pending:
            sink.buffer.clear()
            sink.sent_offsets.clear()
            sink.in_flight = 0
            sink.fail(error)  # (ends it, and it leaves the topic, if it was still open)
            sink.leave_when_settled()  # a finished offer whose records it refused leaves too
        self._pending.clear()
        self.fences.fence(self.name, resume)
        if self._on_storage_failed is not None:
            self._on_storage_failed(self, error, list(resume))

    def _settle(self) -> None:
        """Records below the log's durable offset are stored: acknowledge and refill."""
        durable = self.log.durable_offset
        acknowledged: list[tuple[str, int]] = []
        for sink in list(self.sinks):
            last = sink.settle(durable)
            if last is not None and sink.producer is not None:
                acknowledged.append((sink.producer, last))
        if self._awaited:
            acknowledged += [(producer, sequence) for end, producer, sequence in self._awaited if end <= durable]
            self._awaited = [awaited for awaited in self._awaited if awaited[0] > durable]
        if acknowledged and self._on_stored is not None:
            self._on_stored(self, acknowledged)

    def acknowledge_when_durable(self, producer: str) -> int | None:
        """The sequence to tell ``producer`` is stored now (a ``$acks`` that opens): its highest
        if the record that carries it is durable. If that record is written but not yet
        durable (its sync runs, or under ``interval`` waits for the next one), None, and the
        sequence is acknowledged (``on_stored``) once it is durable, or never if the write
        fails (see ``_storage_failed``)."""
        written = self.log.last_write(producer)
        if written is None:
            return None
        sequence, end = written
        if end <= self.log.durable_offset:
            return sequence
        self._awaited.append((end, producer, sequence))
        return None

    def reader_moved(self) -> None:
        """A reader advanced or left: under backpressure, producers may send more, which the
        writer works out once per turn. (Here, per reader that moved, it cost each producer a
        look at every reader: with 16,000 subscriptions and one producer, closing them held
        the event loop 11 s, and delivering to them starved every other client.)"""
        if self.policy is SlowPolicy.BACKPRESSURE and self.sinks and not self._refill_due:
            self._refill_due = True
            self._wakeup.set()

    def _refill_sinks(self) -> None:
        room = self.capacity()  # one look at the readers for every producer
        for sink in list(self.sinks):
            room -= sink.refill(room)

    def purge(self) -> int:
        """Remove every record and return how many went, keeping the offsets
        (:meth:`TopicLog.drop_all`): producers and readers carry on, and a reader that had not
        read them all is told ``OFFSET_TRIMMED`` as it reads on (under the drop policy it skips
        them), as after retention. Raises StorageError as the log does."""
        removed = self.log.drop_all()
        self.recent.clear()
        for reader in list(self.readers):
            reader.appended(self)  # one behind the new start learns of it now
        return removed

    def fail(self, error: StreamError) -> None:
        """The topic stops: every producer and reader gets ``error``, no one is left waiting.

        Records a producer sent that are not acknowledged stay unacknowledged: the producer
        resends them (idempotently, by sequence) once the topic is open again.
        """
        self.fences.fence(self.name, _first_unacknowledged(self.sinks))
        for sink in list(self.sinks):
            sink.fail(error)
        self.sinks.clear()
        self._pending.clear()
        self.recent.clear()
        for reader in list(self.readers):
            reader.fail(error)


def _first_unacknowledged(sinks: Iterable[TopicSink]) -> dict[str, int]:
    """Per producer among ``sinks``, the first sequence none of them had acknowledged: what
    it is to offer again from once they are refused (appended but not yet durable counts as
    not acknowledged; a failed sync takes such records back)."""
    resume: dict[str, int] = {}
    for sink in sinks:
        if sink.producer is not None:
            first = sink.next_sequence - len(sink.sent_offsets)
            resume[sink.producer] = min(first, resume.get(sink.producer, first))
    return resume


@runtime_checkable
class FailableSubscription(Protocol):
    """A subscription that can end its stream with a coded error, not only cancel it (the
    session's subscription to a remote producer: an ERROR frame instead of CANCEL)."""

    def fail(self, error: StreamError) -> None: ...


ASSUMED_RECORD_BYTES = DEFAULT_MAX_FRAME_SIZE
"""Bytes a producer's record is assumed to take until some of its records are stored: as
many as a frame may hold (a record is one NEXT frame)."""


class TopicSink(Subscriber[Any]):
    """Subscribed to a producer's publisher; feeds a topic under the topic's capacity.

    It grants the producer records that are not yet written to the log: at most ``window`` of
    them, at most about ``window_bytes`` of them, and never more than the topic's capacity.
    Demand counts records (rule 3.9), not bytes, so the byte window is kept at the size the
    stream's records take in the log: the average of the batch it last stored, or, before
    any is stored, the most a record may be (``ASSUMED_RECORD_BYTES``), or after a batch of
    duplicates only, the log's average. A producer of large
    records therefore gets demand only as its bytes are stored (at least one record at a
    time); one that switches from small records to large ones may have what it was granted
    in flight once. Records count as acknowledged (``settle``) once the log's fsync policy
    made them durable. ``producer`` and the running ``sequence`` make retries idempotent: the
    log drops a (producer, sequence) it already stored.

    Offers of one producer on one ``connection`` are taken one at a time, in the order they
    opened: a later one gets demand once the earlier ones ended. Deduplication keeps each
    producer's highest stored sequence, so records of a later offer stored first would make
    the rest of an earlier one duplicates, dropped and acknowledged, never stored. Offers of
    one producer on different connections are not held back (a producer that reconnected
    before its old connection is known dead; two attempts of one Spark task, which send the
    same records under the same keys).
    """

    def __init__(
        self,
        topic: Topic,
        *,
        window: int,
        window_bytes: int,
        producer: str | None,
        first_sequence: int = 0,
        connection: object = None,
    ) -> None:
        self.topic = topic
        self.window = window
        self.window_bytes = window_bytes
        self.record_bytes = ASSUMED_RECORD_BYTES  # what one record takes in the log, as last stored
        self.producer = producer
        self.connection = connection
        self.next_sequence = first_sequence  # sequence of the next record handed to the log
        self.subscription: Subscription | None = None
        self.in_flight = 0  # granted (or received), not yet appended to the log
        self.sent_offsets: list[int] = []  # offsets of appended records not yet known durable
        self.buffer: list[Any] = []  # received, waiting for the topic's writer
        self.done = False
        self.error: BaseException | None = None
        self.finished = trio.Event()

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self.subscription, subscription):
            return  # rule 2.5
        self.subscription = subscription
        self.topic.sinks.add(self)
        if self.producer is not None:
            self.topic.offer_lines.setdefault((self.producer, self.connection), []).append(self)
        self.refill()

    @property
    def in_line(self) -> bool:
        """Whether an earlier offer of this producer on this connection is still open."""
        return self.producer is not None and self.topic.offer_lines[self.producer, self.connection][0] is not self

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        sequence = self.next_sequence + len(self.buffer)
        if self.producer is not None and sequence > MAX_SEQUENCE:
            self.fail(
                StreamError(
                    ErrorCode.REJECTED,
                    f"producer {self.producer!r} ran out of sequence numbers: a record's sequence must be at most "
                    f"{MAX_SEQUENCE}; continue under a new producer id",
                    {"topic": self.topic.name, "producer": self.producer, "sequence": sequence},
                )
            )
            return
        if not self.buffer:
            self.topic.submit(self)
        self.buffer.append(item)

    def on_error(self, error: BaseException) -> None:
        self._end(error)

    def on_complete(self) -> None:
        self._end(None)

    def _end(self, error: BaseException | None) -> None:
        if not self.done:
            self.done = True
            self.error = error
            self.leave_when_settled()
            self._leave_the_line()

    def _leave_the_line(self) -> None:
        # Its records, if any wait for the writer, are queued before the next offer's can be:
        # that one may have demand now.
        if self.producer is None:
            return
        key = (self.producer, self.connection)
        line = self.topic.offer_lines.get(key)
        if line is None or self not in line:
            return  # not subscribed yet
        line.remove(self)
        if line:
            line[0].refill()
        else:
            del self.topic.offer_lines[key]

    def fail(self, error: StreamError) -> None:
        """Refuse the rest of the producer's records: its stream ends with ``error`` (a coded
        ERROR for a remote producer, a cancel for a local one); what it sent before is stored."""
        if self.done:
            return
        subscription = self.subscription
        self._end(error)
        if isinstance(subscription, FailableSubscription):
            subscription.fail(error)
        elif subscription is not None:
            subscription.cancel()

    def leave_when_settled(self) -> None:
        # A finished producer stays until its last records are stored and acknowledged.
        if self.done and not self.buffer and not self.sent_offsets:
            self.topic.sinks.discard(self)
            self.finished.set()

    def appended(self, offsets: list[int | None], head: int, stored_bytes: int) -> None:
        """The topic's writer appended this sink's buffered records: ``offsets`` as the log
        returned them (None for a duplicate), ``head`` the log's last offset after it, and
        ``stored_bytes`` what they added to the log."""
        # A duplicate's original is somewhere below the head: count it stored once
        # everything appended so far is durable (under INTERVAL that may be later).
        self.sent_offsets.extend(head if offset is None else offset for offset in offsets)
        self.next_sequence += len(offsets)
        self.in_flight -= len(offsets)
        stored = sum(offset is not None for offset in offsets)
        if stored:
            self.record_bytes = max(1, -(-stored_bytes // stored))
        elif self.record_bytes == ASSUMED_RECORD_BYTES:
            # Only duplicates, and none of this producer's records stored yet (a resend of
            # what was stored, after a lost connection): sized as the log's records are on
            # average, or a resend of small records would be granted as many as fit at the
            # largest size (4 at a time: 100 round trips for 400 records).
            log = self.topic.log
            held = log.next_offset - log.first_offset
            if held > 0:
                self.record_bytes = max(1, -(-log.size_bytes // held))
        # Demand is about room, acknowledgement about durability: the producer may send
        # more as soon as these are written, while $acks waits for the fsync policy.
        self.refill()

    def refill(self, capacity: int | None = None) -> int:
        """Request what the window and the topic's ``capacity`` (looked up if not given)
        allow; returns how many records that was."""
        if self.done or self.subscription is None or self.in_line:
            return 0
        window = min(self.window, max(1, self.window_bytes // self.record_bytes))
        amount = min(window - self.in_flight, self.topic.capacity() if capacity is None else capacity)
        if amount <= 0:
            return 0
        self.in_flight += amount
        self.subscription.request(amount)
        return amount

    def settle(self, durable_offset: int) -> int | None:
        """Acknowledge the records now durable; returns the last stored sequence, if any."""
        offsets = self.sent_offsets
        settled = 0
        while settled < len(offsets) and offsets[settled] < durable_offset:
            settled += 1
        if not settled:
            return None
        del offsets[:settled]
        self.leave_when_settled()
        return self.next_sequence - len(offsets) - 1


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    """What a subscription's items look like (its ``items`` param, protocol/BROKER.md)."""

    arrays: bool = False
    """``[offset, timestamp, value]`` instead of the map ``{"topic", "offset", "timestamp",
    "value"}``: half the bytes to decode for a reader that knows its topic."""
    stored: bool = False
    """Arrays as the log stores them, ``[offset, timestamp, value, producer, sequence]``: a
    network subscriber gets each record's stored bytes, never decoded and encoded again (a
    third of the broker's work a record of a read from storage)."""
    with_topic: bool = False
    """Arrays end with the topic's name (a pattern subscription interleaves topics)."""


MAPS = Shape()


class TopicReader(DrainLoop, Subscription):
    """A subscription reading one or more topics (a wildcard) from its own positions.

    ``until``: it reads one topic, and completes once its position there reaches ``until``
    (every record before it delivered or skipped), whatever its demand (rule 1.4); it never
    delivers a record at or past ``until``. Without it a subscription never completes."""

    def __init__(
        self,
        subscriber: Subscriber[Any],
        *,
        on_end: Callable[[TopicReader], None] | None = None,
        shape: Shape = MAPS,
        until: int | None = None,
    ) -> None:
        self.subscriber: Subscriber[Any] | None = subscriber
        self._until = until
        self.positions: dict[Topic, int] = {}
        # The topics that may have records for it (or a trim to report), in the order they
        # are to be read: a pattern over thousands of topics costs what its busy ones do. Kept
        # only while it reads several: with one (``_only``), that one is looked at, which
        # spares the bookkeeping per record that fan-out to many readers pays per reader.
        self._ready: dict[Topic, None] = {}
        self._only: Topic | None = None
        self.skipped: dict[Topic, int] = {}
        self.requested = 0
        self.cancelled = False
        self.delivered = 0
        self._draining = False
        self._missed = False
        self._failure: BaseException | None = None
        self._on_end = on_end
        # A subscriber that takes a list of items in one call (rsnet's session, iterator) is
        # given each read as one list; one that also takes encoded items (the network session)
        # gets the records at a topic's head as the bytes shared by every subscriber there.
        self._many: Callable[[list[Any]], None] | None = getattr(subscriber, "on_next_many", None)
        self._encoded: Callable[[list[Any]], None] | None = getattr(subscriber, "on_next_encoded", None)
        self._shape = shape
        # See RecentItems: the maps or the arrays shape shared by every subscriber at the head.
        self._shared = self._encoded is not None and not (shape.arrays or shape.stored)
        self.shares_arrays = self._encoded is not None and shape.arrays and not (shape.stored or shape.with_topic)
        self._as_stored = self._encoded is not None and shape.stored  # the stored bytes as the items
        # A network subscriber's connection has room for so many bytes (Session.room): this
        # reads for it only while there is some, so that a peer that reads nothing holds its
        # connection's window, not a record per stream of its (up to 1,024 x 1 MiB).
        self._room: Callable[[], int] | None = getattr(subscriber, "room", None)
        self.waits_for_room = False

    def add_topic(self, topic: Topic, position: int) -> None:
        if self.cancelled:
            return
        self.positions[topic] = position
        if len(self.positions) == 1:
            self._only = topic
        else:
            if self._only is not None:  # its one topic becomes one of several
                self._ready[self._only] = None
                self._only = None
            self._ready[topic] = None
        topic.readers.add(self)
        if self.requested or self._until is not None:  # (it may be at its end already)
            self.drain()

    def drop_topic(self, topic: Topic) -> None:
        """Stop reading ``topic`` (it was deleted) and go on with the others: a pattern
        subscription follows the topics that exist, a topic created again among them too."""
        if self.positions.pop(topic, None) is None:
            return
        self._ready.pop(topic, None)
        self.skipped.pop(topic, None)
        if self._only is topic:
            self._only = None
        topic.readers.discard(self)

    def lag(self, topic: Topic) -> int:
        return topic.log.next_offset - self.positions[topic]

    def total_lag(self) -> int:
        """Records not yet read, over every topic that has some: a pattern subscription's lag,
        at the cost of its busy topics (the others are read up to their end)."""
        return sum(self.lag(topic) for topic in (self._ready if self._only is None else self.positions))

    # -- Subscription -------------------------------------------------------------------

    def request(self, n: int) -> None:
        if self.cancelled:
            return
        if n <= 0:
            self._failure = invalid_request(n)  # rule 3.9, delivered by the drain loop
        else:
            self.requested = add_demand(self.requested, n)
        self.drain()

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._drop_subscriber()  # rule 3.13
            self._leave()

    def _drop_subscriber(self) -> None:
        """Forget the subscriber, its bound methods too: it holds this subscription, and the
        two would otherwise stay a reference cycle, its whole session with them, until a
        full garbage collection (attack round 6: 30,000 waiting subscriptions a burst grew the
        broker's memory about 10 MB a burst)."""
        self.subscriber = self._many = self._encoded = self._room = None

    def _leave(self) -> None:
        topics = list(self.positions)
        for topic in topics:
            topic.readers.discard(self)
        for topic in topics:
            topic.reader_moved()
        if self._on_end is not None:
            self._on_end(self)

    # -- called by topics ----------------------------------------------------------------

    def appended(self, topic: Topic) -> None:
        lag = self.lag(topic)
        if lag > topic.max_lag and (not self.requested or self.waits_for_room):
            if topic.policy is SlowPolicy.DROP:
                self._skip(topic, lag - topic.max_lag // 2)
            elif topic.policy is SlowPolicy.DISCONNECT and self._failure is None:
                topic.disconnected += 1
                self._failure = StreamError(
                    BrokerCode.SLOW_SUBSCRIBER,
                    f"more than {topic.max_lag} records behind on {topic.name!r}",
                    {"topic": topic.name, "lag": lag},
                )
        if self._only is None:
            self._ready[topic] = None
        self.drain()

    def _skip(self, topic: Topic, count: int) -> None:
        """Move ahead ``count`` records (drop policy); the next record delivered says so."""
        self.positions[topic] += count
        self.skipped[topic] = self.skipped.get(topic, 0) + count
        topic.dropped += count

    # -- the drain loop ---------------------------------------------------------------------

    def fail(self, error: StreamError) -> None:
        """End the subscription with ``error`` (delivered by the drain loop, rule 1.3)."""
        if self._failure is None:
            self._failure = error
        self.drain()

    def _drain_step(self) -> bool:
        if self.cancelled:
            return True
        if self._failure is not None:
            self._terminate(self._failure)
            return True
        if self._until is not None and self._only is not None and self.positions[self._only] >= self._until:
            self._terminate(None)
            return True
        try:
            emitted = self._emit()
        except Exception as failure:
            # Reading failed (a bug, a storage error): end this subscription, coded, and
            # nothing else; whoever called drain (a session, a topic's writer) carries on.
            names = sorted(t.name for t in self.positions)
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more topics" if len(names) > 3 else "")
            topic = next(iter(self.positions), None)
            (topic.failure_log if topic is not None else log).exception("a subscription to %s failed", shown)
            self._failure = StreamError(ErrorCode.INTERNAL, f"reading failed ({type(failure).__name__})")
            self._missed = True
            return False
        if emitted:
            self._missed = True  # a full batch went out: there may be more to read (or the end)
        return False

    def _emit(self) -> int:
        """Read the ready topics in turn (round robin: a topic read goes to the back if it
        has more), while there is demand; a topic with nothing more leaves the ready ones."""
        emitted = 0
        only = self._only
        for _ in range(1 if only is not None else len(self._ready)):  # each once at most
            if not self.requested or self.cancelled or self._failure is not None:
                break
            room = None if self._room is None else self._room()
            if room is not None and room <= 0:
                if not self.waits_for_room:
                    self.waits_for_room = True
                    self.subscriber.wait_for_room(self._room_freed)  # type: ignore[union-attr]
                break
            topic = only if only is not None else next(iter(self._ready))
            log = topic.log
            position = self.positions[topic]
            if position < log.first_offset:  # retention removed records not yet read
                if topic.policy is not SlowPolicy.DROP:
                    self._failure = offset_trimmed(topic.name, position, log.first_offset)
                    self._missed = True  # the drain loop goes round once more and delivers it
                    break
                self._skip(topic, log.first_offset - position)
                position = log.first_offset
            # Only durable records are shown: one that an OS crash could still take back
            # (INTERVAL, before its sync) must never be seen, since its offset would be reused.
            visible = (log.durable_offset if self._until is None else min(log.durable_offset, self._until)) - position
            if only is None:
                del self._ready[topic]
                if visible > 0:
                    self._ready[topic] = None  # at the back: it may have more
            if visible <= 0:
                continue
            wanted = min(self.requested, READ_BATCH, visible)
            if room is not None:  # as many as the room takes at the topic's average size, one at least
                average = log.size_bytes // max(1, log.next_offset - log.first_offset)
                wanted = min(wanted, max(1, room // max(1, average)))
            shared = None
            if self._shared and topic not in self.skipped:  # (a map after a skip says so)
                shared = topic.recent.get(position, wanted)
            elif self.shares_arrays:
                shared = topic.recent.get_arrays(position, wanted)
                if shared:
                    self.skipped.pop(topic, None)  # skipped records show as a gap in the offsets
            if shared:  # at the head: the bytes every subscriber there gets
                emitted += self._deliver(topic, position, shared, self._encoded)
                topic.reader_moved()
                continue
            try:
                fields: list[Any] = (log.read_stored if self._as_stored else log.read_fields)(position, wanted)
            except OffsetDamaged as damaged:  # everything before it was delivered; end here, coded
                self._failure = offset_damaged(topic.name, damaged)
                self._missed = True  # the drain loop goes round once more and delivers the error
                break
            except StorageError as failure:  # e.g. bytes damaged since start-up (CorruptData)
                self._failure = storage_refusal(
                    topic.name,
                    failure,
                    f"reading {topic.name!r} at offset {position} failed: {failure}; it is opened again, with the"
                    " damage placed, on the next request: subscribe again",
                )
                self._missed = True
                if isinstance(failure, CorruptData) and topic.on_damage_found is not None:
                    topic.on_damage_found(topic)
                break
            if not fields:
                continue
            name = topic.name
            skipped = self.skipped.pop(topic, 0)
            items: list[Any]
            shape, many = self._shape, self._many
            if self._as_stored:  # skipped records show as a gap in the offsets
                many = self._encoded
                if shape.with_topic:  # the array one longer, the topic's name at its end
                    name_bytes = msgpack.packb(name)
                    items = [Encoded(b"\x96" + body[1:] + name_bytes) for body in fields]
                else:
                    items = list(map(Encoded, fields))
            elif shape.stored:  # a subscriber in this process: the same arrays, decoded
                if shape.with_topic:
                    for record in fields:
                        record.append(name)
                items = fields
            elif not shape.arrays:
                items = [
                    {"topic": name, "offset": offset, "timestamp": timestamp, "value": value}
                    for offset, timestamp, value, _producer, _sequence in fields
                ]
                if skipped:
                    items[0]["skipped"] = skipped
            elif shape.with_topic:
                items = [[offset, timestamp, value, name] for offset, timestamp, value, _, _ in fields]
            else:  # skipped records show as a gap in the offsets
                items = fields
                for record in items:
                    del record[3:]  # producer and sequence stay in the broker
            emitted += self._deliver(topic, position, items, many)
            topic.reader_moved()
        self.delivered += emitted
        return emitted

    def _room_freed(self) -> None:
        self.waits_for_room = False
        self.drain()

    def _deliver(self, topic: Topic, position: int, items: list[Any], many: Callable[[list[Any]], None] | None) -> int:
        """Hand ``items`` (the records from ``position`` on) to the subscriber, in one call
        if it takes a list; returns how many it was given."""
        if many is not None:
            count = len(items)
            self._advance(topic, position + count, count)
            if not deliver_safely(many, items):
                self.cancel()
            return count
        on_next = self.subscriber.on_next  # type: ignore[union-attr]
        delivered = 0
        for item in items:
            if self.cancelled or self._failure is not None:  # ended inside on_next
                break
            delivered += 1
            self._advance(topic, position + delivered, 1)
            if not deliver_safely(on_next, item):
                self.cancel()
                break
        return delivered

    def _advance(self, topic: Topic, position: int, count: int) -> None:
        self.positions[topic] = position
        if self.requested != MAX_DEMAND:
            self.requested -= count
        topic.records_out += count

    def _terminate(self, error: BaseException | None) -> None:
        """End the subscription: ``on_error(error)``, or ``on_complete`` for None."""
        subscriber = self.subscriber
        self.cancelled = True
        self._drop_subscriber()
        self._leave()
        if subscriber is not None:
            if error is None:
                deliver_safely(subscriber.on_complete)
            else:
                deliver_safely(subscriber.on_error, error)


def storage_state_log() -> RateLimitedLog:
    """A log for topics' storage failing and working again (:data:`STORAGE_LINES_PER_MINUTE`)."""
    return RateLimitedLog(
        log,
        STORAGE_LINES_PER_MINUTE,
        "%d more reports of topics' storage failing or working again in the last minute were left out "
        "(/health and the storage_failing metric show each topic)",
        logging.WARNING,
    )


def offset_trimmed(topic: str, requested: int, first_available: int) -> StreamError:
    return StreamError(
        BrokerCode.OFFSET_TRIMMED,
        f"offset {requested} of {topic!r} was removed by retention or a purge; "
        f"the earliest retained is {first_available}",
        {"topic": topic, "requested": requested, "first_available": first_available},
    )


def offset_damaged(topic: str, damaged: OffsetDamaged) -> StreamError:
    damage = damaged.damage
    return StreamError(
        BrokerCode.OFFSET_DAMAGED,
        f"offset {damaged.requested} of {topic!r} is damaged on disk (offsets {damage.first} to {damage.end - 1}); "
        f"the next intact offset is {damage.end}",
        {"topic": topic, "requested": damaged.requested, "first": damage.first, "next_intact": damage.end},
    )


def storage_refusal(topic: str, failure: StorageError | OSError, message: str) -> StreamError:
    """STORAGE_FULL for a failure for lack of space (ENOSPC, EDQUOT), else STORAGE_ERROR."""
    cause = failure if isinstance(failure, (WriteFailed, OSError)) else failure.__cause__
    full = getattr(cause, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
    return StreamError(BrokerCode.STORAGE_FULL if full else BrokerCode.STORAGE_ERROR, message, {"topic": topic})


def resolve_start(topic: Topic, start: Any) -> int:
    """The offset a subscription starts at: ``"earliest"``, ``"latest"``, an offset, or
    ``{"timestamp": ms}``. Raises StreamError for a trimmed or future offset."""
    log = topic.log
    if start in (None, "latest"):
        return log.next_offset
    if start == "earliest":
        return log.first_offset
    if isinstance(start, dict) and type(start.get("timestamp")) is int and start["timestamp"] >= 0:
        return log.offset_for_timestamp(start["timestamp"])
    if type(start) is int and start >= 0:
        if start < log.first_offset:
            raise offset_trimmed(topic.name, start, log.first_offset)
        if start > log.next_offset:
            raise StreamError(
                BrokerCode.OFFSET_OUT_OF_RANGE,
                f"offset {start} of {topic.name!r} does not exist yet (next is {log.next_offset})",
                {"topic": topic.name, "requested": start, "next": log.next_offset},
            )
        for damage in log.damaged_ranges:
            if damage.first <= start < damage.end:
                raise offset_damaged(topic.name, OffsetDamaged(start, damage))
        return start
    raise StreamError(
        ErrorCode.REJECTED,
        f"invalid start position {reprlib.repr(start)}: use 'earliest', 'latest', an offset or {{'timestamp': ms}}",
    )
