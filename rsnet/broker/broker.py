"""The broker: topics hosted over rsnet connections.

Served by an :class:`rsnet.Server` whose host is a :class:`Broker`; what clients do:

- SUBSCRIBE to a topic name or a pattern (``sensors.*``, ``sensors.>``), with params
  ``from`` (``"earliest"``, ``"latest"`` (default), an offset, or ``{"timestamp": ms}``) and
  optionally ``cursor`` (a name: start at that cursor's committed offset if it has one).
  Each subscriber has its own demand and position.
- SUBSCRIBE to ``$commit`` with ``{"topic", "cursor", "offset"}`` to commit a cursor: the
  offset of the next record the group wants (the last one it processed, plus one). One item
  (the commit) then complete. Commits are explicit because delivery is not processing: a
  subscriber may hold up to its prefetch of delivered, unprocessed records.
- OFFER a publisher under a topic name, with params ``producer`` and ``sequence`` (the
  idempotency key of the first record; later records count up from it). The broker pulls
  from it with request(n), never more than it can store and, under ``backpressure``, deliver.
- SUBSCRIBE to ``$acks`` with ``{"producer", "topic"}``: the producer's acknowledgements,
  ``{"topic", "producer", "sequence"}`` = every record up to that sequence is stored under the
  topic's fsync policy. The first item is the last sequence already stored, if any, which is
  where a reconnecting producer resumes.
- SUBSCRIBE to ``$topics``: one item per topic (offsets, counts, subscriber lags), then complete.

Topic writer tasks, the retention sweep and cursor commits run in the broker's nursery
(:meth:`Broker.run`); logs are closed when it ends.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import trio

from ..errors import StreamError
from ..net.session import StreamContext
from ..protocol import ErrorCode
from ..streams import Publisher, Subscriber, Subscription, from_iterable, just
from ..streams.rules import MAX_DEMAND, add_demand, check_subscriber, invalid_request
from ..streams.subscriptions import deliver_safely
from .admin import administer
from .names import is_wildcard, topic_matches, validate_pattern, validate_topic
from .storage import CorruptData, CursorStore, FsyncPolicy, MemoryLog, Retention, SegmentLog, TopicLog
from .topic import MAX_SEQUENCE, SlowPolicy, Topic, TopicReader, TopicSink, now_ms, resolve_start

log = logging.getLogger("rsnet.broker")

DEFAULT_SINK_WINDOW = 1024
"""Records a producer may have sent that are not yet stored (per OFFER stream)."""


@dataclasses.dataclass(frozen=True)
class TopicSettings:
    """How the broker runs one topic, in the storage engine's and the topic's own terms
    (retention in milliseconds, a :class:`SlowPolicy`). The daemon builds it from the
    configuration's :class:`rsnet.broker.config.TopicConfig`; embedders may build it directly."""

    durable: bool = False
    retention: Retention = dataclasses.field(default_factory=lambda: Retention(None, None, None))
    policy: SlowPolicy = SlowPolicy.BACKPRESSURE
    max_lag: int = 10_000
    auto_create: bool = True


