"""Real rsnet servers for the blocking client's tests, run by trio in a background thread.

The tests call the blocking client in the main thread while the server's trio loop runs in its
own thread, as a Spark worker would talk to a remote server. What the hosted publishers and
sinks see is recorded in :class:`Probe` objects the tests read across the threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import socket
import threading
from collections.abc import Callable
from typing import Any

import trio

import rsnet
from rsnet.protocol import MAX_INT

JOIN_TIMEOUT = 5.0


@dataclasses.dataclass
class Probe:
    """What one hosted publisher or sink saw, written by the server thread."""

    requested: int = 0
    emitted: int = 0
    peer: str | None = None  # the subscriber's address, as the server's session names it
    items: list[Any] = dataclasses.field(default_factory=list)
    error: BaseException | None = None
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    ended: threading.Event = dataclasses.field(default_factory=threading.Event)


class Probes(dict[str, Probe]):
    """Probes by the ``tag`` parameter a test subscribes or offers with."""

    def __missing__(self, tag: str) -> Probe:
        return self.setdefault(tag, Probe())


class _ProbedSubscriber(rsnet.Subscriber, rsnet.Subscription):
    """Sits between a publisher and its subscriber and records demand, items and cancel."""

    def __init__(self, downstream: rsnet.Subscriber, probe: Probe) -> None:
        self._downstream = downstream
        self._probe = probe
        self._upstream: rsnet.Subscription | None = None

    def on_subscribe(self, subscription: rsnet.Subscription) -> None:
        self._upstream = subscription
        self._downstream.on_subscribe(self)

    def request(self, n: int) -> None:
        self._probe.requested += n
        self._upstream.request(n)

    def cancel(self) -> None:
        self._probe.cancelled.set()
        self._upstream.cancel()

    def on_next(self, item: Any) -> None:
        self._probe.emitted += 1
        self._downstream.on_next(item)

    def on_error(self, error: BaseException) -> None:
        self._downstream.on_error(error)

    def on_complete(self) -> None:
        self._downstream.on_complete()


class Probed(rsnet.Publisher):
    def __init__(self, inner: rsnet.Publisher, probe: Probe) -> None:
        self._inner = inner
        self._probe = probe

    def subscribe(self, subscriber: rsnet.Subscriber) -> None:
        self._inner.subscribe(_ProbedSubscriber(subscriber, self._probe))


class RecordingSink(rsnet.Subscriber):
    """Takes an offered stream ``window`` items at a time, requesting the next window once the
    previous one has arrived; cancels after ``cancel_after`` items if given."""

    def __init__(self, probe: Probe, window: int, cancel_after: int | None) -> None:
        self._probe = probe
        self._window = window
        self._cancel_after = cancel_after
        self._subscription: rsnet.Subscription | None = None

    def on_subscribe(self, subscription: rsnet.Subscription) -> None:
        self._subscription = subscription
        self._request()

    def _request(self) -> None:
        self._probe.requested += self._window
        self._subscription.request(self._window)

    def on_next(self, item: Any) -> None:
        items = self._probe.items
        items.append(item)
        if len(items) == self._cancel_after:
            self._subscription.cancel()
            self._probe.cancelled.set()
        elif len(items) % self._window == 0:
            self._request()

    def on_error(self, error: BaseException) -> None:
        self._probe.error = error
        self._probe.ended.set()

    def on_complete(self) -> None:
        self._probe.ended.set()


QUOTA_EXCEEDED = rsnet.StreamError(4711, "quota exceeded", {"limit": 10})


def make_server(probes: Probes, **settings: Any) -> rsnet.Server:
    """``range`` (start, count); ``fail`` (n items, then QUOTA_EXCEEDED); ``endless`` (0, 1, 2...
    probed under ``tag``); ``blobs`` (endless items of ``size`` bytes, probed under ``tag``);
    ``late`` (one item after ``delay`` seconds); and the sink ``sink`` (``tag``, ``window``,
    ``cancel_after``)."""
    server = rsnet.Server(**settings)
    server.add_publisher("range", lambda params, ctx: rsnet.range_(params.get("start", 0), params["count"]))
    server.add_publisher(
        "fail",
        lambda params, ctx: rsnet.ops.concat(rsnet.range_(0, params["n"]), rsnet.error(QUOTA_EXCEEDED)),
    )

    def probed(items: Any, params: dict, ctx: rsnet.StreamContext) -> rsnet.Publisher:
        probe = probes[params["tag"]]
        probe.peer = ctx.peer
        return Probed(rsnet.from_iterable(items), probe)

    server.add_publisher("endless", lambda params, ctx: probed(itertools.count(), params, ctx))
    server.add_publisher("blobs", lambda params, ctx: probed(itertools.repeat(b"x" * params["size"]), params, ctx))

    def late(params: dict, ctx: rsnet.StreamContext) -> rsnet.Publisher:
        async def one_item_late():
            await trio.sleep(params["delay"])
            yield "late"

        return rsnet.from_async_iterable(one_item_late, nursery=ctx.nursery)

    server.add_publisher("late", late)
    server.add_sink(
        "sink",
        lambda params, ctx: RecordingSink(
            probes[params["tag"]], params.get("window", MAX_INT), params.get("cancel_after")
        ),
    )
    return server


def wire_demand(thread: ServerThread, server: rsnet.Server, probe: Probe) -> int:
    """The demand a client has granted on the first stream of its connection (stream id 1,
    SPEC 7.1), as the server has received it: what the server may still send plus the items
    it has encoded for sending (emitted by its publisher, less those not encoded yet). Read in
    the servers' own loop, so the three counts are of one moment."""

    def granted() -> int:
        (session,) = [session for session in list(server.sessions) if session.peer == probe.peer]
        outbound = session._outbound.get(1)
        not_encoded = len(outbound.pending) if outbound is not None else 0
        return session.conn.outstanding_demand(1) + probe.emitted - not_encoded

    return thread.run_sync(granted)


