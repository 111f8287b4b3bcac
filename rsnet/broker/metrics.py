"""The broker's Prometheus metrics and its HTTP endpoint (``GET /metrics``, ``GET /health``,
and the live view's page when given one).

    metrics = BrokerMetrics()                     # its own registry, not prometheus_client's global one
    metrics.connection_opened()
    metrics.records_in("sensors.kitchen", 3)
    metrics.set_lag("sensors.kitchen", "conn-7/stream-3", 120)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_http, metrics, "127.0.0.1", 9100, broker_health)

Metrics (all prefixed ``rsnet_broker_``):

==========================================  =======  ====================  =========================================
name                                        type     labels                meaning
==========================================  =======  ====================  =========================================
``connections``                             gauge                          open client connections
``connections_opened_total``                counter                        connections accepted since start
``streams``                                 gauge    kind                  open streams, ``publish`` or ``subscribe``
``records_in_total``                        counter  topic                 records stored (acknowledged to producers)
``records_out_total``                       counter  topic                 records delivered to subscribers
``records_dropped_total``                   counter  topic                 records lagging subscribers skipped (``drop``)
``slow_subscriber_disconnects_total``       counter  topic                 subscribers ended for lag (``disconnect``)
``subscribers``                             gauge    topic                 live subscribers of the topic (not counting pattern subscriptions)
``subscriber_lag_max``                      gauge    topic                 the largest of their lags
``subscriber_lag``                          gauge    topic, subscriber     records between a subscriber and the head (a pattern subscription: one series, its pattern as the topic, summed over its topics); the ``MAX_SUBSCRIBER_SERIES`` subscribers furthest behind only
``subscriber_demand``                       gauge    subscriber            requested, not yet delivered (the same subscribers)
``producer_demand``                         gauge    topic, producer       requested from a producer, not yet received; the ``MAX_PRODUCER_SERIES`` producers with the most only
``storage_bytes``                           gauge    topic                 bytes the topic's log holds
``storage_records``                         gauge    topic                 records the topic's log holds
``storage_damaged_records``                 gauge    topic                 offsets found damaged on disk (never reused)
``storage_failing``                         gauge    topic                 1 while the topic's last append or sync failed
``storage_failures_total``                  counter  topic                 appends and syncs that failed (ENOSPC, EIO...)
``auth_denials_total``                      counter  reason                ``unauthenticated`` or ``forbidden``
==========================================  =======  ====================  =========================================

Per-subscriber and per-producer series are bounded: a peer can open millions of streams (80,000
idle subscriptions made each scrape 10 MB, 2 s of encoding that stalled the event loop, since the
worker thread holds the interpreter lock), so only the subscribers furthest behind and the
producers with the most in flight have their own series; the per-topic ones count them all.
They are removed with :meth:`BrokerMetrics.remove_subscriber`
and :meth:`~BrokerMetrics.remove_producer`, a topic's with :meth:`~BrokerMetrics.remove_topic`, so
label sets do not pile up. Gauges that are cheaper to read than to track (lag, storage) can be
set at scrape time by a refresher (:meth:`~BrokerMetrics.add_refresher`).

:func:`serve_http` is a trio task in the broker's nursery (it encodes /metrics in a worker thread): HTTP/1.1 parsed by h11,
keep-alive, ``GET``/``HEAD`` on ``/metrics`` (Prometheus text format, or OpenMetrics when the
scraper asks for it) and ``/health`` (JSON; 200 when the ``health()`` callback says
``"healthy": true``, else 503); the paths of ``live`` when given (the live view of
:mod:`rsnet.broker.live`: ``/`` and a few files under ``/live/``); 404 for other paths, 405 for other methods, 400 (or what h11
suggests: 413, 431...) for malformed requests, which are then closed. A request must arrive
whole within ``request_timeout`` seconds (an idle keep-alive connection is closed after as
long), bodies are capped, and at most ``max_connections``
are served at once (beyond that: a ``/health`` request is still answered, anything else gets 503, and
the connection is closed). Sockets held stay within ``max_connections``
plus :data:`REFUSAL_SLOTS`, whatever clients do, so a flood of them cannot take the descriptors
durable topics need: when every one is taken, the oldest connection is closed to make room for
the next (``rsnet.net.listening``), so silent or slow sockets cannot keep a ``/health`` probe
waiting for their timeouts.

This module imports trio, h11, prometheus_client and rsnet.net; nothing from the rest of the broker.
"""

