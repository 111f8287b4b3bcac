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
(:meth:`Broker.run`); logs are closed when it ends, after every fsync a worker thread was
running has returned. Durable topics fsync in worker threads, at most ``sync_threads`` at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import heapq
import logging
import os
import pathlib
import reprlib
import resource
import secrets
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import trio

from ..errors import StreamError
from ..net.failures import TRACEBACKS_PER_MINUTE, RateLimitedLog
from ..net.session import StreamContext
from ..protocol import DEFAULT_MAX_FRAME_SIZE, MAX_INT, ErrorCode
from ..streams import Publisher, Subscriber, Subscription, empty, from_iterable, just
from ..streams.rules import MAX_DEMAND, add_demand, check_subscriber, invalid_request
from ..streams.subscriptions import deliver_safely
from .admin import administer
from .codes import BrokerCode
from .fences import Fences
from .names import (
    MAX_MATCH_PATTERNS,
    MAX_MATCH_WILDCARDS,
    TopicFilter,
    is_valid_topic,
    is_wildcard,
    topic_matches,
    validate_pattern,
    validate_topic,
)
from .overrides import OverrideStore, effective, nest, sources
from .recent import RecentBudget
from .retired import FILE_NAME as RETIRED_FILE
from .retired import RetiredOffsets
from .storage import (
    CorruptData,
    CursorStore,
    FsyncPolicy,
    MemoryLog,
    RecoveryReport,
    Retention,
    SegmentLog,
    StorageError,
    TopicLog,
    UncleanRecoveryNeeded,
)
from .storage import files as storage_files
from .storage.descriptors import DescriptorBudget
from .storage.memory import MemoryBudget
from .storage.segments import LOCK_NAME
from .storage.settings import FILE_NAME as SETTINGS_FILE
from .topic import (
    MAX_SEQUENCE,
    Shape,
    SlowPolicy,
    Topic,
    TopicReader,
    TopicSink,
    now_ms,
    offset_trimmed,
    resolve_start,
    storage_refusal,
    storage_state_log,
)

log = logging.getLogger("rsnet.broker")

DEFAULT_SINK_WINDOW = 1024
"""Records a producer may have sent that are not yet stored (per OFFER stream)."""

DEFAULT_SINK_WINDOW_BYTES = 4 << 20
"""About how many bytes of records a producer may have sent that are not yet stored (per
OFFER stream; see :class:`~rsnet.broker.topic.TopicSink` for how records are sized)."""

MAX_ID_LENGTH = 255
"""Longest producer id or cursor name, in characters (they are stored with records and cursors)."""

REOPEN_AFTER_S = 5.0
"""A stored topic whose log could not be opened is refused for this long from that failure
before its recovery runs again: each attempt reads its whole log, and a client repeating a
request to it would otherwise make the broker do so at every request."""

LISTED_SUBSCRIBERS = 100
"""Subscribers a ``$topics`` item lists (the furthest behind; ``subscriber_count`` counts them
all): a list of every one, some 17 bytes each, made a topic with 80,000 idle subscriptions too
large a frame for the listing, which then failed for everyone."""

DEFAULT_MAX_CURSORS = 1_000
"""Named cursors a topic keeps at most; a commit to one more is refused with REJECTED. (A write
of the topic's cursor file rewrites all of them, so this also bounds what one write costs.)"""

DEFAULT_MAX_PATTERN_TOPICS = 500_000
"""Topics that pattern subscriptions follow, summed over all of them (a ``>`` over 10,000 topics
follows 10,000): each costs about 65 bytes, and ending the subscription (its connection
closing) about 0.6 us of event loop, so this bounds them to about 32 MB and 0.3 s. A pattern
subscription that would pass it is refused with REJECTED (one already running, when a new
topic would pass it, ends so)."""

DELIVERY_OVERHEAD = 1024
"""Bytes a delivered record may take beyond its stored body (the frame, the stream id, the map's
keys or the array, the topic's name of at most 255 characters): well under 1 KiB."""

DEFAULT_MAX_RECORD_BYTES = DEFAULT_MAX_FRAME_SIZE - DELIVERY_OVERHEAD
"""The largest record (stored body: offset, timestamp, value, producer, sequence) a topic takes:
one that a subscriber with the default ``max_frame_size`` (1 MiB) can be sent. A producer of a
larger one is refused with REJECTED (before, such a record was stored, and every subscriber at
the default limit that reached it ended with FRAME_TOO_LARGE, unable to get past it)."""

DEFAULT_MAX_TOPICS = 10_000
"""Topics the broker hosts at most (in memory and on disk); a publish that would create one
more is refused with TOO_MANY_TOPICS."""


def default_max_open_topics() -> int:
    """An eighth of the process's file descriptor limit (at least 16): an open durable topic
    holds a few descriptors, and connections need theirs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, (soft if soft != resource.RLIM_INFINITY else 65536) // 8)


DEFAULT_SYNC_THREADS = 4
"""Worker threads fsyncing durable topics' logs at once, per broker (each topic has at most
one sync running; topics beyond this many wait their turn). Threads are not what limits fsyncs
on one disk: its flushes mostly queue behind each other, so a few threads keep it busy."""

DEFAULT_IDLE_CLOSE_S = 60.0
"""Seconds a durable topic stays open with no producer and no subscriber before its log (and
its file descriptors) is closed; the next request opens it again."""


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
    """Whether publishing to the topic while it does not exist creates it (only publishing does)."""
    wait_if_missing: bool = True
    """Whether a subscription to the topic while it does not exist waits for it to be created
    (as a pattern subscription waits for matching topics), or is refused (UNKNOWN_PUBLISHER)."""
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Where each setting comes from, by the dotted key of :data:`rsnet.broker.overrides.KEYS`
    (``"[[topics]] sensors.>"``...), as ``$topics`` shows it; a key left out shows ``broker``."""


