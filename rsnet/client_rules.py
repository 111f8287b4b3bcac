"""The rules every rsnet client follows, written once for the trio and the blocking client.

Both clients are I/O shells around :class:`rsnet.protocol.Connection`; what they must agree on
lives here, free of I/O and of any event loop, so they cannot drift apart (as websockets shares
``uri.parse_uri`` and its backoff between its sync, asyncio and trio flavours):

- :func:`parse_endpoint`: which URLs a client accepts and what they mean;
- :func:`client_connection`: the protocol connection a client opens, with its settings;
- :func:`handshake_outcome`: one step of the client's handshake (the events received so far
  either complete it, refuse it, or leave it pending);
- :func:`handshake_timed_out`: the CONN_ERROR a client sends when the server is too slow;
- :class:`Keepalive`: when to PING and when the server counts as dead, as a pure timer;
- :func:`close_connection`: the close policy (GO_AWAY when idle, CONN_ERROR GOING_AWAY when
  streams are still open);
- :func:`demand_policy`: what an iterating subscriber requests and when: adaptive demand
  within a byte budget by default (:class:`AdaptiveDemand`), a fixed ``prefetch`` on request
  (:class:`Refill`);
- :func:`connection_lost`: how the end of a connection is reported;
- :func:`stream_params`: publisher parameters are one mapping;
- and one copy of each constant (:data:`SCHEMES`, :data:`DEFAULT_BUDGET`,
  :data:`FLUSH_TIMEOUT`).

Units: seconds (float) in the Python API; milliseconds only inside the protocol.

This module imports nothing but the standard library and the sans-I/O protocol.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .errors import ConnectionLost, HandshakeError, StreamError
from .protocol import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_MAX_FRAME_SIZE,
    MAX_INT,
    MAX_SETTING,
    Connection,
    ConnectionClosed,
    ErrorCode,
    Role,
    Welcome,
)

SCHEMES = ("tcp", "tls", "ws", "wss")
"""URL schemes a client dials: TCP, TLS over TCP, WebSocket, WebSocket over TLS."""

FLUSH_TIMEOUT = 1.0
"""Seconds a closing client waits for its last frames to leave and for the server to close."""

DEFAULT_KEEPALIVE = DEFAULT_KEEPALIVE_INTERVAL / 1000
"""The keepalive interval a client proposes, in seconds (SPEC 10.1)."""

HANDSHAKE_TIMEOUT = DEFAULT_HANDSHAKE_TIMEOUT / 1000
"""Seconds a client gives the transport and rsnet handshakes together."""


def keepalive_ms(seconds: float) -> int:
    """A keepalive interval given in seconds (0: none), as the HELLO and WELCOME carry it
    (milliseconds, at most MAX_SETTING: SPEC 6.3); ValueError for one they cannot carry
    (negative, NaN, infinite or too long), said when it is given rather than at each handshake."""
    if not 0 <= seconds <= MAX_SETTING / 1000 or 0 < seconds < 0.001:  # (NaN compares false)
        raise ValueError(
            f"keepalive_interval must be 0 (none) or a number of seconds from 0.001 to {MAX_SETTING / 1000}, "
            f"got {seconds!r}"
        )
    return round(seconds * 1000)


_T = TypeVar("_T")


class NoPublicConstructor(type):
    """The metaclass of the client classes: only ``connect()`` makes them (as trio does for its
    Nursery). Calling the class raises TypeError; rsnet itself uses ``cls._create(...)``."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{cls.__module__}.{cls.__qualname__} has no public constructor: use connect()")

    def _create(cls: type[_T], *args: Any, **kwargs: Any) -> _T:
        return super().__call__(*args, **kwargs)  # type: ignore[misc]  # type.__call__, past our override


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A parsed server URL: ``scheme://host:port[/path]``."""

    url: str
    scheme: str
    host: str
    port: int

    @property
    def secure(self) -> bool:
        """TLS underneath (``tls``, ``wss``)."""
        return self.scheme in ("tls", "wss")

    @property
    def websocket(self) -> bool:
        return self.scheme in ("ws", "wss")

    @property
    def peer(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(url: str) -> Endpoint:
    """The endpoint ``url`` names; ValueError for a URL no client can dial."""
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError as error:  # e.g. a port out of range
        raise ValueError(f"not a usable rsnet URL: {url!r} ({error})") from None
    if parsed.scheme not in SCHEMES or not parsed.hostname or not port:
        raise ValueError(f"expected tcp://, tls://, ws:// or wss:// with host and port, got {url!r}")
    return Endpoint(url, parsed.scheme, parsed.hostname, port)


def client_connection(
    *,
    token: str | bytes | None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_streams: int,
    keepalive_interval: float,
    metadata: dict[str, Any] | None = None,
) -> Connection:
    """The protocol connection a client opens (its HELLO is queued).

    ``keepalive_interval`` is the client's proposal in seconds (0: none); ``max_streams`` how
    many streams the server may open towards the client (0 for a client that hosts nothing).
    """
    return Connection(
        Role.CLIENT,
        max_frame_size=max_frame_size,
        max_streams=max_streams,
        keepalive_interval=keepalive_ms(keepalive_interval),
        auth_token=token,
        metadata=metadata,
    )


def handshake_outcome(events: list[Any], wanted: type, peer: str) -> list[Any] | None:
    """One step of a handshake, given the events received so far.

    Returns ``None`` while the ``wanted`` event (WELCOME for a client, HELLO for a server) has
    not arrived, and the events that came after it once it has. Raises
    :class:`HandshakeError` if the connection ended instead (refused, closed, or broken by
    the peer); the caller then flushes whatever the protocol queued (our CONN_ERROR) and
    closes the transport.
    """
    for index, event in enumerate(events):
        if isinstance(event, wanted):
            return events[index + 1 :]
        if isinstance(event, ConnectionClosed):
            reason = event.message or "closed during the handshake"
            if event.code is None and wanted is Welcome:
                # The server hung up without a word (no CONN_ERROR): a TLS listener does so at
                # the plain bytes of a HELLO.
                reason += " without an answer (if the server uses TLS: tls:// or wss://)"
            raise HandshakeError(f"handshake with {peer} failed: {reason}", event.code, event.data)
    return None


def handshake_timed_out(conn: Connection, timeout: float, peer: str) -> HandshakeError:
    """Queue CONN_ERROR TIMEOUT (SPEC 6.2) and return the error to raise."""
    conn.send_conn_error(ErrorCode.TIMEOUT, f"no handshake within {timeout:g} s")
    return HandshakeError(f"handshake with {peer} timed out after {timeout:g} s", ErrorCode.TIMEOUT)


class Due(enum.Enum):
    """What :class:`Keepalive` says is due."""

    NOTHING = "nothing"
    PING = "ping"
    DEAD = "dead"


class Keepalive:
    """SPEC 10.1 as a pure timer: PING after an interval without sending, give up after three
    intervals without receiving a byte. Any traffic counts, so a busy connection never times
    out. Times are whatever clock the driver uses (``trio.current_time``, ``time.monotonic``).

    The interval (SPEC 10.1): the server's WELCOME decides what both sides must at least do; a
    client that proposed a shorter interval keeps to its own for its PINGs and for declaring
    the server dead (the server answers PINGs whatever its setting), and where the server
    turned keepalive off, the client's proposal still bounds its waits, so no wait outlives a
    dead server. ``None``: no keepalive at all (both sides said 0).
    """

    __slots__ = ("interval", "last_received", "last_sent")

    def __init__(self, interval: float | None, now: float) -> None:
        self.interval = interval
        self.last_sent = now
        self.last_received = now

    @classmethod
    def negotiated(cls, conn: Connection, proposed: float, now: float) -> Keepalive:
        """The timer for an open client connection that proposed ``proposed`` seconds."""
        announced = conn.keepalive_interval / 1000
        intervals = [interval for interval in (announced, proposed) if interval > 0]
        return cls(min(intervals) if intervals else None, now)

    def sent(self, now: float) -> None:
        self.last_sent = now

    def received(self, now: float) -> None:
        self.last_received = now

    def dead_at(self, watching_since: float | None = None) -> float:
        """When the peer counts as dead if nothing arrives. ``watching_since``: a driver that
        only reads while a call waits (the blocking client) counts silence from then at the
        earliest, since time spent outside the client is not silence it observed."""
        assert self.interval is not None
        start = self.last_received if watching_since is None else max(self.last_received, watching_since)
        return start + 3 * self.interval

    def due(self, now: float, watching_since: float | None = None) -> tuple[Due, float]:
        """What is due at ``now``, and when to look again (``inf`` without keepalive)."""
        if self.interval is None:
            return Due.NOTHING, float("inf")
        dead_at = self.dead_at(watching_since)
        ping_at = self.last_sent + self.interval
        if now >= dead_at:
            return Due.DEAD, dead_at
        if now >= ping_at:
            return Due.PING, min(dead_at, now + self.interval)
        return Due.NOTHING, min(dead_at, ping_at)

    def timed_out(self, conn: Connection, peer: str) -> ConnectionLost:
        """Queue CONN_ERROR TIMEOUT and return the error the connection's streams end with."""
        assert self.interval is not None
        message = f"nothing received for {3 * self.interval:g} s"
        conn.send_conn_error(ErrorCode.TIMEOUT, message)
        return ConnectionLost(f"connection to {peer} timed out: {message}", ErrorCode.TIMEOUT)


def close_connection(conn: Connection) -> ConnectionLost:
    """The client's close policy (SPEC 10.2, 10.3): with no stream open, GO_AWAY and let the
    server close; with streams open, CONN_ERROR GOING_AWAY, which ends them at the server.
    Queues the frame and returns the error the client's own open streams end with."""
    if conn.stream_count:
        message = "the client closed the connection"
        conn.send_conn_error(ErrorCode.GOING_AWAY, message)
        return ConnectionLost(f"closed locally: {message}", ErrorCode.GOING_AWAY)
    conn.send_go_away("the client is done")
    return ConnectionLost("the client was closed")


def refused_after_go_away(by_peer: bool) -> StreamError | ConnectionLost:
    """The error of a stream opened once GO_AWAY was sent or received. After the peer's (a
    server draining for a restart): refused as the server refuses one (``GOING_AWAY``, SPEC
    10.2), a stream error, retryable on a new connection; the connection and its open streams
    go on. After our own (this side is closing): the connection is ending."""
    if by_peer:
        return StreamError(ErrorCode.GOING_AWAY, "the connection is going away: open the stream on a new connection")
    return ConnectionLost("closing")


def connection_lost(event: ConnectionClosed, peer: str) -> ConnectionLost:
    """The error every stream of a connection ends with when it closed (``event``)."""
    how = "" if event.code is None else f" with {StreamError(event.code).code_name}"
    detail = f": {event.message}" if event.message else ""
    return ConnectionLost(f"connection to {peer} ended{how}{detail}", event.code, event.data)


def stream_params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A publisher's parameters as SUBSCRIBE and OFFER carry them: one mapping (never keyword
    arguments, so no parameter name collides with an option such as ``prefetch``), sent as a
    map, or not at all when absent or empty. TypeError for anything but a mapping."""
    if params is None:
        return None
    # A dict, the usual case, without the Mapping ABC's isinstance check (~0.4 us).
    if type(params) is not dict and not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping (e.g. a dict), got {type(params).__name__}")
    return dict(params) or None


def check_prefetch(prefetch: int) -> int:
    """``prefetch`` if usable (a positive int, capped at 2^63-1); ValueError otherwise."""
    if type(prefetch) is not int or prefetch < 1:
        raise ValueError(f"prefetch must be a positive int or None (adaptive), got {prefetch!r}")
    return min(prefetch, MAX_INT)


def check_limit(limit: int) -> int:
    """``limit`` (the most items a subscription may take) if usable; ValueError otherwise."""
    if type(limit) is not int or limit < 0:
        raise ValueError(f"limit must be an int >= 0, got {limit!r}")
    return limit


def check_budget(budget: int) -> int:
    """``budget`` (bytes) if usable: a positive int; ValueError otherwise."""
    if type(budget) is not int or budget < 1:
        raise ValueError(f"budget must be a positive int (bytes), got {budget!r}")
    return budget


class Refill:
    """The fixed prefetch rule (``subscribe(prefetch=N)``): request ``prefetch`` up front, then
    ``prefetch - prefetch // 4`` each time that many items were consumed (one REQUEST per
    batch, never per item). Item sizes and waits play no part.

    With ``limit``, the total requested never exceeds ``limit`` (exact demand for a known
    count: nothing beyond it is ever sent), and :attr:`initial` is capped likewise.

    The driver's side, the same for :class:`AdaptiveDemand`: send :attr:`initial` with the
    SUBSCRIBE; call :meth:`consumed` as the consumer takes items and request what it returns;
    report each batch of items as it arrives (:meth:`received`) and each time the consumer
    finds nothing buffered and has to wait (:meth:`starved`); :meth:`until_due` says how many
    items may be taken before :meth:`consumed` can return demand (a driver that counts items
    in runs, as the trio iterator does, ends each run there).
    """

    __slots__ = ("_consumed", "_unrequested", "batch", "initial", "prefetch")

    def __init__(self, prefetch: int, limit: int | None = None) -> None:
        self.prefetch = check_prefetch(prefetch)
        self.batch = self.prefetch - self.prefetch // 4
        unrequested = MAX_INT if limit is None else check_limit(limit)
        self.initial = min(self.prefetch, unrequested)
        self._unrequested = unrequested - self.initial
        self._consumed = 0

    def consumed(self, count: int = 1) -> int:
        """``count`` more items were consumed: how many to request now (0 for none yet)."""
        self._consumed += count
        if self._consumed < self.batch or not self._unrequested:
            return 0
        refills, self._consumed = divmod(self._consumed, self.batch)
        wanted = min(refills * self.batch, self._unrequested)
        self._unrequested -= wanted
        return wanted

    def until_due(self) -> int:
        """Items that may be consumed before :meth:`consumed` can return demand."""
        return max(0, self.batch - self._consumed) if self._unrequested else MAX_INT

    def received(self, count: int, nbytes: int) -> None:
        """Items arrived (``nbytes`` on the wire): a fixed window does not care."""

    def starved(self) -> None:
        """The consumer waits for items: a fixed window does not care."""


DEFAULT_BUDGET = 4 * 1024 * 1024
"""Bytes (as encoded on the wire) that a stream with adaptive demand may have requested and not
yet consumed: in flight and buffered together."""

INITIAL_WINDOW = 256
"""Items an adaptive window starts at (the fixed default of earlier versions), once the byte
budget allows it (see :class:`AdaptiveDemand`)."""

MIN_WINDOW = 4
"""Items an adaptive window shrinks to at the least (fewer only where the byte budget says so)."""

MAX_WINDOW = 16384
"""Items an adaptive window grows to at the most, however small the items: decoded Python
objects take several times their wire size (a 16-byte item is a ~50-byte ``bytes``)."""

HEADROOM = 8
"""A window of HEADROOM x (items consumed per second) x (round trip) is enough: demand is
topped up when a quarter of the window is left, and that quarter must last a round trip
(4x), with a margin of 2x."""


class AdaptiveDemand:
    """Adaptive demand, the default of an iterating subscriber: a window of outstanding items
    (requested and not yet consumed) that grows while the consumer keeps up and the round trip
    dominates, shrinks for a slow consumer, and never holds more than ``budget`` bytes by the
    item sizes measured so far. The spirit is TCP's receive-window auto-tuning; it is client
    policy only: what goes on the wire is ordinary REQUEST frames.

    - **Top-up**: once the outstanding items fall to a quarter of the window, request what
      brings them back to the window (one REQUEST per three quarters of a window, as
      :class:`Refill`). Each top-up is a decision point for the window:
    - **grow**: the consumer had to wait for items since the last decision (:meth:`starved`):
      the window doubles (up to :data:`MAX_WINDOW` and the byte budget). A slow publisher makes
      its consumer wait too, and gets a large window it does not fill: harmless, as TCP's
      window for a receiver that keeps up, since the budget still bounds what a burst can bring;
    - **shrink**: it never waited, and a window of ``HEADROOM x rate x rtt`` (the items it
      consumed per second since the last decision, the round trip measured as below) is under
      half the window: the window becomes that (at least :data:`MIN_WINDOW`);
    - **bytes**: the window never exceeds ``budget // item_bytes``. ``item_bytes`` is the
      size the items take on the wire (``Items.nbytes`` over the count, per batch received):
      it follows a rise at once and a fall by an eighth per batch; until the first batch it
      is ``max_item_bytes`` (the client's ``max_frame_size``, which no item can exceed), so
      the first request is ``budget // max_item_bytes`` items (4 with the defaults) and grows
      to :data:`INITIAL_WINDOW` when the first items show they are small.
    - **round trip**: from a top-up to the arrival of the first item it made requestable
      (the SUBSCRIBE counts too); the estimate is the smallest sample, allowed to rise by a
      quarter per sample, so it follows a slower path without keeping an outlier.

    With ``limit``, the total requested never exceeds it. ``clock`` is called (at decisions
    and when a round-trip sample completes, never per item) for seconds from any origin.

    The byte bound holds for the sizes seen: a stream whose items suddenly grow may briefly
    hold its window (at most :data:`MAX_WINDOW` items) of the new size, until it has consumed
    what was requested before it saw them.
    """

    __slots__ = (
        "_clock",
        "_consumed",
        "_cycle_consumed",
        "_cycle_start",
        "_due_at",
        "_measured",
        "_probe_mark",
        "_probe_sent",
        "_received",
        "_requested",
        "_starved",
        "_unrequested",
        "budget",
        "initial",
        "item_bytes",
        "rtt",
        "window",
    )

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        limit: int | None = None,
        budget: int = DEFAULT_BUDGET,
        max_item_bytes: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self._clock = clock
        self.budget = check_budget(budget)
        self.item_bytes = float(max(1, max_item_bytes))
        """Wire bytes per item, as measured (until the first batch: the largest possible)."""
        self._measured = False
        self.window = INITIAL_WINDOW
        """The target window in items, before the byte bound (:meth:`limit_window` applies it)."""
        self.rtt: float | None = None
        """The round-trip estimate in seconds, once measured."""
        unrequested = MAX_INT if limit is None else check_limit(limit)
        self.initial = min(self.limit_window(), unrequested)
        self._unrequested = unrequested - self.initial
        self._requested = self.initial
        self._consumed = 0
        self._received = 0
        self._starved = False
        now = clock()
        self._cycle_start = now
        self._cycle_consumed = 0
        # A round-trip sample in progress: sent at ``_probe_sent`` (None: none), done when
        # more than ``_probe_mark`` items have arrived.
        self._probe_mark = 0
        self._probe_sent: float | None = now if self.initial else None
        self._due_at = 0
        self._set_due()

    def limit_window(self) -> int:
        """The window in items now: the target, bounded by the byte budget."""
        return min(self.window, self._byte_window())

    def _byte_window(self) -> int:
        """The most items the byte budget allows at the measured size (at least 1)."""
        return max(1, int(self.budget // self.item_bytes))

    def consumed(self, count: int = 1) -> int:
        """``count`` more items were consumed: how many to request now (0 for none yet)."""
        self._consumed += count
        if self._consumed < self._due_at:
            return 0
        return self._decide()

    def until_due(self) -> int:
        """Items that may be consumed before :meth:`consumed` can return demand."""
        return max(0, self._due_at - self._consumed)

    def received(self, count: int, nbytes: int) -> None:
        """``count`` items arrived, ``nbytes`` on the wire (0: not measured)."""
        self._received += count
        if nbytes > 0 and count > 0:
            size = nbytes / count
            if not self._measured or size > self.item_bytes:
                self._measured = True
                self.item_bytes = size
            else:
                self.item_bytes += (size - self.item_bytes) / 8
            self._set_due()
        if self._probe_sent is not None and self._received > self._probe_mark:
            sample = self._clock() - self._probe_sent
            self._probe_sent = None
            self.rtt = sample if self.rtt is None else min(sample, self.rtt * 1.25)

    def starved(self) -> None:
        """The consumer found nothing buffered and waits for items."""
        self._starved = True

    def _decide(self) -> int:
        if not self._unrequested:
            self._due_at = MAX_INT
            return 0
        now = self._clock()
        cap = self._byte_window()
        window = min(self.window, cap)
        if self._starved:
            window = min(2 * window, MAX_WINDOW)
        elif self.rtt is not None and now > self._cycle_start:
            rate = (self._consumed - self._cycle_consumed) / (now - self._cycle_start)
            target = max(MIN_WINDOW, math.ceil(HEADROOM * rate * self.rtt))
            if 2 * target < window:
                window = target
        self.window = max(1, min(window, cap))
        self._starved = False
        self._cycle_start = now
        self._cycle_consumed = self._consumed
        wanted = min(self.limit_window() - (self._requested - self._consumed), self._unrequested)
        if wanted > 0:
            if self._probe_sent is None:
                self._probe_mark = self._requested
                self._probe_sent = now
            self._requested += wanted
            self._unrequested -= wanted
        else:
            wanted = 0
        self._set_due()
        return wanted

    def _set_due(self) -> None:
        """The consumed count at which the next top-up is due: a quarter of the window left."""
        self._due_at = self._requested - self.limit_window() // 4 if self._unrequested else MAX_INT


Demand = Refill | AdaptiveDemand
"""What an iterating subscriber's driver holds: the two policies have the same methods."""


def demand_policy(
    clock: Callable[[], float],
    *,
    prefetch: int | None = None,
    limit: int | None = None,
    budget: int | None = None,
    max_item_bytes: int = DEFAULT_MAX_FRAME_SIZE,
) -> Demand:
    """The demand policy of ``subscribe``: :class:`Refill` for an explicit ``prefetch``, else
    :class:`AdaptiveDemand` within ``budget`` bytes (default :data:`DEFAULT_BUDGET`). A
    ``budget`` with a ``prefetch`` is a ValueError: a fixed window is counted in items."""
    if prefetch is not None:
        if budget is not None:
            raise ValueError("budget sizes the adaptive window: give it with prefetch=None, or give no budget")
        return Refill(prefetch, limit)
    return AdaptiveDemand(
        clock, limit=limit, budget=DEFAULT_BUDGET if budget is None else budget, max_item_bytes=max_item_bytes
    )
