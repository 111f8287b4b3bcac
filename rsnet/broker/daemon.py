"""``rsnet broker``: the broker daemon, from configuration to listening sockets.

Loads the configuration (file, ``RSNET_BROKER__*`` environment, command line; see
:mod:`rsnet.broker.config`), then runs in one nursery: the :class:`Broker` (topic writers,
retention), the rsnet server on TCP and optionally WebSocket (TLS if configured), and the
metrics/health HTTP endpoint if configured. SIGTERM or SIGINT shuts down gracefully: stop
accepting, GO_AWAY, drain for ``--grace`` seconds, close the logs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import ipaddress
import itertools
import json
import logging
import operator
import os
import signal
import ssl
import sys
from collections.abc import Iterator
from typing import Any

import trio

from ..errors import StreamError
from ..net.gc_tuning import tune_for_serving
from ..net.server import Server, connection_limit
from ..protocol import ErrorCode
from .auth import Authorizer, Principal
from .broker import Broker, TopicSettings
from .config import BrokerConfig, ConfigError, declared_topics, load_config, topic_config
from .heap import Heap, release_free_memory
from .live import Endpoint, LiveView
from .logging import JsonFormatter, configure_logging
from .metrics import MAX_PRODUCER_SERIES, MAX_SUBSCRIBER_SERIES, BrokerMetrics, connection_budget, serve_http
from .storage import FsyncPolicy, Retention, StorageError
from .topic import SlowPolicy

log = logging.getLogger("rsnet.broker")


def build_broker(config: BrokerConfig, authorizer: Authorizer) -> Broker:
    """A :class:`Broker` set up as ``config`` says."""

    def settings_for(name: str) -> TopicSettings:
        configured = topic_config(config, name)
        retention = configured.retention
        return TopicSettings(
            durable=configured.storage == "durable",
            retention=Retention(
                max_records=retention.max_records,
                max_bytes=retention.max_bytes,
                max_age_ms=retention.max_age_ms,
                max_producers=retention.max_producers,
                producer_max_age_ms=retention.producer_max_age_ms,
            ),
            policy=SlowPolicy(configured.slow_subscriber.policy),
            max_lag=configured.slow_subscriber.max_lag,
            auto_create=configured.auto_create == "publish",
            wait_if_missing=configured.subscribe_missing == "wait",
            sources=configured.sources,
        )

    def authorize(principal: Principal | None, action: str, name: str) -> bool:
        if action == "publish":
            return authorizer.can_publish(principal, name)
        if action == "admin":
            return authorizer.can_admin(principal, name)
        return authorizer.can_subscribe(principal, name)

    return Broker(
        data_dir=config.data_dir,
        fsync=FsyncPolicy[config.fsync.upper()],
        fsync_interval=config.fsync_interval_ms / 1000,
        unclean_recovery=config.unclean_recovery,
        settings_for=settings_for,
        authorize=authorize,
        max_topics=config.max_topics,
        max_open_topics=config.max_open_topics,
        idle_close_s=config.idle_topic_close_s,
        memory_budget_bytes=config.memory_budget_bytes,
    )


def _ssl_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The listeners' TLS context; ConfigError naming both files if they do not load (a
    certificate and key swapped, not PEM, or not a pair), which OpenSSL's own message does not."""
    tls = config.listen.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except ssl.SSLError as error:
        raise ConfigError(
            f"listen.tls: the certificate {tls.cert} and the key {tls.key} do not load together ({error}): cert "
            "must be the PEM certificate chain, key its PEM private key"
        ) from None
    return context