@dataclasses.dataclass
class _ClosedTopic:
    """What the broker remembers of a durable topic whose log it closed (idle, or at start)."""

    first_offset: int
    next_offset: int
    size_bytes: int
    counters: tuple[int, int, int, int]  # records_in, records_out, dropped, disconnected
    expires_ms: int | None
    """When the oldest record passes the topic's ``max_age`` (None: no age limit, or empty):
    the sweep opens the topic then to apply retention, as it would if the topic were open."""


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
        fsync_interval: float = 0.1,
        settings_for: Callable[[str], TopicSettings] | None = None,
        authorize: Callable[[Any, str, str], bool] | None = None,
        sink_window: int = DEFAULT_SINK_WINDOW,
        sink_window_bytes: int = DEFAULT_SINK_WINDOW_BYTES,
        retention_sweep_s: float = 1.0,
        max_topics: int = DEFAULT_MAX_TOPICS,
        idle_close_s: float = DEFAULT_IDLE_CLOSE_S,
        max_cursors: int = DEFAULT_MAX_CURSORS,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_pattern_topics: int = DEFAULT_MAX_PATTERN_TOPICS,
        max_open_topics: int | None = None,
        unclean_recovery: bool = False,
        sync_threads: int = DEFAULT_SYNC_THREADS,
        memory_budget_bytes: int | None = None,
    ) -> None:
        self.data_dir = pathlib.Path(data_dir) if data_dir is not None else None
        self.fsync = fsync
        if fsync_interval <= 0:
            raise ValueError(f"fsync_interval must be > 0 seconds, got {fsync_interval!r}")
        self.fsync_interval = fsync_interval  # seconds between syncs under FsyncPolicy.INTERVAL
        default = TopicSettings(durable=self.data_dir is not None)
        self.settings_for = settings_for or (lambda name: default)
        self.overrides = OverrideStore(self.data_dir)  # settings an admin set on a topic ($admin)
        self.authorize = authorize
        self.sink_window = sink_window
        self.sink_window_bytes = sink_window_bytes
        self.retention_sweep_s = retention_sweep_s
        self.max_topics = max_topics
        self.idle_close_s = idle_close_s
        self.max_cursors = max_cursors
        self.max_record_bytes = max_record_bytes
        self.max_pattern_topics = max_pattern_topics
        self._pattern_topics = 0  # topics followed by the readers in _watchers, summed
        # At most the default: past it, open topics could take the descriptors connections need.
        self.max_open_topics = min(max_open_topics or default_max_open_topics(), default_max_open_topics())
        self.descriptors = DescriptorBudget(self.max_open_topics)  # durable logs holding their files open
        self.unclean_recovery = unclean_recovery  # see SegmentLog.open; off: damage it cannot place refuses its topic
        self.sync_threads = trio.CapacityLimiter(sync_threads)  # fsyncs running at once, all topics
        self.storage_files = storage_files.REAL  # how durable logs change their files (tests inject faults)
        self.topics: dict[str, Topic] = {}  # the open ones; see also _closed
        self.recovery: dict[str, Any] = {}  # topic -> RecoveryReport of its log (the last with damage)
        self.retired = RetiredOffsets(None)  # loaded from data_dir by run()
        # topic -> why its cursors file was set aside (at an opening of this process), kept in
        # its report from then on: reopening finds a good (new) file, the damage stays said.
        self._cursors_set_aside: dict[str, str] = {}
        self.denied = 0  # requests refused for lack of a grant
        self._cursors: dict[str, CursorStore | dict[str, int]] = {}
        self._cursor_writes: dict[CursorStore, list[_Answer]] = {}  # commits waiting for a write
        # Readers of a pattern, or of a topic not created yet: they get new topics that match.
        self._watchers: dict[TopicReader, str] = {}
        self._acks: dict[tuple[str, str], set[_AckSubscription]] = {}
        self._writers: dict[Topic, trio.CancelScope] = {}
        self._memory_logs: dict[str, MemoryLog] = {}
        # What memory topics hold, all together: half the machine's memory unless set.
        self.memory_budget = MemoryBudget(memory_budget_bytes or default_memory_budget())
        self._recent_budget = RecentBudget()  # encoded recent records, all topics together
        self._closed: dict[str, _ClosedTopic] = {}  # durable topics on disk whose log is closed
        self.fences = Fences()  # producers a topic's failure refused, across its reopenings
        # Topics that exist and whose log could not be opened the last time it was tried: when,
        # and why. At most one entry per topic, removed when it opens (see ``unopenable``).
        self._open_failed: dict[str, tuple[float, StorageError]] = {}
        self._idle_since: dict[Topic, float] = {}
        self._failure_log = RateLimitedLog(log, TRACEBACKS_PER_MINUTE)  # failures a client can repeat
        self._storage_log = storage_state_log()  # topics' storage failing and working again
        self._nursery: trio.Nursery | None = None
        self._retention_failing: set[str] = set()  # topics whose last retention sweep failed

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover the durable topics found in ``data_dir`` and serve until cancelled.

        Each topic found is opened (recovery checks it, :attr:`recovery` has the report) and
        closed again: it is opened for real by the first request that needs it, so that open
        files grow with the topics in use, not with the topics on disk.

        Raises StorageError, before it is started, if ``data_dir`` cannot be written, or the
        offsets of deleted topics cannot be read (see ``unclean_recovery``). A topic whose log
        cannot be opened is refused, and the rest served (:meth:`_recover_at_start`).
        """
        failure: StorageError | None = None
        data_dir_lock = -1
        try:
            if self.data_dir is not None:
                self._check_data_dir()
                data_dir_lock = _lock_data_dir(self.data_dir)
                self.retired = self._open_retired(self.data_dir)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    for directory in sorted(p for p in self.data_dir.iterdir() if p.is_dir()) if self.data_dir else []:
                        if directory.name.startswith(DELETED_PREFIX):  # a deletion that did not finish
                            _remove_deleted(directory)
                            continue
                        if directory.name.startswith(f"{RETIRED_FILE}.corrupt-"):  # set aside, said at the time
                            continue
                        if not is_valid_topic(directory.name):
                            log.warning("%s is not a topic (not a valid topic name): left alone", directory)
                            continue
                        if _unfinished_creation(directory):
                            log.warning(
                                "%s: a topic whose creation did not finish (nothing stored): removed", directory
                            )
                            shutil.rmtree(directory, ignore_errors=True)
                            continue
                        self.overrides.load(directory.name)  # before opening: they decide how
                        self._recover_at_start(directory.name)
                except StorageError as error:  # raised below, as itself, not in an exception group
                    failure = error
                    nursery.cancel_scope.cancel()
                else:
                    nursery.start_soon(self._sweep)
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            for topic in list(self.topics.values()):
                self._close_topic(topic)
            if data_dir_lock >= 0:
                os.close(data_dir_lock)
        if failure is not None:
            raise failure

    def _recover_at_start(self, name: str) -> None:
        """Open the stored topic ``name`` (its recovery places what damage it finds) and close
        it again. A topic whose log cannot be opened (damage recovery cannot place, its
        cursors unreadable, its files out of reach) stays known and refused, named in
        :attr:`unopenable`, until it opens: the other topics are served meanwhile (one topic's
        damage used to stop the whole broker's start)."""
        try:
            topic = self._open_topic(name)
        except StorageError as failure:
            log.error("topic %s cannot be opened; it is refused until it can be: %s", name, failure)
            self._closed[name] = _ClosedTopic(0, 0, 0, (0, 0, 0, 0), None)  # what it holds is unknown
            self._open_failed[name] = (trio.current_time(), failure)
            return
        self._close_topic(topic)

    def _check_data_dir(self) -> None:
        """Make sure durable topics can be stored before saying so: create ``data_dir`` and
        write, sync and delete a file in it. Raises StorageError naming the directory and why
        (a read-only mount, missing permissions, a full disk)."""
        assert self.data_dir is not None
        try:
            self.storage_files.makedirs(str(self.data_dir))
            _write_check(self.storage_files, str(self.data_dir), 0)
        except OSError as failure:
            raise StorageError(
                f"data_dir {self.data_dir} cannot be written ({failure}): durable topics could not store anything. "
                "Fix its permissions, its mount (read-only?) or its free space, or run without data_dir"
            ) from failure

    async def _sweep(self) -> None:
        """Retention and closing idle topics, once per ``retention_sweep_s``."""
        while True:
            await trio.sleep(self.retention_sweep_s)
            now = now_ms()
            for topic in list(self.topics.values()):
                if topic.storage_failure is not None:
                    if await self._storage_works_again(topic):
                        self._storage_log.log(logging.WARNING, "topic %s: storage works again", topic.name)
                        topic.storage_failure = None
                    elif topic.name not in self._memory_logs:
                        continue  # no retention: its writer repairs the log first
                    # (A memory topic's retention is what may give its memory budget back.)
                try:
                    sync = topic.log.prepare_retention(now)
                    if sync is not None:  # the log's new start made durable first, off the event loop
                        try:
                            await trio.to_thread.run_sync(sync, limiter=self.sync_threads)
                        except OSError as exc:  # retention goes on: on a full disk it is what frees space
                            log.warning("topic %s: retention's new start could not be synced (%s)", topic.name, exc)
                        if self.topics.get(topic.name) is not topic or topic.storage_failure is not None:
                            continue  # deleted, closed or failing meanwhile: the next sweep's
                    topic.log.enforce_retention(now)
                except StorageError as failure:  # tried again next sweep; the topic goes on
                    if topic.name not in self._retention_failing:  # one line per failing spell
                        log.error("topic %s: retention failed: %s", topic.name, failure)
                    self._retention_failing.add(topic.name)
                except Exception as failure:
                    self._topic_failed(topic, failure)
                else:
                    self._retention_failing.discard(topic.name)
            self.close_idle_topics()
            self.expire_closed_topics(now)

    async def _storage_works_again(self, topic: Topic) -> bool:
        """Whether a failing durable topic's storage takes writes again (a disk no longer full,
        descriptors no longer used up): its log repaired, and a block written, synced and
        removed beside it, in a worker thread. So the topic stops counting as failing (in
        /health) without waiting for a producer to try; an append that fails says so again."""
        if isinstance(topic.log, MemoryLog):  # over the memory budget: room for what it refused
            # (Room for the largest record a producer may send, as it was, is more than a small
            # budget ever has: its topics stayed failing, /health 503, for good.)
            budget = self.memory_budget
            return budget.total - budget.used >= min(topic.log.refused_memory, budget.total)
        directory = getattr(topic.log, "directory", None)
        if directory is None:
            return False
        try:
            topic.log.repair()
            await trio.to_thread.run_sync(
                _write_check, self.storage_files, directory, self.max_record_bytes, limiter=self.sync_threads
            )
        except (StorageError, OSError):
            return False
        return self.topics.get(topic.name) is topic  # (not closed or deleted meanwhile)

    def expire_closed_topics(self, now: int, limit: int = 8) -> int:
        """Apply age retention to closed topics whose oldest record expired (as of ``now``, ms
        since the epoch): open, enforce, close again; at most ``limit`` per call, oldest first,
        so that a sweep stays short whatever the number of topics. Returns how many it did."""
        due = sorted(
            (closed.expires_ms, name)
            for name, closed in self._closed.items()
            if closed.expires_ms is not None and closed.expires_ms <= now
        )
        for _, name in due[:limit]:
            try:
                topic = self._open_topic(name)
            except StreamError:  # too many topics open and in use: retried later
                self._closed[name].expires_ms = now + 60_000
                continue
            except Exception:
                self._failure_log.exception("opening topic %s to apply its retention failed; retried later", name)
                self._closed[name].expires_ms = now + 60_000
                continue
            try:
                topic.log.enforce_retention(now)
            except Exception as failure:
                self._topic_failed(topic, failure)
                continue
            self._close_topic(topic, now)
        return min(len(due), limit)

    def close_idle_topics(self, now: float | None = None) -> int:
        """Close the logs of durable topics that had no producer, subscriber or pending write
        for ``idle_close_s`` (as of ``now``, trio time); returns how many were closed."""
        now = trio.current_time() if now is None else now
        closed = 0
        for topic in list(self.topics.values()):
            if topic.name in self._memory_logs:
                continue  # no file descriptors to give back
            if not topic.idle:
                self._idle_since.pop(topic, None)
                continue
            since = self._idle_since.setdefault(topic, now)
            if now - since >= self.idle_close_s:
                self._close_topic(topic)
                closed += 1
        return closed

    # -- topics -------------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        """Whether the topic exists: open, or stored and closed."""
        return name in self.topics or name in self._closed or name in self._memory_logs

    def topic_names(self) -> list[str]:
        """Every topic's name, open or closed, sorted."""
        return sorted(self.topics.keys() | self._closed.keys() | self._memory_logs.keys())

    def end_subscriptions(self, error: StreamError) -> None:
        """End every topic and pattern subscription with ``error``; producers go on.

        For a shutdown: a subscription never completes, so waiting for the open streams to end
        would hold a restart for its whole grace whenever anyone reads. Its subscriber resumes
        from the offset after its last record on a new connection (``follow``, the Spark
        source); a producer's offer and ``$acks`` still drain within the grace."""
        readers = {reader for topic in self.topics.values() for reader in topic.readers}
        for reader in [*readers, *self._watchers]:
            reader.fail(error)

    def pattern_subscriptions(self) -> dict[TopicReader, str]:
        """Pattern subscriptions, and subscriptions to topics that do not exist yet, with their
        pattern (or name)."""
        return dict(self._watchers)

    @property
    def waiting_subscriptions(self) -> int:
        """Pattern subscriptions, and subscriptions to topics that do not exist yet."""
        return len(self._watchers)

    @property
    def topic_count(self) -> int:
        return len(self.topics.keys() | self._closed.keys() | self._memory_logs.keys())

    def topic(self, name: str, *, create: bool) -> Topic | None:
        """The topic, opened if it exists; if not, created if ``create``, else None.

        Raises StreamError TOO_MANY_TOPICS if creating it would pass ``max_topics``.
        """
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        if not self.exists(name):
            if not create:
                return None
            if self.topic_count >= self.max_topics:
                raise StreamError(
                    BrokerCode.TOO_MANY_TOPICS,
                    f"cannot create topic {name!r}: the broker hosts its maximum of {self.max_topics} topics",
                    {"topic": name, "max_topics": self.max_topics},
                )
        failed = self._open_failed.get(name)
        if failed is not None and trio.current_time() < failed[0] + REOPEN_AFTER_S:
            failure = failed[1]  # refused from that failure, without reading its log again
        else:
            try:
                topic = self._open_topic(name)
            except StorageError as error:  # e.g. no space for a new topic's directory: refuse this stream only
                # Rate-limited: a client retrying a publish to a topic a full disk cannot create
                # would otherwise write a line per attempt (2,000 in 0.8 s, measured).
                self._failure_log.log(logging.ERROR, "topic %s cannot be opened: %s", name, error)
                if self.exists(name):  # (one that could not be created does not exist: its refusal says it)
                    self._open_failed[name] = (trio.current_time(), error)
                elif self.data_dir is not None:
                    _remove_unfinished(self.data_dir / name)
                failure = error
            else:
                self._open_failed.pop(name, None)
                return topic
        raise storage_refusal(name, failure, f"topic {name!r} cannot be opened: {failure}")

    @property
    def unopenable(self) -> dict[str, str]:
        """Topics that exist and whose log could not be opened the last time it was tried, and
        why (for /health and ``$topics``)."""
        return {name: f"cannot be opened: {failure}" for name, (_, failure) in self._open_failed.items()}

    def settings(self, name: str) -> TopicSettings:
        """The topic's effective settings: ``settings_for``'s, with those an administrator set
        on the topic winning (:mod:`rsnet.broker.overrides`), and its storage as it was
        created, whatever these say now (:meth:`fixed_storage`)."""
        return self.fixed_storage(name, self.overrides.apply(name, self.settings_for(name)))

    def fixed_storage(self, name: str, settings: TopicSettings) -> TopicSettings:
        """``settings`` with the storage ``name`` was created with, if it exists: a topic
        stored on disk stays durable and one in memory stays in memory when the configuration
        or its settings file says otherwise since (a durable topic opened in memory would hide
        its records and give their offsets to new ones)."""
        if name in self._memory_logs:
            durable = False
        elif name in self._closed or (name in self.topics and isinstance(self.topics[name].log, SegmentLog)):
            durable = True
        elif self.data_dir is not None and _holds_a_log(self.data_dir / name):
            durable = True  # found at start
        else:
            return settings  # not created yet: the settings decide
        if durable == (settings.durable and self.data_dir is not None):
            return settings
        return dataclasses.replace(settings, durable=durable, sources={**settings.sources, "storage": "creation"})

    def _open_topic(self, name: str) -> Topic:
        self.overrides.reload_if_changed(name)  # an unusable settings file an operator fixed since
        settings = self.settings(name)
        if settings.sources.get("storage") == "creation":
            log.warning(
                "topic %s: kept %s, as it was created; its configured storage applies to new topics only",
                name,
                "on disk" if settings.durable else "in memory",
            )
        new = not self.exists(name)
        topic_log = self._open_log(name, settings)
        topic = Topic(
            name,
            topic_log,
            policy=settings.policy,
            max_lag=settings.max_lag,
            on_stored=self._stored,
            failure_log=self._failure_log,
            storage_log=self._storage_log,
            on_storage_failed=self._storage_failed,
            recent_budget=self._recent_budget,
            fences=self.fences,
            on_damage_found=self._damage_found,
        )
        closed = self._closed.pop(name, None)
        if closed is not None:
            topic.records_in, topic.records_out, topic.dropped, topic.disconnected = closed.counters
        self.topics[name] = topic
        durable = settings.durable and self.data_dir is not None
        interval = self.fsync_interval if durable and self.fsync is FsyncPolicy.INTERVAL else None
        assert self._nursery is not None, "the broker is not running"
        scope = self._writers[topic] = trio.CancelScope()
        self._nursery.start_soon(self._run_writer, topic, interval, durable and self.fsync is FsyncPolicy.ALWAYS, scope)
        if new:  # a stored topic's readers came to it themselves, when they subscribed
            for reader, pattern in list(self._watchers.items()):
                if topic_matches(pattern, name) and not reader.cancelled:
                    self._follow(reader, topic, topic_log.first_offset)
        return topic

    def _open_log(self, name: str, settings: TopicSettings) -> TopicLog:
        """The topic's log and cursors: opened (recovered) from ``data_dir``, or in memory.

        A memory topic's log and cursors live as long as the broker, so that a topic closed
        after a failure comes back with its records when it is opened again.
        """
        if settings.durable and self.data_dir is not None:
            segment_log, report = SegmentLog.open(
                self.data_dir / name,
                settings.retention,
                self.fsync,
                file_ops=self.storage_files,
                unclean_recovery=self.unclean_recovery,
                descriptors=self.descriptors,
            )
            if report.damaged or name not in self.recovery:
                # A report of damage stays while this process runs (/health shows it): opening
                # the topic again finds nothing where the first repair was (a rewritten mark).
                self.recovery[name] = report
            if report.damaged:
                log.warning("topic %s: recovered with damage: %s", name, "; ".join(report.damaged))
            try:  # whatever stops the opening from here, the log it opened is closed again
                cursors = self._cursors_beside(name, segment_log, report)
            except BaseException:
                segment_log.close()
                raise
            self._cursors[name] = cursors
            segment_log.max_record_bytes = self.max_record_bytes
            return segment_log
        self._cursors.setdefault(name, {})
        memory_log = self._memory_logs.get(name)
        if memory_log is None:
            memory_log = self._memory_logs[name] = MemoryLog(settings.retention, self.memory_budget)
        self._go_on_from_retired(name, memory_log)
        memory_log.max_record_bytes = self.max_record_bytes
        return memory_log

    def _cursors_beside(self, name: str, segment_log: SegmentLog, report: RecoveryReport) -> CursorStore:
        """The cursors of a durable topic whose log was just opened, checked against it, and the
        log moved on to a deleted namesake's next offset (``retired.py``). Raises
        UncleanRecoveryNeeded (cursors that cannot be read, or past the log's end) or
        StorageError, as the opening must stop."""
        assert self.data_dir is not None
        kept = self._cursors.get(name)  # from an earlier opening: it may have commits to write
        cursors = kept if isinstance(kept, CursorStore) else self._open_cursors(self.data_dir / name / "cursors")
        if name in self._cursors_set_aside:
            report.damaged.append(self._cursors_set_aside[name])
        committed = max(cursors.all().values(), default=0)
        if committed > segment_log.next_offset and self.fsync is not FsyncPolicy.NEVER:
            # A commit never passes what was stored (durable_offset), so the log lost records
            # it had: its newest segment deleted by hand, say, which leaves no other trace.
            # Going on would give their offsets to new records, and these cursors would skip
            # them. (Under NEVER an OS crash may take back stored records: its accepted risk.)
            problem = (
                f"{self.data_dir / name}: cursors were committed up to offset {committed}, but the log ends at "
                f"{segment_log.next_offset}: its newest records are missing (a segment file deleted by hand?)"
            )
            if not self.unclean_recovery:
                raise UncleanRecoveryNeeded(
                    f"{problem}. Nothing was changed. To start anyway, giving those offsets to new records "
                    "(cursors beyond the end then skip them), set unclean_recovery = true in the broker's "
                    "configuration for one start."
                )
            log.warning("topic %s: %s; unclean_recovery: new records get those offsets", name, problem)
        self._go_on_from_retired(name, segment_log)
        return cursors

    def _go_on_from_retired(self, name: str, topic_log: TopicLog) -> None:
        """A topic created under a deleted one's name starts at the offset that one had reached
        (``retired.py``). Raises StorageError if a durable log cannot store its new start."""
        start = self.retired.get(name)
        if start is None:
            return
        if topic_log.first_offset == topic_log.next_offset < start:
            topic_log.advance(start)
        # Else the topic was not deleted after all: the broker stopped between keeping the
        # offset and removing the directory. Either way the entry has done its work.
        self.retired.forget(name, self.storage_files)

    async def _run_writer(
        self, topic: Topic, sync_interval: float | None, sync_each_append: bool, scope: trio.CancelScope
    ) -> None:
        """The topic's writer, in the broker's nursery; if it fails, only its topic stops."""
        with scope:
            try:
                await topic.run_writer(sync_interval, sync_each_append=sync_each_append, sync_threads=self.sync_threads)
            except Exception as failure:
                self._topic_failed(topic, failure)

    def _topic_failed(self, topic: Topic, failure: Exception) -> None:
        """Contain an unexpected exception to its topic: log it (with the broker's bounded
        traceback budget), end the topic's producers and readers with INTERNAL, and close its
        log: the next request opens it again from what is stored (recovery checks it), as
        after a restart. Must be called from the ``except`` block that caught ``failure``."""
        self._failure_log.exception(
            "topic %s failed; its producers and readers get INTERNAL, the next request reopens it", topic.name
        )
        self._close_topic(topic)
        topic.fail(
            StreamError(
                ErrorCode.INTERNAL,
                f"topic {topic.name!r} failed ({type(failure).__name__}); it is reopened on the next request",
                {"topic": topic.name},
            )
        )

    def _damage_found(self, topic: Topic) -> None:
        """A read of the topic found records damaged since its log was opened: close it (after
        the reader that found them has ended its stream with the error), so that the next
        request opens it again, and recovery places the damage as a damaged range, as at a
        start (or, if it cannot, the topic is refused and /health says why)."""
        assert self._nursery is not None, "the broker is not running"
        self._nursery.start_soon(self._reopen_damaged, topic)

    async def _reopen_damaged(self, topic: Topic) -> None:
        if self.topics.get(topic.name) is not topic:
            return  # closed already (another reader found the damage too, or it went idle)
        log.error("topic %s: damaged records found while reading; closing it to place the damage", topic.name)
        self._close_topic(topic)
        topic.fail(
            StreamError(
                BrokerCode.STORAGE_ERROR,
                f"topic {topic.name!r}: damaged records were found while reading; it is opened again, with the "
                "damage placed, on the next request: subscribe (or offer) again",
                {"topic": topic.name},
            )
        )

    def delete_topic(self, topic: Topic) -> None:
        """Remove the (open) topic and everything stored of it (records, cursors); its
        producers, their ``$acks`` and its readers end with UNKNOWN_PUBLISHER, but for
        pattern subscriptions, which go on with their other topics. Its next offset is kept
        first, for a topic created under its name (``retired.py``); raises StreamError
        STORAGE_FULL or STORAGE_ERROR, deleting nothing, if it cannot be."""
        try:
            self.retired.retire(topic.name, topic.log.next_offset, self.storage_files)
        except OSError as failure:
            raise storage_refusal(
                topic.name, failure, f"{topic.name!r} was not deleted: its next offset cannot be kept: {failure}"
            ) from None
        memory_log = self._memory_logs.pop(topic.name, None)
        if memory_log is not None:
            memory_log.release()
        self.fences.forget_topic(topic.name)
        self._open_failed.pop(topic.name, None)
        self._close_topic(topic)  # nothing more is written to its directory
        doomed = None
        if self.data_dir is not None and (self.data_dir / topic.name).exists():
            # Out of the topics' way in one step, then removed: a removal that fails partway
            # (an unlink error, the broker killed) must not leave the remains of a topic, which
            # the next start would take for a damaged log and refuse to start on. (Not named
            # after the whole topic name: with the prefix, a long one is too long for a file.)
            doomed = self.data_dir / f"{DELETED_PREFIX}{topic.name[:100]}.{now_ms()}.{secrets.token_hex(4)}"
            try:
                self.storage_files.replace(str(self.data_dir / topic.name), str(doomed))
            except OSError as failure:  # nothing deleted: its streams end, the topic reopens on demand
                refusal = storage_refusal(
                    topic.name, failure, f"{topic.name!r} was not deleted: its directory cannot be moved: {failure}"
                )
                topic.fail(refusal)
                raise refusal from None
            try:
                self.storage_files.sync_directory(str(self.data_dir))
            except OSError as failure:  # moved all the same: an OS crash might bring it back
                log.warning("deleting topic %s: %s could not be synced: %s", topic.name, self.data_dir, failure)
        store = self._cursors.pop(topic.name, None)
        if isinstance(store, CursorStore):
            store.closed = True  # a commit waiting for its write is refused, not written into a new topic
        self.overrides.forget(topic.name)  # its file goes with the directory
        self._closed.pop(topic.name, None)
        for reader in list(topic.readers):
            pattern = self._watchers.get(reader)
            if pattern is not None and is_wildcard(pattern):
                reader.drop_topic(topic)
                self._pattern_topics -= 1
        gone = StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"topic {topic.name!r} was deleted", {"topic": topic.name})
        topic.fail(gone)
        for (_, name), subscriptions in list(self._acks.items()):
            if name == topic.name:  # its producers' acknowledgements end with them
                for subscription in list(subscriptions):
                    subscription.fail(gone)
        if doomed is not None:
            _remove_deleted(doomed)

    def _close_topic(self, topic: Topic, now: int | None = None) -> None:
        """Stop the topic's writer and close its log; the topic stays known (its data stays
        on disk, or in memory) and the next request that needs it opens it again."""
        if self.topics.get(topic.name) is topic:
            del self.topics[topic.name]
        self._idle_since.pop(topic, None)
        topic.recent.clear()  # its bytes go back to the broker's budget
        scope = self._writers.pop(topic, None)
        if scope is not None:
            scope.cancel()
        if topic.name in self._memory_logs:
            return  # kept for the topic's next opening (see _open_log)
        topic_log = topic.log
        counters = (topic.records_in, topic.records_out, topic.dropped, topic.disconnected)
        try:
            summary = _ClosedTopic(
                topic_log.first_offset,
                topic_log.next_offset,
                topic_log.size_bytes,
                counters,
                self._expiry(topic, now_ms() if now is None else now),
            )
        except Exception:  # a broken log: the topic stays known, its state unknown until reopened
            self._failure_log.exception("reading the state of topic %s failed", topic.name)
            summary = _ClosedTopic(0, 0, 0, counters, None)
        self._closed[topic.name] = summary
        try:
            topic_log.close()
        except Exception:
            self._failure_log.exception("closing the log of topic %s failed", topic.name)

    def _expiry(self, topic: Topic, now: int) -> int | None:
        max_age = self.settings(topic.name).retention.max_age_ms
        if max_age is None or topic.log.first_offset == topic.log.next_offset:
            return None
        first = topic.log.first_offset
        for damage in topic.log.damaged_ranges:  # the oldest record that can be read
            if damage.first <= first < damage.end:
                first = damage.end
        if first == topic.log.next_offset:
            return None
        oldest = topic.log.read(first, 1)
        if not oldest:
            return None
        # Not before the next minute: retention removes whole segments, so the oldest record
        # left may already be expired, waiting for its segment's turn.
        return max(oldest[0].timestamp_ms + max_age, now + 60_000)

    # -- cursors ----------------------------------------------------------------------------

    def _open_retired(self, data_dir: pathlib.Path) -> RetiredOffsets:
        """The next offsets of deleted topics. A file that cannot be read stops the start, as
        damage recovery cannot place does: without it, a topic created again under a deleted
        one's name could give that one's offsets to other records. With ``unclean_recovery``
        it is moved aside, loudly, and such topics start at 0."""
        try:
            return RetiredOffsets(str(data_dir))
        except (CorruptData, OSError) as damage:
            path = data_dir / RETIRED_FILE
            problem = f"{path}: the next offsets of deleted topics cannot be read ({damage})"
            if not self.unclean_recovery:
                raise UncleanRecoveryNeeded(
                    f"{problem}. Nothing was changed. Without them, a topic created again under a deleted one's name "
                    "would give that topic's offsets to other records. Restore the file, or set unclean_recovery = "
                    "true in the broker's configuration for one start: it is then moved aside, and such a topic "
                    "starts at offset 0."
                ) from None
            aside = _set_aside(path)
            log.error(
                "%s; unclean_recovery: moved to %s, a topic created again starts at offset 0", problem, aside.name
            )
            return RetiredOffsets(str(data_dir))

    def _open_cursors(self, path: pathlib.Path) -> CursorStore:
        """The topic's committed cursors. A file that cannot be read stops the topic's opening
        (at start, the start), as damage recovery cannot place does: without it, a consumer
        resuming by its cursor would start at its ``from`` instead, skipping records or reading
        them again, and no one would know. With ``unclean_recovery`` it is moved aside, loudly,
        and said in the topic's recovery report (which /health shows) while this process runs."""
        try:
            return CursorStore.open(path)
        except (CorruptData, OSError) as damage:
            problem = f"{path}: the committed cursors cannot be read ({damage})"
            if not self.unclean_recovery:
                raise UncleanRecoveryNeeded(
                    f"{problem}. Nothing was changed. Without them, consumers resuming by cursor would start "
                    "from their 'from' instead, skipping records or reading them again. Restore the file, or set "
                    "unclean_recovery = true in the broker's configuration for one start: it is then moved aside, "
                    "and every cursor of the topic starts again."
                ) from None
            aside = _set_aside(path)
            problem = (
                f"cursors could not be read ({damage}); unclean_recovery: moved to {aside.name}, every cursor restarts"
            )
            log.error("%s: %s", path.parent.name, problem)
            self._cursors_set_aside[path.parent.name] = problem
            return CursorStore.open(path)

    def commit(self, topic: Topic, cursor: str, offset: int) -> Publisher[Any]:
        """Commit ``cursor`` of ``topic`` at ``offset``: the answer of ``$commit``, which comes
        once the commit is stored. A durable topic's cursor file is written off the event loop
        (see :meth:`_write_cursors`); commits that arrive meanwhile share the next write."""
        # Up to what subscribers may see (durable_offset), not next_offset: a cursor is stored at
        # once, so one past records an OS crash could still take back would outlive them.
        if not 0 <= offset <= topic.log.durable_offset:
            raise StreamError(
                ErrorCode.REJECTED,
                f"cannot commit offset {offset} of {topic.name!r} (at most {topic.log.durable_offset}, past the "
                "last stored record)",
            )
        store = self._cursors[topic.name]
        known = len(store) if isinstance(store, dict) else store.names()
        if store.get(cursor) is None and known >= self.max_cursors:
            raise StreamError(
                ErrorCode.REJECTED,
                f"topic {topic.name!r} keeps at most {self.max_cursors} cursors; commit to an existing one",
                {"topic": topic.name, "max_cursors": self.max_cursors},
            )
        answer = {"topic": topic.name, "cursor": cursor, "offset": offset}
        if isinstance(store, dict):
            store[cursor] = offset
            return just(answer)
        store.stage(cursor, offset)
        pending = _Answer(answer)
        waiting = self._cursor_writes.get(store)
        if waiting is None:
            waiting = self._cursor_writes[store] = []
            assert self._nursery is not None, "the broker is not running"
            self._nursery.start_soon(self._write_cursors, topic.name, store)
        waiting.append(pending)
        return pending

    async def _write_cursors(self, name: str, store: CursorStore) -> None:
        """Write ``store``'s staged commits, in a worker thread, until none is waiting: one
        write at a time per file, each covering every commit staged before it began, so a flood
        of commits costs one write per write's duration."""
        waiting = self._cursor_writes[store]
        try:
            while waiting:
                answers = waiting[:]
                del waiting[:]
                cursors = store.staged()
                if cursors is not None:
                    try:
                        await trio.to_thread.run_sync(store.write, cursors, limiter=self.sync_threads)
                    except OSError as failure:
                        store.failed(cursors)
                        refusal = storage_refusal(
                            name, failure, f"the cursors of {name!r} could not be stored: {failure.strerror or failure}"
                        )
                        for answer in answers:
                            answer.resolve(refusal)
                        continue
                    store.written(cursors)
                for answer in answers:
                    answer.resolve()
        finally:
            del self._cursor_writes[store]

    def _reader_ended(self, reader: TopicReader) -> None:
        if self._watchers.pop(reader, None) is not None:
            self._pattern_topics -= len(reader.positions)

    def _follow(self, reader: TopicReader, topic: Topic, position: int) -> None:
        """Add ``topic`` to a pattern subscription, within ``max_pattern_topics``."""
        if self._pattern_topics >= self.max_pattern_topics:
            reader.fail(self._too_many_followed(1))
            return
        self._pattern_topics += 1
        reader.add_topic(topic, position)

    def _too_many_followed(self, more: int) -> StreamError:
        return StreamError(
            ErrorCode.REJECTED,
            f"pattern subscriptions follow at most {self.max_pattern_topics} topics in all (max_pattern_topics) and "
            f"follow {self._pattern_topics}; this one would follow {more} more: subscribe to fewer topics, or later",
            {"max_pattern_topics": self.max_pattern_topics},
        )

    # -- acknowledgements ---------------------------------------------------------------------

    def _stored(self, topic: Topic, acknowledged: list[tuple[str, int]]) -> None:
        for producer, sequence in acknowledged:
            for subscription in list(self._acks.get((producer, topic.name), ())):
                subscription.acknowledge(sequence)

    # -- Host ----------------------------------------------------------------------------------

    def _storage_failed(self, topic: Topic, error: StreamError, producers: list[str]) -> None:
        """The topic refused its producers (a full disk, a failing one): each hears why on its
        ``$acks`` too, which ends with the coded error."""
        for producer in producers:
            for subscription in list(self._acks.get((producer, topic.name), ())):
                subscription.fail(error)

    def _check(self, context: StreamContext, action: str, name: str) -> None:
        if self.authorize is not None and not self.authorize(context.principal, action, name):
            self.denied += 1
            raise StreamError(ErrorCode.UNAUTHORIZED, f"not allowed to {action} {name!r}")

    def open_publisher(self, name: str, params: Any, context: StreamContext) -> Publisher[Any]:
        params = _params(params)
        if name == "$topics":  # only the topics this client may subscribe to (and asked for)
            _known_params(params, ("match",), "$topics")
            patterns = _match_param(params.get("match"))
            for pattern in patterns or ():
                if not is_wildcard(pattern):  # a name asked for by name: say if it may not be read
                    self._check(context, "subscribe", pattern)
            wanted = None if patterns is None else TopicFilter(patterns)
            return _Snapshot(
                self,
                lambda topic: (
                    (wanted is None or wanted(topic))
                    and (self.authorize is None or self.authorize(context.principal, "subscribe", topic))
                ),
            )
        if name == "$commit":
            _known_params(params, ("topic", "cursor", "offset"), "$commit")
            topic_name, cursor, offset = params.get("topic"), params.get("cursor"), params.get("offset")
            if not isinstance(topic_name, str) or not _is_uint(offset):
                raise StreamError(
                    ErrorCode.REJECTED, "$commit needs params topic (str), cursor (str) and offset (an int >= 0)"
                )
            _validated(validate_topic, topic_name)
            cursor = _identifier(cursor, "cursor")
            self._check(context, "subscribe", topic_name)
            topic = self.topic(topic_name, create=False)
            if topic is None:
                raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"no topic named {topic_name!r}")
            return self.commit(topic, cursor, offset)
        if name == "$admin":  # create, alter, delete, purge (rsnet.broker.admin), for an admin grant
            _known_params(params, ("action", "topic", "settings", "reset"), "$admin")
            topic_name = params.get("topic")
            if not isinstance(topic_name, str):
                raise StreamError(ErrorCode.REJECTED, "$admin needs params action and topic (str)")
            _validated(validate_topic, topic_name)
            self._check(context, "admin", topic_name)
            return just(administer(self, params.get("action"), topic_name, params))
        if name == "$acks":
            _known_params(params, ("producer", "topic"), "$acks")
            producer, topic = params.get("producer"), params.get("topic")
            if not isinstance(producer, str) or not isinstance(topic, str):
                raise StreamError(ErrorCode.REJECTED, "$acks needs params producer (str) and topic (str)")
            _validated(validate_topic, topic)
            producer = _identifier(producer, "producer")
            self._check(context, "publish", topic)
            return _AckPublisher(self, producer, topic)
        _known_params(params, ("from", "until", "cursor", "items"), "a subscription")
        start = _start_position(params.get("from", "latest"))
        until = params.get("until")
        if until is not None and not _is_uint(until):
            raise StreamError(
                ErrorCode.REJECTED, f"until must be an offset (a whole number >= 0), not {reprlib.repr(until)}"
            )
        cursor = params.get("cursor")
        if cursor is not None:
            cursor = _identifier(cursor, "cursor")
        shape = params.get("items", "maps")
        if shape not in ("maps", "arrays", "stored"):
            raise StreamError(ErrorCode.REJECTED, "items must be 'maps' (the default), 'arrays' or 'stored'")
        arrays, stored = shape == "arrays", shape == "stored"
        if is_wildcard(name):
            _validated(validate_pattern, name)
            if cursor is not None:
                raise StreamError(ErrorCode.REJECTED, "cursors are per topic: subscribe to a topic name, not a pattern")
            if isinstance(start, int):
                raise StreamError(
                    ErrorCode.REJECTED, "a pattern subscription starts at 'earliest', 'latest' or a timestamp"
                )
            if until is not None:
                raise StreamError(ErrorCode.REJECTED, "until is an offset of one topic: subscribe to a topic name")
            self._check(context, "subscribe", name)
            return _PatternPublisher(self, name, start, Shape(arrays, stored, with_topic=True))
        _validated(validate_topic, name)
        self._check(context, "subscribe", name)
        topic = self.topic(name, create=False)
        if topic is None:  # only publishing creates a topic
            if not self.settings_for(name).wait_if_missing:
                raise StreamError(
                    ErrorCode.UNKNOWN_PUBLISHER,
                    f"no topic named {name!r} (subscribe_missing is fail for it: a subscription does not"
                    " wait for its first record)",
                )
            first = self.retired.get(name) or 0  # where it starts once created (retired.py)
            if until is not None and until <= (start if isinstance(start, int) else first):
                return empty()  # an empty range
            _check_start_before_creation(name, start, first)
            # Waits, as for a pattern, from its first record.
            return _PatternPublisher(self, name, "earliest", Shape(arrays, stored, with_topic=False), until)
        if cursor is not None:
            committed = self._cursors[name].get(cursor)
            if committed is not None:
                start = committed
        if until is not None and isinstance(start, int) and start >= until:
            return empty()  # an empty range, whatever the topic still holds
        position = resolve_start(topic, start)  # a trimmed offset is refused here, coded
        return _TopicPublisher(self, topic, position, Shape(arrays, stored, with_topic=False), until)

    def open_sink(self, name: str, params: Any, context: StreamContext) -> Subscriber[Any]:
        params = _params(params)
        _validated(validate_topic, name)
        self._check(context, "publish", name)
        _known_params(params, ("producer", "sequence"), "an offer")
        producer, sequence = params.get("producer"), params.get("sequence", 0)
        if producer is not None:
            producer = _identifier(producer, "producer")
        if not isinstance(sequence, int) or isinstance(sequence, bool) or not 0 <= sequence <= MAX_SEQUENCE:
            raise StreamError(ErrorCode.REJECTED, f"sequence must be an integer from 0 to {MAX_SEQUENCE}")
        topic = self.topic(name, create=self.settings_for(name).auto_create)
        if topic is None:
            raise StreamError(
                ErrorCode.UNKNOWN_PUBLISHER,
                f"no topic named {name!r}, and publishing does not create it here (auto_create is"
                " never for it): an admin creates it ($admin create; rsnet topics create)",
            )
        resume = topic.resume_point(producer)
        if producer is not None and resume is not None and sequence > resume:
            # Refused before the broker asks for a record: its producer hears of it on the
            # offer itself, before it could send and complete it. (An offer at or below the
            # resume point lifts the fence only once its records come, after the producer's
            # earlier offers on the connection: opened first, they may still be past the gap.)
            raise topic.gap_refusal(producer, sequence, resume)
        return TopicSink(
            topic,
            window=self.sink_window,
            window_bytes=self.sink_window_bytes,
            producer=producer,
            first_sequence=sequence,
            connection=context.nursery,  # the session's: one per connection
        )

    def describe_topic(self, name: str) -> dict[str, Any] | None:
        """One topic as ``$topics`` shows it, open or closed (a closed topic as it was when its
        log was closed; closing one needs no producer nor subscriber); None if there is none."""
        if name not in self.topics and name not in self._closed and name not in self._memory_logs:
            return None
        topic = self.topics.get(name)
        if topic is not None:
            first, after, size = topic.log.first_offset, topic.log.next_offset, topic.log.size_bytes
            counters = (topic.records_in, topic.records_out, topic.dropped)
            policy = topic.policy.value
            subscriber_count = len(topic.readers)
            behind = heapq.nlargest(LISTED_SUBSCRIBERS, topic.readers, key=lambda reader: reader.lag(topic))
            subscribers = [{"lag": reader.lag(topic), "delivered": reader.delivered} for reader in behind]
            producers = len(topic.sinks)
            damaged = topic.log.damaged_ranges
        else:
            closed = self._closed.get(name)
            if closed is not None:
                first, after, size = closed.first_offset, closed.next_offset, closed.size_bytes
                counters = closed.counters[:3]
            else:  # a memory topic closed after a failure: its log is still here
                memory = self._memory_logs[name]
                first, after, size = memory.first_offset, memory.next_offset, memory.size_bytes
                counters = (0, 0, 0)
            policy = self.settings(name).policy.value
            subscribers, subscriber_count, producers = [], 0, 0
            report = self.recovery.get(name)  # as its last opening found it
            damaged = [d for d in report.damaged_ranges if d.end > first] if report is not None else []
        return {
            "topic": name,
            "first_offset": first,
            "next_offset": after,
            "bytes": size,
            "policy": policy,
            "records_in": counters[0],
            "records_out": counters[1],
            "dropped": counters[2],
            "subscribers": subscribers,
            "subscriber_count": subscriber_count,
            "producers": producers,
            "cursors": self._committed(name),
            "damaged": [{"first": d.first, "end": d.end, "problem": d.problem} for d in damaged],
            **self.describe_settings(name),
            **({"unavailable": self.unopenable[name]} if name in self._open_failed else {}),
        }

    def describe_settings(self, name: str) -> dict[str, Any]:
        """The topic's effective settings as ``$topics`` shows them: ``settings`` (nested as in
        the configuration), ``settings_from`` (dotted key -> source) and, if its settings file
        cannot be used, ``settings_error``."""
        settings = self.settings(name)
        described: dict[str, Any] = {
            "settings": nest(effective(settings, self.data_dir is not None)),
            "settings_from": sources(settings),
        }
        problem = self.overrides.problem(name)
        if problem is not None:
            described["settings_error"] = problem
        return described

    def _committed(self, name: str) -> dict[str, int]:
        """The topic's named cursors and their committed offsets (e.g. a Spark query's progress)."""
        store = self._cursors.get(name)
        if store is None:
            return {}
        return dict(store) if isinstance(store, dict) else store.all()