from __future__ import annotations

import json
import logging
import resource
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal

import h11
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import choose_encoder

from ..net.failures import CONNECTION_LINES_PER_MINUTE, RateLimitedLog
from ..net.listening import Evictable, accept_within

log = logging.getLogger("rsnet.broker.metrics")

StreamKind = Literal["publish", "subscribe"]
DenialReason = Literal["unauthenticated", "forbidden"]

MAX_REQUEST_HEAD = 8192
"""Largest request line plus headers, in bytes (431 beyond)."""
MAX_REQUEST_BODY = 8192
"""Largest request body read (and discarded), in bytes (413 beyond)."""
RECEIVE_SIZE = 4096
LINGER = 1.0
"""Seconds to drain a connection being closed after an error response."""

SHARED_BODY_BYTES = 64 * 1024
"""A response body larger than this is written as it is, after its headers, not copied."""

RENDER_REUSE_S = 1.0
"""Seconds a rendering of /metrics is given again to scrapes that ask for the same format:
however many scrape, the endpoint encodes at most once a second per format."""

REFUSAL_SLOTS = 8
"""Sockets accepted beyond ``max_connections``, to be answered 503 (or, for ``/health``, its
answer): more wait in the backlog."""

REFUSAL_READ_S = 1.0
"""Seconds a refused connection's request may take to arrive: a ``GET /health`` is still
answered when every slot is taken (a busy metrics port must not read as an unhealthy broker
to a load balancer or Kubernetes, which would restart it), anything else gets 503."""


