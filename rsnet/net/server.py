"""The rsnet server: hosts named publishers for remote subscribers, over TCP and WebSocket.

    server = rsnet.Server()

    @server.publisher("range", params=RangeParams)     # params: a pydantic model, optional
    def range_(params: RangeParams, ctx: rsnet.StreamContext) -> rsnet.Publisher:
        return rsnet.range_(params.start, params.count)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        await nursery.start(server.serve_websocket, "127.0.0.1", 8080)
        ...
        await server.shutdown(grace=5)              # stop accepting, GO_AWAY, drain, then cancel

Each remote subscription becomes a real subscription to the publisher the factory returns;
the factory runs once per SUBSCRIBE with the validated parameters. An unknown name, invalid
parameters or a failing factory end that stream with a coded ERROR; the connection lives on.
Every connection runs in a nursery of the ``serve_*`` call that accepted it, so the server,
the connections and the hosted publishers' producer tasks form one tree of tasks.

A process that mostly serves should tune Python's garbage collector once its start-up is done,
as ``rsnet serve`` and ``rsnet broker`` do: ``rsnet.net.gc_tuning.tune_for_serving()`` freezes
the objects start-up made and collects young objects less often; with thousands of connections
that halves the server's CPU (:mod:`rsnet.net.gc_tuning` says what it changes and what it costs).
"""

from __future__ import annotations

import dataclasses
import functools
import hmac
import logging
import resource
import ssl
from collections.abc import Callable
from typing import Any

import pydantic
import trio

from ..client_rules import DEFAULT_KEEPALIVE, FLUSH_TIMEOUT, HANDSHAKE_TIMEOUT, keepalive_ms
from ..errors import ConnectionLost, HandshakeError, StreamError, error_frame_fields
from ..protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_STREAMS,
    Connection,
    ErrorCode,
    Hello,
    Role,
)
from ..streams import Publisher, Subscriber
from ..transport import TcpTransport, Transport, accept_websocket
from ..transport.base import STREAM_BROKE
from ..transport.tcp import describe_peer
from .failures import CONNECTION_LINES_PER_MINUTE, RateLimitedLog, failure_log
from .listening import Evictable, accept_within
from .session import (
    DEFAULT_OUTPUT_BUDGET_BYTES,
    Host,
    OutputBudget,
    Session,
    StreamContext,
    complete_handshake,
    conn_error_frame,
)

log = logging.getLogger("rsnet.net.server")

DEFAULT_MAX_CONNECTIONS = 10_000
"""Connections a server serves at once (all listeners together); more wait to be accepted."""

REFUSAL_SLOTS = 32
"""Sockets a server accepts beyond ``max_connections``, all listeners together: connections
still in their handshake hold a socket before they count as served, and one more than the
limit is accepted to be told GOING_AWAY. Further connections wait in the listen backlog, not
in the process: accepted sockets (file descriptors) stay within ``max_connections`` plus this,
whatever peers do. Those that never finish a handshake are closed after ``handshake_timeout``,
or sooner, oldest first, when every socket is taken and another connection comes."""

MAX_REPORTED_PARAM_ERRORS = 10
"""Invalid params are reported field by field, up to this many fields (then "and N more"):
a peer's params map of any size gets an answer of bounded size (resource budget,
server/README.md)."""

MAX_REPORTED_TEXT = 200
"""Characters of a field's name or message repeated back in such a report, at most."""

PublisherFactory = Callable[[Any, StreamContext], Publisher[Any]]
SinkFactory = Callable[[Any, StreamContext], Subscriber[Any]]


@dataclasses.dataclass(frozen=True)
class _Entry:
    factory: Callable[[Any, StreamContext], Any]
    params: type[pydantic.BaseModel] | None