def _match_param(match: Any) -> list[str] | None:
    """``$topics``'s ``match`` param: a topic name or pattern, or a list of them; None: all."""
    if match is None:
        return None
    patterns = [match] if isinstance(match, str) else match
    if not isinstance(patterns, list) or not 0 < len(patterns) <= MAX_MATCH_PATTERNS:
        raise StreamError(
            ErrorCode.REJECTED, f"match must be a topic name or pattern, or a list of 1 to {MAX_MATCH_PATTERNS} of them"
        )
    for pattern in patterns:
        _validated(validate_pattern, pattern)
    if sum(map(is_wildcard, patterns)) > MAX_MATCH_WILDCARDS:
        raise StreamError(
            ErrorCode.REJECTED, f"match may hold at most {MAX_MATCH_WILDCARDS} patterns with a wildcard ('*', '>')"
        )
    return patterns


def _identifier(value: Any, what: str) -> str:
    """A producer id or cursor name from the params, bounded (it is stored, and shown in errors)."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_LENGTH:
        raise StreamError(ErrorCode.REJECTED, f"{what} must be a string of 1 to {MAX_ID_LENGTH} characters")
    return value


def _check_start_before_creation(name: str, start: Any, first: int) -> None:
    """A subscription waiting for a topic reads it from its first record, ``first`` (0, or a
    deleted topic's next offset: ``retired.py``), which is where every start position but
    another offset points while the topic does not exist. An offset below it was a deleted
    topic's: OFFSET_TRIMMED, as for records removed; one past it, OFFSET_OUT_OF_RANGE."""
    if not isinstance(start, int) or start == first:
        return
    if start < first:
        raise offset_trimmed(name, start, first)
    raise StreamError(
        BrokerCode.OFFSET_OUT_OF_RANGE,
        f"offset {start} of {name!r} does not exist yet (the topic does not exist yet; its first will be {first})",
        {"topic": name, "requested": start, "next": first},
    )


DELETED_PREFIX = ".deleted-"
"""A deleted topic's directory is renamed to this prefix (never a topic name) before removal."""


def _set_aside(path: pathlib.Path) -> pathlib.Path:
    """Move a damaged file out of the way (``<name>.corrupt-<ms>``), kept for an operator."""
    aside = path.with_name(f"{path.name}.corrupt-{now_ms()}")
    path.rename(aside)
    return aside


def default_memory_budget() -> int:
    """Half the machine's memory: what memory topics may hold together unless configured."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


DATA_DIR_LOCK = ".lock"
"""The file in ``data_dir`` a running broker holds locked (``flock``): a second broker started
on the same directory stops at once, saying so, instead of writing the same logs. (Each
topic's directory has a lock of its own, but a log gives it up with its other descriptors
when it is not used for a while: ``storage/descriptors.py``.)"""


def _lock_data_dir(data_dir: pathlib.Path) -> int:
    """Lock :data:`DATA_DIR_LOCK` in ``data_dir``; returns its descriptor, to close when the
    broker stops. Raises StorageError if another process holds it."""
    path = data_dir / DATA_DIR_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as failure:
        raise StorageError(f"data_dir {data_dir}: {path} cannot be opened ({failure})") from failure
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as failure:
        os.close(fd)
        if isinstance(failure, BlockingIOError):
            raise StorageError(
                f"data_dir {data_dir} is in use by another broker (it holds {path} locked): "
                "two brokers must not share a data_dir"
            ) from None
        raise StorageError(f"data_dir {data_dir}: {path} cannot be locked ({failure})") from failure
    return fd


def _write_check(files: storage_files.FileOps, directory: str, free: int) -> None:
    """Whether ``directory`` takes writes: at least ``free`` bytes available in its file system
    (room for the largest record: a disk with room for the 4 KiB block but not for the
    records a producer resends would go from failing to working and back at every retry), and
    a block written to a file there, synced and removed. Raises OSError as they do (a
    read-only mount, missing permissions, a full disk, no descriptor left)."""
    found = os.statvfs(directory)
    if found.f_bavail * found.f_frsize < free:
        raise OSError(errno.ENOSPC, f"less than {free} bytes free")
    probe = os.path.join(directory, ".rsnet-write-check")
    fd = files.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        try:
            files.write_all(fd, bytes(4096))
            files.datasync(fd)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):  # a check that failed leaves no file behind either
            files.unlink(probe)
        raise
    files.unlink(probe)


def _holds_a_log(directory: pathlib.Path) -> bool:
    """Whether a topic's directory holds a durable log: anything but its settings (all a
    memory topic's directory holds)."""
    try:
        return bool(set(os.listdir(directory)) - {SETTINGS_FILE, f"{SETTINGS_FILE}.tmp"})
    except FileNotFoundError:  # not created
        return False
    except OSError:  # there, unreadable: opening it as a log says why
        return True


def _unfinished_creation(directory: pathlib.Path) -> bool:
    """Whether a topic's directory holds nothing but what a creation leaves before it stored
    anything: its settings (``$admin create``) or its first segment were never written. A
    crash there would otherwise bring the topic back with the configuration's settings, not
    the ones asked for (and a retried create refused). Any other file, a ``synced`` mark
    above all, means the topic existed: it is opened, and recovery says what is missing."""
    return set(os.listdir(directory)) <= {LOCK_NAME, f"{SETTINGS_FILE}.tmp"}


def _remove_unfinished(directory: pathlib.Path) -> None:
    """Remove what a refused creation left of a topic (its lock, on a full disk), if that is
    all the directory holds; best effort: the next start removes what is left
    (:func:`_unfinished_creation`)."""
    try:
        if _unfinished_creation(directory):
            shutil.rmtree(directory)
    except OSError:  # not created at all, or not removable now
        pass


def _remove_deleted(directory: pathlib.Path) -> None:
    """Remove what is left of a deleted topic; what cannot be removed now is left for the next
    start (with a warning), never in a topic's place."""
    try:
        shutil.rmtree(directory)
    except OSError as error:
        log.warning("%s (a deleted topic) could not be removed yet: %s; the next start tries again", directory, error)


def _is_uint(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_INT


def _start_position(start: Any) -> Any:
    """``start`` (a subscription's ``from``) if it is one: ``"earliest"``, ``"latest"`` (or
    None), an offset (an int >= 0), or ``{"timestamp": ms}`` (ms an int >= 0, and no other
    key); REJECTED otherwise, before any topic is looked at (booleans are not ints, SPEC 3)."""
    if start is None or start in ("earliest", "latest"):
        return start
    if _is_uint(start) or (isinstance(start, dict) and len(start) == 1 and _is_uint(start.get("timestamp"))):
        return start
    raise StreamError(
        ErrorCode.REJECTED,
        f"invalid start position {reprlib.repr(start)}: use 'earliest', 'latest', an offset >= 0 or "
        "{'timestamp': ms} with ms >= 0",
    )


def _params(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise StreamError(ErrorCode.REJECTED, "params must be a map")
    return params


def _known_params(params: dict[str, Any], known: tuple[str, ...], what: str) -> None:
    """Refuse a param ``what`` does not take: a misspelt ``from`` must not silently mean "latest"."""
    unknown = [key for key in params if key not in known]
    if unknown:
        shown = ", ".join(reprlib.repr(key) for key in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise StreamError(ErrorCode.REJECTED, f"unknown param {shown} for {what} (it takes {', '.join(known)})")


def _validated(check: Callable[[str], str], name: str) -> None:
    try:
        check(name)
    except ValueError as invalid:
        raise StreamError(ErrorCode.REJECTED, str(invalid)) from None


class _TopicPublisher(Publisher[Any]):
    def __init__(self, broker: Broker, topic: Topic, position: int, shape: Shape, until: int | None) -> None:
        self._broker, self._topic, self._position, self._shape, self._until = broker, topic, position, shape, until

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        reader = TopicReader(subscriber, on_end=self._broker._reader_ended, shape=self._shape, until=self._until)
        subscriber.on_subscribe(reader)
        reader.add_topic(self._topic, self._position)


class _PatternPublisher(Publisher[Any]):
    """A pattern's subscription, or a missing topic's (``until`` only then): it follows the
    topics that match, those created later too."""

    def __init__(self, broker: Broker, pattern: str, start: Any, shape: Shape, until: int | None = None) -> None:
        self._broker, self._pattern, self._start, self._shape, self._until = broker, pattern, start, shape, until

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        broker = self._broker
        reader = TopicReader(subscriber, on_end=broker._reader_ended, shape=self._shape, until=self._until)
        subscriber.on_subscribe(reader)
        names = [name for name in broker.topic_names() if topic_matches(self._pattern, name)]
        if broker._pattern_topics + len(names) > broker.max_pattern_topics:
            reader.fail(broker._too_many_followed(len(names)))
            return
        broker._watchers[reader] = self._pattern
        for name in names:
            if not reader.cancelled:
                try:
                    topic = broker.topic(name, create=False)
                except StreamError as refused:  # (a topic whose log failed): this subscription ends
                    reader.fail(refused)
                    return
                except Exception as failure:  # the topic's log cannot be opened
                    broker._failure_log.exception("opening topic %s for a subscription failed", name)
                    reader.fail(
                        StreamError(ErrorCode.INTERNAL, f"opening topic {name!r} failed ({type(failure).__name__})")
                    )
                    return
                if topic is not None:
                    broker._follow(reader, topic, resolve_start(topic, self._start))


class _Snapshot(Publisher[Any]):
    """``$topics``: the names listed when subscribed, each topic described only when demand
    reaches it (a listing of thousands of topics holds their names, not their descriptions)."""

    def __init__(self, broker: Broker, visible: Callable[[str], bool]) -> None:
        self._broker, self._visible = broker, visible

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        names = [name for name in self._broker.topic_names() if self._visible(name)]
        described = map(self._broker.describe_topic, names)
        from_iterable(entry for entry in described if entry is not None).subscribe(subscriber)


class _Answer(Publisher[Any], Subscription):
    """A one-item answer known later (a ``$commit`` waiting for its write), for one subscriber:
    the item then completion, or an error, once both the answer and demand are there."""

    def __init__(self, item: Any) -> None:
        self._item = item
        self._subscriber: Subscriber[Any] | None = None
        self._requested = False
        self._outcome: tuple[BaseException | None] | None = None  # (None,): the item

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        self._subscriber = subscriber
        subscriber.on_subscribe(self)
        self._deliver()

    def request(self, n: int) -> None:
        if n <= 0:
            self._outcome = (invalid_request(n),)  # rule 3.9, whatever the answer was to be
        self._requested = True
        self._deliver()

    def cancel(self) -> None:
        self._subscriber = None  # rule 3.13

    def resolve(self, error: BaseException | None = None) -> None:
        if self._outcome is None:
            self._outcome = (error,)
            self._deliver()

    def _deliver(self) -> None:
        subscriber, outcome = self._subscriber, self._outcome
        if subscriber is None or outcome is None or (outcome[0] is None and not self._requested):
            return
        self._subscriber = None  # one signal sequence, whatever the subscriber calls meanwhile
        if outcome[0] is not None:
            deliver_safely(subscriber.on_error, outcome[0])
        elif deliver_safely(subscriber.on_next, self._item):
            deliver_safely(subscriber.on_complete)


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
        try:
            topic = broker.topic(self._topic, create=False)
        except StreamError as refused:  # e.g. its log cannot be opened: rule 1.9, an error after on_subscribe
            subscription.cancel()
            deliver_safely(subscriber.on_error, refused)
            return
        if topic is not None:  # its first item: the last sequence stored, once it is durable
            last = topic.acknowledge_when_durable(self._producer)
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

    def fail(self, error: StreamError) -> None:
        """End with ``error`` (after the acknowledgements already due, if there is demand)."""
        subscriber = self.subscriber
        if subscriber is not None:
            self._emit()
            self.cancel()
            deliver_safely(subscriber.on_error, error)

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