class Broker:
    """Hosts topics for an rsnet server (see the module docstring).

    ``data_dir``: where durable topics live (None: every topic is in memory). ``settings_for``
    maps a topic name to its :class:`TopicSettings`. ``authorize(principal, action, name)``
    with action "publish" or "subscribe" returns whether it is allowed (None: everything is).
    """

    def __init__(
        self,
        *,
        data_dir: str | pathlib.Path | None = None,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        fsync_interval_ms: int = 100,
        settings_for: Callable[[str], TopicSettings] | None = None,
        authorize: Callable[[Any, str, str], bool] | None = None,
        sink_window: int = DEFAULT_SINK_WINDOW,
        retention_sweep_s: float = 1.0,
    ) -> None:
        self.data_dir = pathlib.Path(data_dir) if data_dir is not None else None
        self.fsync = fsync
        self.fsync_interval_ms = fsync_interval_ms
        default = TopicSettings(durable=self.data_dir is not None)
        self.settings_for = settings_for or (lambda name: default)
        self.authorize = authorize
        self.sink_window = sink_window
        self.retention_sweep_s = retention_sweep_s
        self.topics: dict[str, Topic] = {}
        self.recovery: dict[str, Any] = {}  # topic -> RecoveryReport of its log
        self.denied = 0  # requests refused for lack of a grant
        self._cursors: dict[str, CursorStore | dict[str, int]] = {}
        self._watchers: list[tuple[str, TopicReader]] = []  # wildcard readers, for new topics
        self._acks: dict[tuple[str, str], set[_AckSubscription]] = {}
        self._writers: dict[Topic, trio.CancelScope] = {}
        self._memory_logs: dict[str, MemoryLog] = {}
        self._nursery: trio.Nursery | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the durable topics found in ``data_dir`` and serve until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.data_dir is not None:
                    self.data_dir.mkdir(parents=True, exist_ok=True)
                    for directory in sorted(p for p in self.data_dir.iterdir() if p.is_dir()):
                        self._open_topic(directory.name)
                nursery.start_soon(self._sweep)
                task_status.started()
                await trio.sleep_forever()
        finally:
            for topic in list(self.topics.values()):
                self._close_topic(topic)

    async def _sweep(self) -> None:
        """Retention, once per ``retention_sweep_s``."""
        while True:
            await trio.sleep(self.retention_sweep_s)
            now = now_ms()
            for topic in list(self.topics.values()):
                try:
                    topic.log.enforce_retention(now)
                except Exception as failure:
                    self._topic_failed(topic, failure)

    # -- topics -------------------------------------------------------------------------------

    def topic(self, name: str, *, create: bool) -> Topic | None:
        topic = self.topics.get(name)
        if topic is None and create:
            topic = self._open_topic(name)
        return topic

    def _open_topic(self, name: str) -> Topic:
        settings = self.settings_for(name)
        topic_log = self._open_log(name, settings)
        topic = Topic(name, topic_log, policy=settings.policy, max_lag=settings.max_lag, on_stored=self._stored)
        self.topics[name] = topic
        interval = self.fsync_interval_ms / 1000 if settings.durable and self.fsync is FsyncPolicy.INTERVAL else None
        assert self._nursery is not None, "the broker is not running"
        scope = self._writers[topic] = trio.CancelScope()
        self._nursery.start_soon(self._run_writer, topic, interval, scope)
        for pattern, reader in list(self._watchers):
            if topic_matches(pattern, name) and not reader.cancelled:
                reader.add_topic(topic, topic_log.first_offset)
        return topic

    def _open_log(self, name: str, settings: TopicSettings) -> TopicLog:
        """The topic's log and cursors: opened (recovered) from ``data_dir``, or in memory.

        A memory topic's log and cursors live as long as the broker, so that a topic closed
        after a failure comes back with its records when it is opened again.
        """
        if settings.durable and self.data_dir is not None:
            segment_log, report = SegmentLog.open(self.data_dir / name, settings.retention, self.fsync)
            self.recovery[name] = report
            if report.damaged:
                log.warning("topic %s: recovered with damage: %s", name, "; ".join(report.damaged))
            self._cursors[name] = self._open_cursors(self.data_dir / name / "cursors")
            return segment_log
        self._cursors.setdefault(name, {})
        return self._memory_logs.setdefault(name, MemoryLog(settings.retention))

    async def _run_writer(self, topic: Topic, sync_interval: float | None, scope: trio.CancelScope) -> None:
        """The topic's writer, in the broker's nursery; if it fails, only its topic stops."""
        with scope:
            try:
                await topic.run_writer(sync_interval)
            except Exception as failure:
                self._topic_failed(topic, failure)

    def _topic_failed(self, topic: Topic, failure: Exception) -> None:
        """Contain an unexpected exception to its topic: log it once, end the topic's producers
        and readers with INTERNAL, close its log, and forget it: the next publish or subscribe
        opens it again from what is stored (recovery checks it), as after a restart."""
        log.error(
            "topic %s failed; its producers and readers get INTERNAL, the next request reopens it",
            topic.name,
            exc_info=failure,
        )
        self._close_topic(topic)
        topic.fail(
            StreamError(
                ErrorCode.INTERNAL,
                f"topic {topic.name!r} failed ({type(failure).__name__}); it is reopened on the next request",
                {"topic": topic.name},
            )
        )

    def delete_topic(self, topic: Topic) -> None:
        """Remove the topic and everything stored of it (records, cursors); its producers and
        readers (a pattern reader too) end with UNKNOWN_PUBLISHER."""
        self._memory_logs.pop(topic.name, None)
        self._cursors.pop(topic.name, None)
        self._close_topic(topic)
        topic.fail(StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"topic {topic.name!r} was deleted", {"topic": topic.name}))
        if self.data_dir is not None and (self.data_dir / topic.name).exists():
            shutil.rmtree(self.data_dir / topic.name)

    def _close_topic(self, topic: Topic) -> None:
        """Stop the topic's writer, close its log, and forget it (its data stays on disk)."""
        if self.topics.get(topic.name) is topic:
            del self.topics[topic.name]
        scope = self._writers.pop(topic, None)
        if scope is not None:
            scope.cancel()
        if topic.name in self._memory_logs:
            return  # kept for the topic's next opening (see _open_log)
        try:
            topic.log.close()
        except Exception:
            log.exception("closing the log of topic %s failed", topic.name)

    # -- cursors ----------------------------------------------------------------------------

    @staticmethod
    def _open_cursors(path: pathlib.Path) -> CursorStore:
        """The topic's committed cursors; a corrupt file is moved aside, loudly, not trusted."""
        try:
            return CursorStore.open(path)
        except CorruptData as damage:
            aside = path.with_name(f"{path.name}.corrupt-{now_ms()}")
            path.rename(aside)
            log.error(
                "cursors of %s are corrupt (%s); moved to %s, every cursor restarts", path.parent.name, damage, aside
            )
            return CursorStore.open(path)

    def commit(self, topic: Topic, cursor: str, offset: int) -> None:
        if not 0 <= offset <= topic.log.next_offset:
            raise StreamError(
                ErrorCode.REJECTED, f"cannot commit offset {offset} of {topic.name!r} (next is {topic.log.next_offset})"
            )
        store = self._cursors[topic.name]
        if isinstance(store, dict):
            store[cursor] = offset
        else:
            store.commit(cursor, offset)

    def _reader_ended(self, reader: TopicReader) -> None:
        self._watchers = [(p, r) for p, r in self._watchers if r is not reader]

    # -- acknowledgements ---------------------------------------------------------------------

    def _stored(self, topic: Topic, acknowledged: list[tuple[str, int]]) -> None:
        for producer, sequence in acknowledged:
            for subscription in list(self._acks.get((producer, topic.name), ())):
                subscription.acknowledge(sequence)

    # -- Host ----------------------------------------------------------------------------------

    def _check(self, context: StreamContext, action: str, name: str) -> None:
        if self.authorize is not None and not self.authorize(context.principal, action, name):
            self.denied += 1
            raise StreamError(ErrorCode.UNAUTHORIZED, f"not allowed to {action} {name!r}")

    def open_publisher(self, name: str, params: Any, context: StreamContext) -> Publisher[Any]:
        params = _params(params)
        if name == "$topics":  # only the topics this client may subscribe to
            return _Snapshot(
                self, lambda topic: self.authorize is None or self.authorize(context.principal, "subscribe", topic)
            )
        if name == "$commit":
            topic_name, cursor, offset = params.get("topic"), params.get("cursor"), params.get("offset")
            if not isinstance(topic_name, str) or not isinstance(cursor, str) or not isinstance(offset, int):
                raise StreamError(ErrorCode.REJECTED, "$commit needs params topic (str), cursor (str) and offset (int)")
            self._check(context, "subscribe", topic_name)
            topic = self.topics.get(topic_name)
            if topic is None:
                raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"no topic named {topic_name!r}")
            self.commit(topic, cursor, offset)
            return just({"topic": topic_name, "cursor": cursor, "offset": offset})
        if name == "$admin":  # create, delete, purge (rsnet.broker.admin), for an admin grant
            topic_name = params.get("topic")
            if not isinstance(topic_name, str):
                raise StreamError(ErrorCode.REJECTED, "$admin needs params action and topic (str)")
            _validated(validate_topic, topic_name)
            self._check(context, "admin", topic_name)
            return just(administer(self, params.get("action"), topic_name))
        if name == "$acks":
            producer, topic = params.get("producer"), params.get("topic")
            if not isinstance(producer, str) or not isinstance(topic, str):
                raise StreamError(ErrorCode.REJECTED, "$acks needs params producer (str) and topic (str)")
            self._check(context, "publish", topic)
            return _AckPublisher(self, producer, topic)
        start = params.get("from", "latest")
        cursor = params.get("cursor")
        if cursor is not None and not isinstance(cursor, str):
            raise StreamError(ErrorCode.REJECTED, "cursor must be a string")
        if is_wildcard(name):
            _validated(validate_pattern, name)
            if cursor is not None:
                raise StreamError(ErrorCode.REJECTED, "cursors are per topic: subscribe to a topic name, not a pattern")
            if start not in ("earliest", "latest") and not (isinstance(start, dict) and "timestamp" in start):
                raise StreamError(
                    ErrorCode.REJECTED, "a pattern subscription starts at 'earliest', 'latest' or a timestamp"
                )
            self._check(context, "subscribe", name)
            return _PatternPublisher(self, name, start)
        _validated(validate_topic, name)
        self._check(context, "subscribe", name)
        topic = self.topic(name, create=self.settings_for(name).auto_create)
        if topic is None:
            raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"no topic named {name!r}")
        if cursor is not None:
            committed = self._cursors[name].get(cursor)
            if committed is not None:
                start = committed
        position = resolve_start(topic, start)  # a trimmed offset is refused here, coded
        return _TopicPublisher(self, topic, position)

    def open_sink(self, name: str, params: Any, context: StreamContext) -> Subscriber[Any]:
        params = _params(params)
        _validated(validate_topic, name)
        self._check(context, "publish", name)
        producer, sequence = params.get("producer"), params.get("sequence", 0)
        if producer is not None and not isinstance(producer, str):
            raise StreamError(ErrorCode.REJECTED, "producer must be a string")
        if not isinstance(sequence, int) or isinstance(sequence, bool) or not 0 <= sequence <= MAX_SEQUENCE:
            raise StreamError(ErrorCode.REJECTED, f"sequence must be an integer from 0 to {MAX_SEQUENCE}")
        topic = self.topic(name, create=self.settings_for(name).auto_create)
        if topic is None:
            raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"no topic named {name!r}")
        return TopicSink(topic, window=self.sink_window, producer=producer, first_sequence=sequence)

    def snapshot(self) -> list[dict[str, Any]]:
        """What ``$topics`` and ``rsnet topics`` show."""
        result = []
        for name in sorted(self.topics):
            topic = self.topics[name]
            result.append(
                {
                    "topic": name,
                    "first_offset": topic.log.first_offset,
                    "next_offset": topic.log.next_offset,
                    "bytes": topic.log.size_bytes,
                    "policy": topic.policy.value,
                    "records_in": topic.records_in,
                    "records_out": topic.records_out,
                    "dropped": topic.dropped,
                    "subscribers": [
                        {"lag": reader.lag(topic), "delivered": reader.delivered} for reader in topic.readers
                    ],
                    "producers": len(topic.sinks),
                }
            )
        return result


