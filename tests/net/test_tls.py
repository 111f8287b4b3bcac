"""TLS for TCP (tls://) and WebSocket (wss://), with a throwaway CA from trustme."""

from __future__ import annotations

import functools

import pytest
import trio

import rsnet
from rsnet.transport import TransportClosed

from .support import demo_server, tls_contexts


@pytest.fixture
def tls():
    return tls_contexts()


async def test_tls_and_wss_carry_streams(tls):
    server_context, client_context = tls
    server = demo_server()
    async with trio.open_nursery() as nursery:
        tcp = await nursery.start(functools.partial(server.serve_tcp, ssl_context=server_context), "127.0.0.1", 0)
        ws = await nursery.start(functools.partial(server.serve_websocket, ssl_context=server_context), "127.0.0.1", 0)
        for url in (f"tls://127.0.0.1:{tcp}", f"wss://127.0.0.1:{ws}/"):
            async with rsnet.connect(url, ssl_context=client_context) as conn:
                assert [x async for x in conn.subscribe("range", {"count": 500})] == list(range(500))
        nursery.cancel_scope.cancel()


async def test_a_client_that_does_not_trust_the_certificate_is_refused(tls):
    server_context, _ = tls
    server = demo_server()
    async with trio.open_nursery() as nursery:
        tcp = await nursery.start(functools.partial(server.serve_tcp, ssl_context=server_context), "127.0.0.1", 0)
        with pytest.raises(TransportClosed, match="CERTIFICATE_VERIFY_FAILED"):
            async with rsnet.connect(f"tls://127.0.0.1:{tcp}"):
                pass
        nursery.cancel_scope.cancel()


async def test_a_plain_client_at_a_tls_port_is_told_tls_may_be_why(tls):
    server_context, _ = tls
    server = demo_server()
    async with trio.open_nursery() as nursery:
        tcp = await nursery.start(functools.partial(server.serve_tcp, ssl_context=server_context), "127.0.0.1", 0)
        with pytest.raises(rsnet.HandshakeError, match=r"if the server uses TLS: tls:// or wss://"):
            async with rsnet.connect(f"tcp://127.0.0.1:{tcp}", timeout=5):
                pass
        nursery.cancel_scope.cancel()
