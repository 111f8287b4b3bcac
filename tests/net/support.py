"""A real rsnet server on 127.0.0.1 for tests, with TCP and WebSocket listeners."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trustme

import rsnet
from rsnet.protocol import Connection
from rsnet.protocol.connection import Role


@asynccontextmanager
async def running(server: rsnet.Server) -> AsyncIterator[dict[str, str]]:
    """Serve ``server`` on ephemeral loopback ports; yields {"tcp": url, "ws": url}."""
    async with trio.open_nursery() as nursery:
        tcp = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        ws = await nursery.start(server.serve_websocket, "127.0.0.1", 0)
        try:
            yield {"tcp": f"tcp://127.0.0.1:{tcp}", "ws": f"ws://127.0.0.1:{ws}/"}
        finally:
            nursery.cancel_scope.cancel()


def demo_server(**settings) -> rsnet.Server:
    """A server with the publishers most tests use."""
    server = rsnet.Server(**settings)

    @server.publisher("range")
    def range_(params, ctx):
        return rsnet.range_(params.get("start", 0), params["count"])

    @server.publisher("fail")
    def fail(params, ctx):
        return rsnet.ops.concat(
            rsnet.range_(0, params.get("n", 0)), rsnet.error(lambda: RuntimeError("failed on purpose"))
        )

    return server


def endless_server(pause: float = 0.0) -> tuple[rsnet.Server, trio.Event]:
    """A server hosting ``endless`` (1, 2, 3, ... forever, ``pause`` s apart) and the event
    its producer sets when it stops: how tests see a cancel reach the hosted publisher."""
    stopped = trio.Event()
    server = rsnet.Server()

    @server.publisher("endless")
    def endless(params, ctx):
        async def numbers():
            try:
                i = 0
                while True:
                    i += 1
                    yield i
                    if pause:
                        await trio.sleep(pause)
            finally:
                stopped.set()

        return rsnet.from_async_iterable(numbers, nursery=ctx.nursery)

    return server, stopped


def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server's and a client's TLS context for 127.0.0.1, from a throwaway CA (trustme)."""
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)
    return server_context, client_context


def opened_pair() -> tuple[Connection, Connection]:
    """A client and a server protocol connection, handshake done in memory (keepalive 1 s)."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER, keepalive_interval=1000)
    server.receive_data(client.data_to_send())
    server.events_received()
    server.send_welcome()
    client.receive_data(server.data_to_send())
    client.events_received()
    return client, server