@dataclasses.dataclass(frozen=True)
class Listener:
    server: rsnet.Server
    scheme: str  # "tcp" or "ws"; with ``ssl_context``, served as tls / wss
    ssl_context: Any = None


class ServerThread:
    """``with ServerThread(listeners) as thread``: serves each listener on an ephemeral loopback
    port, from a trio loop in a background thread; ``thread.urls`` in the listeners' order.
    Leaving the block cancels the servers (their connections close) and joins the thread."""

    def __init__(self, listeners: list[Listener]) -> None:
        self._listeners = listeners
        self._ready = threading.Event()
        self._urls: list[str] = []
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._thread = threading.Thread(target=self._run, name="rsnet-test-server", daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(JOIN_TIMEOUT) or self._failure is not None:
            raise RuntimeError("the test server did not start") from self._failure
        return self

    @property
    def urls(self) -> list[str]:
        return self._urls

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the servers may have shut down
            self._token.run_sync_soon(self._nursery.cancel_scope.cancel)
        self._thread.join(JOIN_TIMEOUT)
        assert not self._thread.is_alive(), "the test server did not stop"

    def run_sync(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` run in the servers' loop, its result; callable from any other thread, even
        one running a trio loop of its own (a trio client's), which waits meanwhile."""
        done = threading.Event()
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(fn())
            except Exception as failure:  # raised again in the caller's thread, not the loop's
                outcome.append(failure)
                raise_it.append(True)
            finally:
                done.set()

        raise_it: list[bool] = []
        self._token.run_sync_soon(run)
        assert done.wait(JOIN_TIMEOUT), "the servers' loop did not answer"
        if raise_it:
            raise outcome[0]
        return outcome[0]

    def start_soon(self, async_fn: Callable[..., Any], *args: Any) -> None:
        """Start ``async_fn(*args)`` as a task of the servers' loop (from the test's thread)."""
        self._token.run_sync_soon(self._nursery.start_soon, async_fn, *args)

    def _run(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as failure:  # reported by __enter__ or by the join
            self._failure = failure
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for listener in self._listeners:
                serve = listener.server.serve_tcp if listener.scheme == "tcp" else listener.server.serve_websocket
                port = await nursery.start(
                    lambda task_status, serve=serve, context=listener.ssl_context: serve(
                        "127.0.0.1", 0, ssl_context=context, task_status=task_status
                    )
                )
                scheme = (
                    listener.scheme if listener.ssl_context is None else {"tcp": "tls", "ws": "wss"}[listener.scheme]
                )
                self._urls.append(f"{scheme}://127.0.0.1:{port}" + ("/" if listener.scheme == "ws" else ""))
            self._ready.set()


class ScriptedPeer:
    """A raw TCP server in a thread that accepts one connection and runs ``script(sock)``,
    for peers a real server would never be (silent, slow to answer)."""

    def __init__(self, script: Callable[[socket.socket], None]) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._script = script
        self._thread = threading.Thread(target=self._run, name="rsnet-scripted-peer", daemon=True)

    def __enter__(self) -> ScriptedPeer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._listener.close()
        self._thread.join(JOIN_TIMEOUT)
        assert not self._thread.is_alive(), "the scripted peer did not stop"

    def _run(self) -> None:
        self._listener.settimeout(JOIN_TIMEOUT)
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        with sock:
            sock.settimeout(JOIN_TIMEOUT)
            self._script(sock)