def connection_budget(descriptors: int | None = None) -> int:
    """Connections the endpoint serves at once in a process with ``descriptors`` file
    descriptors (default: the soft ``RLIMIT_NOFILE``): 64, or a 32nd of them if that is less
    (at least 2). With its :data:`REFUSAL_SLOTS`, the endpoint then holds a small share of
    them beside the listeners' half and the open topics' eighth, even at a low limit."""
    if descriptors is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        descriptors = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return max(2, min(64, descriptors // 32))


_connection_log = RateLimitedLog(
    log,
    CONNECTION_LINES_PER_MINUTE,
    "%d more metrics connection reports in the last minute were left out",
    logging.WARNING,
)

Pages = Callable[[bytes, bytes | None], tuple[int, list[tuple[bytes, bytes]], bytes] | None]
"""Extra ``GET`` routes: ``(path, if_none_match header) -> (status, headers, body)``, or None
for a path that is not theirs (:meth:`rsnet.broker.live.LiveView.respond`)."""


MAX_SUBSCRIBER_SERIES = 1_000
"""Subscribers with their own ``subscriber_lag`` and ``subscriber_demand`` series at a scrape:
the furthest behind (``subscribers`` and ``subscriber_lag_max`` cover every one, per topic)."""

MAX_PRODUCER_SERIES = 1_000
"""Producers with their own ``producer_demand`` series at a scrape: those with the most in flight."""


class BrokerMetrics:
    """The broker's metrics in a registry of their own (``registry``); see the module docstring.

    Methods are cheap, synchronous, and never raise for a label they have not seen before.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._connections = Gauge("rsnet_broker_connections", "Open client connections.", registry=r)
        self._connections_opened = Counter(
            "rsnet_broker_connections_opened", "Client connections accepted since start.", registry=r
        )
        self._streams = Gauge("rsnet_broker_streams", "Open streams by kind.", ["kind"], registry=r)
        self._records_in = Counter("rsnet_broker_records_in", "Records stored, per topic.", ["topic"], registry=r)
        self._records_out = Counter(
            "rsnet_broker_records_out", "Records delivered to subscribers, per topic.", ["topic"], registry=r
        )
        self._dropped = Counter(
            "rsnet_broker_records_dropped",
            "Records lagging subscribers skipped under the drop policy, per topic.",
            ["topic"],
            registry=r,
        )
        self._slow_disconnects = Counter(
            "rsnet_broker_slow_subscriber_disconnects",
            "Subscribers ended for lagging under the disconnect policy, per topic.",
            ["topic"],
            registry=r,
        )
        self._lag = Gauge(
            "rsnet_broker_subscriber_lag",
            "Records between a subscriber and the topic's head.",
            ["topic", "subscriber"],
            registry=r,
        )
        self._subscribers = Gauge(
            "rsnet_broker_subscribers",
            "Live subscribers of a topic (pattern subscriptions aside).",
            ["topic"],
            registry=r,
        )
        self._lag_max = Gauge(
            "rsnet_broker_subscriber_lag_max", "The largest lag of a topic's subscribers.", ["topic"], registry=r
        )
        self._demand = Gauge(
            "rsnet_broker_subscriber_demand",
            "Records a subscriber requested and has not received.",
            ["subscriber"],
            registry=r,
        )
        self._producer_demand = Gauge(
            "rsnet_broker_producer_demand",
            "Records the broker requested from a producer and has not received.",
            ["topic", "producer"],
            registry=r,
        )
        self._storage_bytes = Gauge("rsnet_broker_storage_bytes", "Bytes held by a topic's log.", ["topic"], registry=r)
        self._storage_records = Gauge(
            "rsnet_broker_storage_records", "Records held by a topic's log.", ["topic"], registry=r
        )
        self._storage_damaged = Gauge(
            "rsnet_broker_storage_damaged_records",
            "Offsets of a topic whose records were found damaged on disk.",
            ["topic"],
            registry=r,
        )
        self._storage_failing = Gauge(
            "rsnet_broker_storage_failing",
            "1 while a topic cannot store records (its last append or sync failed).",
            ["topic"],
            registry=r,
        )
        self._storage_failures = Counter(
            "rsnet_broker_storage_failures",
            "Appends and syncs of a topic's log that failed (no space, I/O errors).",
            ["topic"],
            registry=r,
        )
        self._auth_denials = Counter(
            "rsnet_broker_auth_denials", "Refused connections and requests, by reason.", ["reason"], registry=r
        )
        for kind in ("publish", "subscribe"):
            self._streams.labels(kind)
        for reason in ("unauthenticated", "forbidden"):
            self._auth_denials.labels(reason)
        self._lag_topics: defaultdict[str, set[str]] = defaultdict(set)  # subscriber -> topics with a lag series
        self._producers: defaultdict[str, set[str]] = defaultdict(set)  # topic -> producers with a series
        self._refreshers: list[Callable[[BrokerMetrics], None]] = []
        self._rendering = trio.Lock()  # one encoding at a time (render_off_the_loop)
        self._rendered: dict[str, tuple[float, bytes]] = {}  # content type -> (when, body)

    # -- connections and streams -------------------------------------------------------------

    def connection_opened(self) -> None:
        self._connections.inc()
        self._connections_opened.inc()

    def connection_closed(self) -> None:
        self._connections.dec()

    def stream_opened(self, kind: StreamKind) -> None:
        self._streams.labels(_check(kind, ("publish", "subscribe"))).inc()

    def stream_closed(self, kind: StreamKind) -> None:
        self._streams.labels(_check(kind, ("publish", "subscribe"))).dec()

    def auth_denied(self, reason: DenialReason) -> None:
        self._auth_denials.labels(_check(reason, ("unauthenticated", "forbidden"))).inc()

    # -- topics --------------------------------------------------------------------------------

    def records_in(self, topic: str, n: int = 1) -> None:
        self._records_in.labels(topic).inc(n)

    def records_out(self, topic: str, n: int = 1) -> None:
        self._records_out.labels(topic).inc(n)

    def records_dropped(self, topic: str, n: int) -> None:
        self._dropped.labels(topic).inc(n)

    def slow_subscriber_disconnected(self, topic: str) -> None:
        self._slow_disconnects.labels(topic).inc()

    def set_storage(self, topic: str, nbytes: int, records: int | None = None) -> None:
        self._storage_bytes.labels(topic).set(nbytes)
        if records is not None:
            self._storage_records.labels(topic).set(records)

    def set_storage_faults(self, topic: str, damaged_records: int, failing: bool, new_failures: int = 0) -> None:
        """What is wrong with a topic's storage: offsets found damaged, whether storing fails
        now, and how many more appends or syncs failed since the last call."""
        self._storage_damaged.labels(topic).set(damaged_records)
        self._storage_failing.labels(topic).set(int(failing))
        self._storage_failures.labels(topic).inc(new_failures)

    def remove_topic(self, topic: str) -> None:
        """Forget every series of a deleted topic, including its subscribers' lag and producers."""
        for metric in (
            self._records_in,
            self._records_out,
            self._dropped,
            self._slow_disconnects,
            self._subscribers,
            self._lag_max,
            self._storage_bytes,
            self._storage_records,
            self._storage_damaged,
            self._storage_failing,
            self._storage_failures,
        ):
            _remove(metric, topic)
        for subscriber, topics in list(self._lag_topics.items()):
            if topic in topics:
                topics.discard(topic)
                _remove(self._lag, topic, subscriber)
        for producer in self._producers.pop(topic, set()):
            _remove(self._producer_demand, topic, producer)

    # -- subscribers and producers -------------------------------------------------------------

    def set_subscribers(self, topic: str, count: int, lag_max: int) -> None:
        self._subscribers.labels(topic).set(count)
        self._lag_max.labels(topic).set(lag_max)

    def set_lag(self, topic: str, subscriber: str, lag: int) -> None:
        self._lag.labels(topic, subscriber).set(lag)
        self._lag_topics[subscriber].add(topic)

    def set_demand(self, subscriber: str, demand: int) -> None:
        self._demand.labels(subscriber).set(demand)

    def remove_subscriber(self, subscriber: str) -> None:
        """Forget a subscriber's lag (on every topic) and demand series."""
        for topic in self._lag_topics.pop(subscriber, set()):
            _remove(self._lag, topic, subscriber)
        _remove(self._demand, subscriber)

    def set_producer_demand(self, topic: str, producer: str, demand: int) -> None:
        self._producer_demand.labels(topic, producer).set(demand)
        self._producers[topic].add(producer)

    def remove_producer(self, topic: str, producer: str) -> None:
        self._producers[topic].discard(producer)
        _remove(self._producer_demand, topic, producer)

    # -- exposition ----------------------------------------------------------------------------

    def add_refresher(self, refresh: Callable[[BrokerMetrics], None]) -> None:
        """Call ``refresh(self)`` before every scrape, to set gauges from the broker's state."""
        self._refreshers.append(refresh)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The registry in the format ``accept`` asks for: ``(body, content_type)``.

        Runs the refreshers first; one that raises is logged and skipped.
        """
        self._refresh()
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    async def render_off_the_loop(self, accept: str = "") -> tuple[bytes, str]:
        """:meth:`render` for the endpoint: the refreshers run on the event loop (they read the
        broker's state), the encoding in a worker thread, one at a time, and an answer less than
        :data:`RENDER_REUSE_S` old is given again. Encoding is the cost (0.45 s for 5,000
        topics, measured): in the event loop it held every connection that long per scrape."""
        encoder, content_type = choose_encoder(accept)
        async with self._rendering:
            last = self._rendered.get(content_type)
            now = trio.current_time()
            if last is not None and now - last[0] < RENDER_REUSE_S:
                return last[1], content_type
            self._refresh()
            body = await trio.to_thread.run_sync(encoder, self.registry)
            self._rendered[content_type] = (now, body)
            return body, content_type

    def _refresh(self) -> None:
        for refresh in self._refreshers:
            try:
                refresh(self)
            except Exception:
                log.exception("a metrics refresher failed")


def _check(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"expected one of {allowed}, got {value!r}")
    return value


def _remove(metric: Any, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass


# -- the HTTP endpoint -------------------------------------------------------------------------


async def serve_http(
    metrics: BrokerMetrics,
    host: str,
    port: int,
    health: Callable[[], dict[str, Any]],
    *,
    request_timeout: float = 10.0,
    max_connections: int = 64,
    pages: Pages | None = None,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics``, ``/health`` (and ``pages``) on ``host:port`` until cancelled (see the
    module docstring).

    ``health()`` returns a JSON-able dict; the response is 200 when its ``"healthy"`` is true,
    503 otherwise or when it raises. Reports the listeners to ``nursery.start`` (port 0 picks a
    free port: ``listeners[0].socket.getsockname()[1]``).
    """
    busy = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal busy
        # Any connection may be closed for a newcomer, oldest first: its socket, and its wait
        # for a page being rendered (which waits for no socket).
        with trio.CancelScope() as evicted:
            waiting.hold(stream, evicted)
            try:
                if busy >= max_connections:
                    await _refuse(stream, health, request_timeout)
                    return
                busy += 1
                try:
                    await _serve_connection(stream, metrics, health, request_timeout, pages)
                finally:
                    busy -= 1
            finally:
                waiting.settle()

    listeners = await trio.open_tcp_listeners(port, host=host)
    slots = trio.Semaphore(max_connections + REFUSAL_SLOTS)
    waiting = Evictable()
    try:
        async with trio.open_nursery() as connections:
            for listener in listeners:
                connections.start_soon(accept_within, listener, slots, handle, connections, _connection_log, waiting)
            task_status.started(listeners)
    finally:
        for listener in listeners:
            await trio.aclose_forcefully(listener)


async def _serve_connection(
    stream: trio.SocketStream,
    metrics: BrokerMetrics,
    health: Callable[[], dict[str, Any]],
    request_timeout: float,
    pages: Pages | None,
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
    try:
        while True:
            request = None
            with trio.move_on_after(request_timeout):  # whole request, or idle keep-alive
                request = await _receive_request(stream, conn)
            if request is None:
                return  # closed by the client, or too slow
            status, headers, body = await _respond(request, metrics, health, pages)
            with trio.move_on_after(request_timeout) as sending:  # a client that does not read
                await _send(stream, conn, status, headers, body, head=request.method == b"HEAD")
            if sending.cancelled_caught or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()
    except h11.RemoteProtocolError as error:
        log.debug("bad HTTP request: %s", error)
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            status = error.error_status_hint
            with trio.move_on_after(request_timeout):
                await _send_quietly(
                    stream, conn, status, _text_headers(close=True), f"{status} {_reason(status)}\n".encode()
                )
            await _linger(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
        log.debug("metrics connection ended: %r", error)
    except Exception:  # a bug here must not take the broker's nursery down with it
        log.exception("the metrics endpoint failed on a connection")
    finally:
        await trio.aclose_forcefully(stream)


async def _refuse(stream: trio.SocketStream, health: Callable[[], dict[str, Any]], request_timeout: float) -> None:
    """Every slot is taken: answer a ``/health`` request that arrives within ``REFUSAL_READ_S``
    (it costs little), and anything else ``503 too many connections``; then close."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
    try:
        request = None
        with trio.move_on_after(REFUSAL_READ_S):
            request = await _receive_request(stream, conn)
        if (
            request is not None
            and request.target.split(b"?", 1)[0] == b"/health"
            and request.method in (b"GET", b"HEAD")
        ):
            status, headers, body = _health_answer(health)
            with trio.move_on_after(request_timeout):
                await _send(
                    stream, conn, status, [*headers, (b"connection", b"close")], body, head=request.method == b"HEAD"
                )
        else:
            with trio.move_on_after(request_timeout):
                await _reject(stream, 503, "too many connections")
            await _linger(stream)
    except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def _linger(stream: trio.SocketStream) -> None:
    """Half-close, then read and discard briefly: closing with unread input makes the kernel
    send a reset, which can destroy the error response before the client reads it."""
    with trio.move_on_after(LINGER):
        try:
            await stream.send_eof()
            while await stream.receive_some(RECEIVE_SIZE):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def _send_quietly(stream: trio.SocketStream, conn: h11.Connection, *response: Any) -> None:
    try:
        await _send(stream, conn, *response)
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
        pass


_REQUEST_STARTS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
"""The bytes a request h11 takes may start with: a method's first letter."""


async def _receive_request(stream: trio.SocketStream, conn: h11.Connection) -> h11.Request | None:
    """The next request, its body read and discarded; None when the client closed cleanly."""
    request: h11.Request | None = None
    body = 0
    started = bool(conn.trailing_data[0])  # bytes of this request already received (pipelined)
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not started and data and data[0] not in _REQUEST_STARTS:
                # Not HTTP (an rsnet client given this port): h11 would wait for a line end that
                # binary never sends, and the client for an answer, until a timeout.
                raise h11.RemoteProtocolError("not an HTTP request", error_status_hint=400)
            started = started or bool(data)
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += len(event.data)
            if body > MAX_REQUEST_BODY:
                raise h11.RemoteProtocolError("request body too large", error_status_hint=413)
        elif isinstance(event, h11.EndOfMessage):
            return request
        else:  # ConnectionClosed (PAUSED cannot come before we answer)
            return None


async def _respond(
    request: h11.Request, metrics: BrokerMetrics, health: Callable[[], dict[str, Any]], pages: Pages | None
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    path = request.target.split(b"?", 1)[0]
    own = path in (b"/metrics", b"/health")
    page = None if own or pages is None else pages(path, dict(request.headers).get(b"if-none-match"))
    if not own and page is None:
        hint = b"/, /metrics or /health" if pages is not None else b"/metrics or /health"
        return 404, _text_headers(), b"404 Not Found: try " + hint + b"\n"
    if request.method not in (b"GET", b"HEAD"):
        return 405, [*_text_headers(), (b"allow", b"GET, HEAD")], b"405 Method Not Allowed\n"
    if page is not None:
        return page
    if path == b"/metrics":
        accept = dict(request.headers).get(b"accept", b"").decode("latin-1")
        body, content_type = await metrics.render_off_the_loop(accept)
        return 200, [(b"content-type", content_type.encode())], body
    return _health_answer(health)


def _health_answer(health: Callable[[], dict[str, Any]]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    try:
        report = dict(health())
        healthy = report.get("healthy") is True
    except Exception:
        log.exception("the health check failed")
        report, healthy = {"healthy": False, "error": "the health check failed"}, False
    body = json.dumps(report, default=str).encode() + b"\n"
    return (200 if healthy else 503), [(b"content-type", b"application/json"), (b"cache-control", b"no-store")], body


async def _send(
    stream: trio.SocketStream,
    conn: h11.Connection,
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    head: bool = False,
) -> None:
    if status != 304:  # a 304's length, if given, would have to be the 200's (RFC 9110 8.6)
        headers = [*headers, (b"content-length", str(len(body)).encode())]
    data = conn.send(h11.Response(status_code=status, headers=headers, reason=_reason(status).encode()))
    if body and not head:  # a response to HEAD has the headers of the GET, and no body
        if len(body) > SHARED_BODY_BYTES:
            # Written as it is, not copied after the headers: a /metrics encoding is shared by
            # the scrapes of a second (RENDER_REUSE_S), and 72 slow readers of a 29 MB one held
            # a copy each, 2 GB (attack round 7).
            pieces = conn.send_with_data_passthrough(h11.Data(data=body))
            assert pieces is not None  # (None is for ConnectionClosed only)
            await stream.send_all(data)
            for piece in pieces:
                await stream.send_all(piece)
            data = b""
        else:
            data += conn.send(h11.Data(data=body))
    data += conn.send(h11.EndOfMessage())
    if data:
        await stream.send_all(data)


async def _reject(stream: trio.SocketStream, status: int, message: str) -> None:
    try:
        await stream.send_all(
            b"HTTP/1.1 %d %s\r\nconnection: close\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s"
            % (status, _reason(status).encode(), len(message) + 1, message.encode() + b"\n")
        )
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def _text_headers(close: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    return [*headers, (b"connection", b"close")] if close else headers


_REASONS = {
    200: "OK",
    304: "Not Modified",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


def _reason(status: int) -> str:
    return _REASONS.get(status, "Error")