def _params(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise StreamError(ErrorCode.REJECTED, "params must be a map")
    return params


def _validated(check: Callable[[str], str], name: str) -> None:
    try:
        check(name)
    except ValueError as invalid:
        raise StreamError(ErrorCode.REJECTED, str(invalid)) from None


class _TopicPublisher(Publisher[Any]):
    def __init__(self, broker: Broker, topic: Topic, position: int) -> None:
        self._broker, self._topic, self._position = broker, topic, position

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        reader = TopicReader(subscriber, on_end=self._broker._reader_ended)
        subscriber.on_subscribe(reader)
        reader.add_topic(self._topic, self._position)


class _PatternPublisher(Publisher[Any]):
    def __init__(self, broker: Broker, pattern: str, start: Any) -> None:
        self._broker, self._pattern, self._start = broker, pattern, start

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        broker = self._broker
        reader = TopicReader(subscriber, on_end=broker._reader_ended)
        subscriber.on_subscribe(reader)
        broker._watchers.append((self._pattern, reader))
        for name, topic in list(broker.topics.items()):
            if topic_matches(self._pattern, name):
                reader.add_topic(topic, resolve_start(topic, self._start))


class _Snapshot(Publisher[Any]):
    def __init__(self, broker: Broker, visible: Callable[[str], bool]) -> None:
        self._broker, self._visible = broker, visible

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        entries = [entry for entry in self._broker.snapshot() if self._visible(entry["topic"])]
        from_iterable(entries).subscribe(subscriber)


class _AckPublisher(Publisher[Any]):
    def __init__(self, broker: Broker, producer: str, topic: str) -> None:
        self._broker, self._producer, self._topic = broker, producer, topic

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        broker = self._broker
        key = (self._producer, self._topic)
        subscription = _AckSubscription(subscriber, self._producer, self._topic, lambda s: broker._acks[key].discard(s))
        broker._acks.setdefault(key, set()).add(subscription)
        subscriber.on_subscribe(subscription)
        topic = broker.topics.get(self._topic)
        if topic is not None:
            last = topic.log.last_sequence(self._producer)
            if last is not None:
                subscription.acknowledge(last)


class _AckSubscription(Subscription):
    """Emits the latest acknowledged sequence when there is demand (older ones are implied)."""

    def __init__(self, subscriber: Subscriber[Any], producer: str, topic: str, on_end: Callable[[Any], None]) -> None:
        self.subscriber: Subscriber[Any] | None = subscriber
        self.producer, self.topic = producer, topic
        self.requested = 0
        self.latest: int | None = None
        self.sent: int | None = None
        self._on_end = on_end
        self._emitting = False

    def request(self, n: int) -> None:
        if self.subscriber is None:
            return
        if n <= 0:
            subscriber = self.subscriber
            self.cancel()
            deliver_safely(subscriber.on_error, invalid_request(n))
            return
        self.requested = add_demand(self.requested, n)
        self._emit()

    def cancel(self) -> None:
        if self.subscriber is not None:
            self.subscriber = None
            self._on_end(self)

    def acknowledge(self, sequence: int) -> None:
        if self.latest is None or sequence > self.latest:
            self.latest = sequence
            self._emit()

    def _emit(self) -> None:
        if self._emitting:
            return
        self._emitting = True
        try:
            while (
                self.subscriber is not None and self.requested and self.latest is not None and self.latest != self.sent
            ):
                self.sent = self.latest
                if self.requested != MAX_DEMAND:
                    self.requested -= 1
                deliver_safely(
                    self.subscriber.on_next, {"topic": self.topic, "producer": self.producer, "sequence": self.sent}
                )
        finally:
            self._emitting = False