def metrics_refresher(broker: Broker, server: Server) -> Any:
    """Bring the gauges and counters up to date from the broker's state at each scrape."""
    seen: dict[str, tuple[int, int, int, int]] = {}
    failures_seen: dict[str, int] = {}  # topic -> storage failures already counted
    producers: set[tuple[str, str]] = set()
    denied = unauthenticated = 0
    reader_ids: dict[int, str] = {}
    numbers = itertools.count(1)
    counts = {"connections": 0, "publish": 0, "subscribe": 0}
    welcomed = 0  # server.sessions_opened at the last scrape

    def follow(key: str, now: int, opened: Any, closed: Any) -> None:
        # The metrics keep gauges through opened/closed calls: replay the difference.
        for _ in range(now - counts[key]):
            opened()
        for _ in range(counts[key] - now):
            closed()
        counts[key] = now

    def refresh(metrics: BrokerMetrics) -> None:
        nonlocal denied, unauthenticated, welcomed
        # Connections opened since the last scrape, those that also closed meanwhile included
        # (a CLI command's connection lasts less than a scrape interval), then those closed.
        opened, welcomed = server.sessions_opened - welcomed, server.sessions_opened
        for _ in range(opened):
            metrics.connection_opened()
        for _ in range(counts["connections"] + opened - len(server.sessions)):
            metrics.connection_closed()
        counts["connections"] = len(server.sessions)
        for _ in range(broker.denied - denied):
            metrics.auth_denied("forbidden")
        denied = broker.denied
        for _ in range(server.unauthenticated - unauthenticated):
            metrics.auth_denied("unauthenticated")
        unauthenticated = server.unauthenticated
        topics = list(broker.topics.values())
        patterns = broker.pattern_subscriptions()  # each one series, whatever it matches
        follow(
            "publish",
            sum(len(t.sinks) for t in topics),
            lambda: metrics.stream_opened("publish"),
            lambda: metrics.stream_closed("publish"),
        )
        follow(
            "subscribe",
            len(patterns) + sum(1 for t in topics for reader in t.readers if reader not in patterns),
            lambda: metrics.stream_opened("subscribe"),
            lambda: metrics.stream_closed("subscribe"),
        )
        live: set[str] = set()
        # Own series for the subscribers furthest behind and the producers with most in flight
        # only (MAX_SUBSCRIBER_SERIES): (lag or demand, topic or pattern, reader or producer).
        behind: list[tuple[int, str, Any]] = []
        in_flight: list[tuple[int, str, str]] = []
        for name, topic in broker.topics.items():
            records_in, records_out, dropped, disconnected = seen.get(name, (0, 0, 0, 0))
            if topic.records_in > records_in:
                metrics.records_in(name, topic.records_in - records_in)
            if topic.records_out > records_out:
                metrics.records_out(name, topic.records_out - records_out)
            if topic.dropped > dropped:
                metrics.records_dropped(name, topic.dropped - dropped)
            for _ in range(topic.disconnected - disconnected):
                metrics.slow_subscriber_disconnected(name)
            seen[name] = (topic.records_in, topic.records_out, topic.dropped, topic.disconnected)
            in_flight += [(sink.in_flight, name, sink.producer) for sink in topic.sinks if sink.producer is not None]
            metrics.set_storage(name, topic.log.size_bytes, topic.log.next_offset - topic.log.first_offset)
            counted = failures_seen.get(name, 0)
            if topic.storage_failures < counted:  # a new Topic object: the topic was reopened
                counted = 0
            failures_seen[name] = topic.storage_failures
            metrics.set_storage_faults(
                name,
                sum(d.end - d.first for d in topic.log.damaged_ranges),
                topic.storage_failure is not None,
                topic.storage_failures - counted,
            )
            lags = [(reader.lag(topic), name, reader) for reader in topic.readers if reader not in patterns]
            metrics.set_subscribers(name, len(lags), max((lag for lag, _, _ in lags), default=0))
            behind += lags
        behind += [(reader.total_lag(), pattern, reader) for reader, pattern in patterns.items()]
        for lag, name, reader in heapq.nlargest(MAX_SUBSCRIBER_SERIES, behind, key=operator.itemgetter(0)):
            label = reader_ids.setdefault(id(reader), f"s{next(numbers)}")
            live.add(label)
            metrics.set_lag(name, label, lag)  # (a pattern's: over all its topics, under its pattern)
            metrics.set_demand(label, reader.requested)
        live_producers: set[tuple[str, str]] = set()
        for demand, name, producer in heapq.nlargest(MAX_PRODUCER_SERIES, in_flight, key=operator.itemgetter(0)):
            metrics.set_producer_demand(name, producer, demand)
            live_producers.add((name, producer))
        for name, report in broker.recovery.items():  # closed topics: as their last opening found them
            if name not in broker.topics:
                metrics.set_storage_faults(name, sum(d.end - d.first for d in report.damaged_ranges), False)
        for gone in producers - live_producers:
            metrics.remove_producer(*gone)
        producers.clear()
        producers.update(live_producers)
        for key, label in list(reader_ids.items()):
            if label not in live:
                metrics.remove_subscriber(label)
                del reader_ids[key]

    return refresh