class Server:
    """Hosts publishers (and sinks for offered streams) under names; serves TCP and WebSocket.

    ``token``: when set, a client must present it in its HELLO (``auth_token``) or the
    connection is refused with UNAUTHORIZED. ``authenticate(auth_token)`` instead maps the
    presented token to a principal (any object; ``None`` refuses the connection), which the
    host sees as ``StreamContext.principal``. ``host`` replaces the server's own registry of
    publishers and sinks (the broker is one). Limits and keepalive are this side's protocol
    settings (SPEC 6.3); ``keepalive_interval`` and ``handshake_timeout`` are in seconds.
    ``max_connections`` bounds the connections served at once over all listeners: one more is
    answered CONN_ERROR ``GOING_AWAY`` ("try again later") after its HELLO, and closed; at most
    :data:`REFUSAL_SLOTS` sockets more are accepted at once (handshakes under way, refusals), the
    rest wait to be accepted; when every socket is taken, the oldest connection still in its
    handshake is closed to make room for the next (:class:`rsnet.net.listening.Evictable`: silent
    sockets cannot keep clients out). Each accepted socket is a file descriptor: keep ``max_connections``
    well below the process's descriptor limit (:func:`connection_limit`).
    ``output_budget_bytes`` bounds what all connections together hold unwritten for peers that
    do not read, for publishers that wait for room (the broker's subscriptions: see
    :class:`rsnet.net.session.OutputBudget`).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        authenticate: Callable[[Any], Any] | None = None,
        host: Host | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_streams: int = DEFAULT_MAX_STREAMS,
        keepalive_interval: float = DEFAULT_KEEPALIVE,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        output_budget_bytes: int = DEFAULT_OUTPUT_BUDGET_BYTES,
    ) -> None:
        self._token = token
        self._authenticate = authenticate
        self._host = host
        self._keepalive_ms = keepalive_ms(keepalive_interval)
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections!r}")
        self._max_connections = max_connections
        self._connection_slots = trio.Semaphore(max_connections)  # shared by every listener
        self._socket_slots = trio.Semaphore(max_connections + REFUSAL_SLOTS)  # accepted, any state
        self._handshaking = Evictable()  # accepted, not yet a session
        self._connection_log = RateLimitedLog(
            log,
            CONNECTION_LINES_PER_MINUTE,
            "%d more connection reports in the last minute were left out",
            logging.INFO,
        )
        self._max_frame_size = max_frame_size
        self._max_streams = max_streams
        self._handshake_timeout = handshake_timeout
        self._publishers: dict[str, _Entry] = {}
        self._sinks: dict[str, _Entry] = {}
        self.sessions: set[Session] = set()
        self._output_budget = OutputBudget(output_budget_bytes)  # raises ValueError below 1
        self.sessions_opened = 0  # connections welcomed since start, however short (for metrics)
        self.unauthenticated = 0  # handshakes refused for a missing or wrong token (for metrics)
        self._accepting: list[trio.CancelScope] = []
        self._stopping = False

    @property
    def options(self) -> dict[str, Any]:
        """The keyword arguments this server was made with: ``Server(**server.options)`` makes
        one that authenticates and limits as it does (``rsnet serve module:server`` does)."""
        return {
            "token": self._token,
            "authenticate": self._authenticate,
            "host": self._host,
            "max_frame_size": self._max_frame_size,
            "max_streams": self._max_streams,
            "keepalive_interval": self._keepalive_ms / 1000,
            "handshake_timeout": self._handshake_timeout,
            "max_connections": self._max_connections,
            "output_budget_bytes": self._output_budget.total,
        }

    # -- registry ------------------------------------------------------------------------------

    def add_publisher(
        self, name: str, factory: PublisherFactory, *, params: type[pydantic.BaseModel] | None = None
    ) -> None:
        """Host ``factory(params, context)`` under ``name``; ``params`` validates the
        subscriber's parameters (without it, the factory gets them as sent: a dict or None).
        A parameter the model does not name is refused (REJECTED), as the broker refuses one,
        unless the model's config says otherwise (``extra="ignore"`` or ``"allow"``): a
        misspelt parameter must not quietly mean its default."""
        self._publishers[name] = _Entry(factory, _forbidding_extras(params))

    def publisher(
        self, name: str, *, params: type[pydantic.BaseModel] | None = None
    ) -> Callable[[PublisherFactory], PublisherFactory]:
        """Decorator form of :meth:`add_publisher`."""

        def register(factory: PublisherFactory) -> PublisherFactory:
            self.add_publisher(name, factory, params=params)
            return factory

        return register

    def add_sink(self, name: str, factory: SinkFactory, *, params: type[pydantic.BaseModel] | None = None) -> None:
        """Accept streams a client OFFERs under ``name``: ``factory(params, context)`` returns
        the Subscriber that consumes the offered publisher (its demand is the backpressure).
        ``params`` as for :meth:`add_publisher`."""
        self._sinks[name] = _Entry(factory, _forbidding_extras(params))

    def include(self, other: Server) -> None:
        """Host everything ``other`` hosts as well (its publishers and sinks)."""
        self._publishers.update(other._publishers)
        self._sinks.update(other._sinks)

    @property
    def publisher_names(self) -> list[str]:
        return sorted(self._publishers)

    # -- Host, for the sessions ---------------------------------------------------------------------

    def open_publisher(self, name: str, params: Any, context: StreamContext) -> Publisher[Any]:
        return self._open(self._publishers, "publisher", name, params, context)

    def open_sink(self, name: str, params: Any, context: StreamContext) -> Subscriber[Any]:
        return self._open(self._sinks, "sink", name, params, context)

    def _open(self, table: dict[str, _Entry], kind: str, name: str, params: Any, context: StreamContext) -> Any:
        entry = table.get(name)
        if entry is None:
            raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"no {kind} named {name!r}")
        if entry.params is not None:
            try:
                params = entry.params.model_validate(params if params is not None else {})
            except pydantic.ValidationError as invalid:
                raise _invalid_params(name, invalid) from None
        try:
            return entry.factory(params, context)
        except StreamError:
            raise
        except Exception as failure:
            failure_log.exception("%s %r failed to open for %s", kind, name, context.peer)
            code, message, data = error_frame_fields(failure)  # as a failing publisher's on_error
            raise StreamError(code, message, data) from failure

    # -- serving ----------------------------------------------------------------------------------

    async def serve_tcp(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept rsnet connections on TCP (TLS with ``ssl_context``) until :meth:`shutdown`
        (then wait for the connections to drain) or until cancelled. Reports the bound port."""

        async def handle(stream: trio.abc.Stream) -> None:
            peer = describe_peer(stream)
            if ssl_context is not None:
                stream = trio.SSLStream(stream, ssl_context, server_side=True)
            await self.handle(TcpTransport(stream, peer))

        await self._serve(host, port, handle, task_status)

    async def serve_websocket(
        self,
        host: str,
        port: int,
        *,
        path: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept rsnet connections over WebSocket (``wss`` with ``ssl_context``), on any path
        or only ``path``. Binary messages, subprotocol ``rsnet`` (SPEC 2.2)."""
        max_message = self._max_frame_size

        async def handle(stream: trio.abc.Stream) -> None:
            if ssl_context is not None:
                stream = trio.SSLStream(stream, ssl_context, server_side=True)
            transport = None
            deadline = trio.current_time() + self._handshake_timeout  # TLS, WebSocket and HELLO together
            with trio.move_on_at(deadline):
                transport = await accept_websocket(
                    stream, max_message_size=max_message, path=path, conn_error=conn_error_frame
                )
            if transport is None:  # not a WebSocket handshake for us, or too slow
                await trio.aclose_forcefully(stream)
                return
            try:
                await self.handle(transport, handshake_deadline=deadline)
            finally:
                await transport.aclose()  # a closing handshake even when the rsnet handshake failed

        await self._serve(host, port, handle, task_status)

    async def _serve(
        self, host: str, port: int, handle: Callable[[trio.abc.Stream], Any], task_status: trio.TaskStatus[int]
    ) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        accepting = trio.CancelScope()
        self._accepting.append(accepting)
        async with trio.open_nursery() as connections:
            connections.start_soon(self._accept_all, listeners, handle, connections, accepting)
            task_status.started(bound)

    async def _accept_all(
        self,
        listeners: list[trio.SocketListener],
        handle: Callable[[trio.abc.Stream], Any],
        connections: trio.Nursery,
        accepting: trio.CancelScope,
    ) -> None:
        with accepting:
            async with trio.open_nursery() as acceptors:
                guarded = functools.partial(self._handle_guarded, handle)
                for listener in listeners:
                    acceptors.start_soon(
                        accept_within,
                        listener,
                        self._socket_slots,
                        guarded,
                        connections,
                        self._connection_log,
                        self._handshaking,
                    )
        for listener in listeners:
            await trio.aclose_forcefully(listener)

    async def _handle_guarded(self, handle: Callable[[trio.abc.Stream], Any], stream: trio.SocketStream) -> None:
        """One connection's whole life; nothing it does may take the server down."""
        self._handshaking.hold(stream)  # until the session starts
        try:
            await handle(stream)
        except (ConnectionLost, *STREAM_BROKE) as error:
            self._connection_log.log(logging.INFO, "connection ended: %s", error)
        except Exception:
            failure_log.exception("connection failed")
        finally:
            self._handshaking.settle()  # (done already if the session started)
            # What aclose_forcefully(stream) does (usually again: the transport closed it), but
            # without its cancelled checkpoint: raising and catching that Cancelled costs about
            # 30 µs of CPU, a tenth of what a short connection costs the server.
            stream.socket.close()

    async def handle(self, transport: Transport, *, handshake_deadline: float | None = None) -> None:
        """Serve one connection on an established transport: handshake, then its streams.

        The HELLO must come within ``handshake_timeout``, or by ``handshake_deadline`` (trio
        time) when the transport's own handshake already used some of it (WebSocket). A missing
        or wrong token is refused with UNAUTHORIZED; beyond ``max_connections``, GOING_AWAY.
        Both come after the HELLO (read first, so closing never resets the connection over our
        CONN_ERROR), and a connection counts once it is a client: sockets that never send a
        HELLO, or a good token, cannot make the server refuse those that do."""
        conn = Connection(
            Role.SERVER,
            max_frame_size=self._max_frame_size,
            max_streams=self._max_streams,
            keepalive_interval=self._keepalive_ms,
        )
        try:
            hello, events = await complete_handshake(
                transport, conn, Hello, self._handshake_timeout, deadline=handshake_deadline
            )
        except HandshakeError as failure:
            self._connection_log.log(logging.INFO, "%s", failure)
            return
        offered = hello.settings.get("auth_token")
        principal = None
        if self._authenticate is not None:
            principal = self._authenticate(offered)
            allowed = principal is not None
        else:
            allowed = self._token is None or _token_matches(offered, self._token)
        if not allowed:
            self.unauthenticated += 1
            await _refuse(transport, conn, ErrorCode.UNAUTHORIZED, "missing or wrong auth_token")
            self._connection_log.log(logging.INFO, "refused %s: bad token", transport.peer)
            return
        if self._stopping:
            await _refuse(transport, conn, ErrorCode.GOING_AWAY, "the server is shutting down")
            return
        try:
            self._connection_slots.acquire_nowait()
        except trio.WouldBlock:
            limit = f"the server is at its limit of {self._max_connections} connections; try again later"
            await _refuse(transport, conn, ErrorCode.GOING_AWAY, limit)
            self._connection_log.log(logging.INFO, "refused %s: %s", transport.peer, limit)
            return
        try:
            self._handshaking.settle()
            conn.send_welcome()
            budget = self._output_budget
            session = Session(transport, conn, host=self._host or self, principal=principal, output_budget=budget)
            self.sessions.add(session)
            self.sessions_opened += 1
            budget.connections += 1
            try:
                await session.run(events=events)
            finally:
                budget.connections -= 1
                self.sessions.discard(session)
        finally:
            self._connection_slots.release()

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop accepting, send GO_AWAY on every connection, let open streams drain for up to
        ``grace`` seconds, then close what is left (its streams are cancelled)."""
        self._stopping = True
        for scope in self._accepting:
            scope.cancel()
        for session in list(self.sessions):
            session.go_away("the server is shutting down")
        with trio.move_on_after(grace):
            for session in list(self.sessions):
                await session.wait_closed()
        for session in list(self.sessions):
            session.close(ErrorCode.GOING_AWAY, "the drain deadline expired")
        for session in list(self.sessions):
            await session.wait_closed()


def connection_limit(max_connections: int, descriptors: int | None = None) -> int:
    """``max_connections`` as far as the process's file descriptors allow: at most half of
    ``descriptors`` (default: the soft ``RLIMIT_NOFILE``) less :data:`REFUSAL_SLOTS`, and at
    least 1. The other half stays for the rest of the process (a broker's open topics: an
    eighth of the limit by default, a few descriptors each; listeners, logs), so that no number
    of peers can take the descriptors a durable topic needs to store what it acknowledges."""
    if descriptors is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        descriptors = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return max(1, min(max_connections, descriptors // 2 - REFUSAL_SLOTS))


def _forbidding_extras(model: type[pydantic.BaseModel] | None) -> type[pydantic.BaseModel] | None:
    """``model``, refusing parameters it does not name unless its config chose ``extra``
    itself (a subclass: the factory still gets an instance of ``model``)."""
    if model is None or "extra" in model.model_config:
        return model
    config = pydantic.ConfigDict(**{**model.model_config, "extra": "forbid"})
    strict: type[pydantic.BaseModel] = type(
        model.__name__, (model,), {"model_config": config, "__module__": model.__module__, "__doc__": model.__doc__}
    )
    return strict


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REPORTED_TEXT else text[:MAX_REPORTED_TEXT] + "...(truncated)"


def _invalid_params(name: str, invalid: pydantic.ValidationError) -> StreamError:
    """REJECTED, naming the first invalid fields: bounded whatever the params were."""
    problems = invalid.errors(include_url=False, include_input=False)
    errors = [
        {"field": _clip(".".join(map(str, e["loc"]))), "error": _clip(e["msg"])}
        for e in problems[:MAX_REPORTED_PARAM_ERRORS]
    ]
    summary = "; ".join(f"{e['field'] or 'params'}: {e['error']}" for e in errors)
    if len(problems) > len(errors):
        summary += f"; and {len(problems) - len(errors)} more"
    return StreamError(ErrorCode.REJECTED, f"invalid params for {_clip(repr(name))}: {summary}", errors)


async def _refuse(transport: Transport, conn: Connection, code: ErrorCode, message: str) -> None:
    """Send CONN_ERROR ``code``: within FLUSH_TIMEOUT, as a peer that does not read must not
    hold the connection (nor a slot) for ever."""
    conn.send_conn_error(code, message)
    with trio.move_on_after(FLUSH_TIMEOUT):
        await transport.send([conn.data_to_send()])


def _token_matches(offered: Any, expected: str) -> bool:
    if isinstance(offered, str):
        offered = offered.encode()
    if not isinstance(offered, bytes):
        return False
    return hmac.compare_digest(offered, expected.encode())