async def run_broker(args: argparse.Namespace) -> int:
    overrides = {
        "data_dir": args.data_dir,
        "listen.tcp": list(args.tcp) if args.tcp else None,
        "listen.ws": list(args.ws) if args.ws else None,
        "fsync": args.fsync,
        "metrics.listen": args.metrics,
    }
    try:
        config = load_config(args.config, os.environ, overrides)
        tls = _ssl_context(config)
    except ConfigError as error:
        print(f"rsnet broker: {error}", file=sys.stderr)
        return 2
    configure_logging(config.log.format == "json", config.log.level)
    heap = Heap()
    heap.fix_mmap_threshold()  # this process is the broker's own: see rsnet/broker/heap.py
    authorizer = Authorizer(config.auth)
    broker = build_broker(config, authorizer)
    max_connections = connection_limit(config.listen.max_connections)
    if max_connections < config.listen.max_connections and "max_connections" in config.listen.model_fields_set:
        log.warning(
            "max_connections lowered from %d to %d: connections get half of the process's file "
            "descriptor limit less 32, the topics the rest (raise `ulimit -n` to allow more)",
            config.listen.max_connections,
            max_connections,
        )
    if config.max_open_topics is not None and broker.max_open_topics < config.max_open_topics:
        log.warning(
            "max_open_topics lowered from %d to %d: open topics get an eighth of the process's file descriptor "
            "limit (raise `ulimit -n` to allow more)",
            config.max_open_topics,
            broker.max_open_topics,
        )
    server = Server(
        host=broker,
        authenticate=authorizer.authenticate,
        keepalive_interval=config.listen.keepalive_interval_s,
        max_connections=max_connections,
        handshake_timeout=config.listen.handshake_timeout_s,
        output_budget_bytes=config.listen.output_budget_bytes,
    )
    metrics = BrokerMetrics()
    metrics.add_refresher(metrics_refresher(broker, server))

    def health() -> dict[str, Any]:
        damaged = {name: report.damaged for name, report in broker.recovery.items() if report.damaged}
        failing = {name: topic.storage_failure for name, topic in broker.topics.items() if topic.storage_failure}
        failing.update(broker.unopenable)  # a topic that cannot be opened refuses everyone
        return {
            "healthy": not failing,  # a topic that cannot store refuses its producers
            "topics": broker.topic_count,
            "open_topics": len(broker.topics),
            "connections": len(server.sessions),
            "recovered_damage": damaged,
            "storage_failing": failing,
        }

    tune_for_serving()  # this process only serves: see rsnet/net/gc_tuning.py
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(broker.run)
            except StorageError as error:  # before saying anything is served or durable
                _announce(f"cannot start: {error}")
                return 1
            nursery.start_soon(release_free_memory, heap)
            for name in declared_topics(config):  # named outright: exist even without auto_create
                broker.topic(name, create=True)
            described = config.describe()
            described["listen"]["max_connections"] = max_connections  # as lowered, if it was
            log.info("configuration: %s", json.dumps(described))
            scheme = "tls" if tls else "tcp"
            tcp, ws = config.listen.tcp, config.listen.ws
            websocket = None  # where the live view's page connects
            if tcp is not None:
                port = await _listen(nursery, functools.partial(server.serve_tcp, ssl_context=tls), tcp)
                _announce(f"serving {scheme}://{tcp.model_copy(update={'port': port})}")  # [::1]:7600 for IPv6
            if ws is not None:
                port = await _listen(nursery, functools.partial(server.serve_websocket, ssl_context=tls), ws)
                _announce(f"serving {'wss' if tls else 'ws'}://{ws.model_copy(update={'port': port})}/")
                websocket = Endpoint("wss" if tls else "ws", None if _wildcard(ws.host) else ws.host, port)
            for address in (tcp, ws):
                if address is not None and not authorizer.enabled and not _loopback(address.host):
                    log.warning(
                        "listening on %s with auth off: anyone who can reach it may publish and subscribe "
                        "to every topic (configure [[auth.tokens]])",
                        address,
                    )
            if config.metrics is not None:
                live = LiveView(websocket, auth=authorizer.enabled)
                http = config.metrics.listen
                with _naming(http):
                    listeners = await nursery.start(
                        functools.partial(serve_http, pages=live.respond, max_connections=connection_budget()),
                        metrics,
                        http.host,
                        http.port,
                        health,
                    )
                bound = http.model_copy(update={"port": listeners[0].socket.getsockname()[1]})  # port 0: the chosen one
                _announce(f"metrics on http://{bound}/metrics")
                alone = (
                    ""
                    if websocket
                    else " (no WebSocket listener: start with --ws, or give the page a broker's ws:// URL)"
                )
                _announce(f"live view on http://{bound}/{alone}")
            storage = f"durable in {config.data_dir} (fsync {config.fsync})" if config.data_dir else "in memory"
            _announce(f"topics {storage}; auth {'on' if authorizer.enabled else 'off'}")
            async for _ in signals:
                _announce(
                    f"shutting down: subscriptions end now (GOING_AWAY), producers get up to {args.grace:g} s (--grace)"
                )
                broker.end_subscriptions(
                    StreamError(
                        ErrorCode.GOING_AWAY, "the broker is shutting down: subscribe again on a new connection"
                    )
                )
                await server.shutdown(grace=args.grace)
                nursery.cancel_scope.cancel()
                break
    return 0


async def _listen(nursery: trio.Nursery, serve: Any, address: Any) -> int:
    """Start a listener; an address in use or not ours is an OSError that names it."""
    with _naming(address):
        port: int = await nursery.start(serve, address.host, address.port)
    return port


@contextlib.contextmanager
def _naming(address: Any) -> Iterator[None]:
    """An OSError from starting a listener on ``address`` (in use, not ours) names it."""
    try:
        yield
    except* OSError as failed:
        error = failed.exceptions[0]
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise OSError(getattr(error, "errno", None), f"cannot listen on {address}: {reason}") from None


def _wildcard(host: str) -> bool:
    """Whether ``host`` means every address (then the page connects to the host it came from)."""
    return host in ("0.0.0.0", "::")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _announce(message: str) -> None:
    """What the operator (and a test) reads at startup: a plain line on stderr, or a log
    record when the logs are JSON lines (whatever the log level), so that every line is JSON."""
    if _json_logs():
        record = log.makeRecord(log.name, logging.INFO, __file__, 0, message, (), None)
        print(JsonFormatter().format(record), file=sys.stderr, flush=True)
    else:
        print(f"rsnet broker: {message}", file=sys.stderr, flush=True)


def _json_logs() -> bool:
    return any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers)
