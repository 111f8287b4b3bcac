"""Tokens and grants through the network, the obvious bypasses, and the metrics endpoint of
the real daemon."""

from __future__ import annotations

import signal
import ssl

import pytest
import trio
import trustme

import rsnet
from rsnet.broker.auth import Authorizer, hash_token
from rsnet.broker.client import commit, publish
from rsnet.broker.config import load_config
from rsnet.broker.daemon import build_broker, metrics_refresher
from rsnet.broker.metrics import BrokerMetrics
from rsnet.protocol import ErrorCode, FrameDecoder, Hello, Welcome, encode_frame, parse_frame

from .support import served_url, start_daemon, take

INGEST = "ingest-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"


@pytest.fixture
def config():
    return load_config(
        None,
        {},
        {
            "auth.tokens": [
                {"name": "ingest", "hash": hash_token(INGEST), "publish": ["sensors.>"], "subscribe": []},
                {"name": "reader", "hash": hash_token(READER), "publish": [], "subscribe": ["sensors.*"]},
            ]
        },
    )


async def serve(config, nursery, *, parts=None):
    authorizer = Authorizer(config.auth)
    broker = build_broker(config, authorizer)
    server = rsnet.Server(host=broker, authenticate=authorizer.authenticate)
    await nursery.start(broker.run)
    port = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
    if parts is not None:
        parts.update(broker=broker, server=server)
    return f"tcp://127.0.0.1:{port}"


async def expect_refused(coroutine, code):
    with pytest.raises(rsnet.StreamError) as caught:
        await coroutine
    assert caught.value.code == code


async def test_no_token_or_a_wrong_token_is_refused_at_the_handshake_and_counted(config):
    parts = {}
    async with trio.open_nursery() as nursery:
        url = await serve(config, nursery, parts=parts)
        for token in (None, "", "wrong-token-0123456789abcdef", INGEST + "x", INGEST.upper()):
            with pytest.raises(rsnet.HandshakeError) as caught:
                async with rsnet.connect(url, token=token):
                    pass
            assert caught.value.code == ErrorCode.UNAUTHORIZED
        # Counted for the operators (a token being guessed shows there)
        metrics = BrokerMetrics()
        metrics.add_refresher(metrics_refresher(parts["broker"], parts["server"]))
        assert 'rsnet_broker_auth_denials_total{reason="unauthenticated"} 5.0' in metrics.render()[0].decode()
        nursery.cancel_scope.cancel()


async def test_grants_hold_for_topics_and_patterns(config):
    parts = {}
    async with trio.open_nursery() as nursery:
        url = await serve(config, nursery, parts=parts)
        async with rsnet.connect(url, token=INGEST) as ingest, rsnet.connect(url, token=READER) as reader:
            assert await publish(ingest, "sensors.kitchen", [1, 2]) == 2
            assert await publish(ingest, "sensors.kitchen.deep", [3]) == 1  # within sensors.>
            await expect_refused(publish(ingest, "billing.invoices", [1]), ErrorCode.UNAUTHORIZED)
            await expect_refused(take(ingest, "sensors.kitchen", 1), ErrorCode.UNAUTHORIZED)  # publish-only

            assert [r["value"] for r in await take(reader, "sensors.kitchen", 2, **{"from": "earliest"})] == [1, 2]
            for escaping in ("sensors.>", "*", ">", "sensors.kitchen.deep", "sensors.*.deep", "billing.invoices"):
                await expect_refused(take(reader, escaping, 1), ErrorCode.UNAUTHORIZED)
            await expect_refused(publish(reader, "sensors.kitchen", [9]), ErrorCode.UNAUTHORIZED)
            await expect_refused(
                take(reader, "$acks", 1, **{"producer": "p", "topic": "sensors.kitchen"}), ErrorCode.UNAUTHORIZED
            )
            await commit(reader, "sensors.kitchen", "dashboards", 1)
            await expect_refused(commit(ingest, "sensors.kitchen", "dashboards", 0), ErrorCode.UNAUTHORIZED)
            # $topics shows each client only what it may subscribe to
            assert [t["topic"] async for t in reader.subscribe("$topics")] == ["sensors.kitchen"]
            assert [t["topic"] async for t in ingest.subscribe("$topics")] == []
            # a topic asked for by name that may not be read is refused, existing or not (so a
            # listing says no more than the grants); a pattern only filters
            for name in ("billing.invoices", "sensors.kitchen.deep", "no.such.topic"):
                listing = reader.subscribe("$topics", {"match": [name]})
                await expect_refused(listing.__anext__(), ErrorCode.UNAUTHORIZED)
            assert [t["topic"] async for t in reader.subscribe("$topics", {"match": "sensors.kitchen"})] == [
                "sensors.kitchen"
            ]
            assert [t["topic"] async for t in reader.subscribe("$topics", {"match": "sensors.>"})] == [
                "sensors.kitchen"
            ]
            # every refusal above is counted for the operators
            metrics = BrokerMetrics()
            metrics.add_refresher(metrics_refresher(parts["broker"], parts["server"]))
            text = metrics.render()[0].decode()
            assert f'rsnet_broker_auth_denials_total{{reason="forbidden"}} {float(parts["broker"].denied)}' in text
            assert parts["broker"].denied >= 10
        nursery.cancel_scope.cancel()


async def test_the_daemon_serves_metrics_and_health(tmp_path):
    config_file = tmp_path / "rsnet.toml"
    config_file.write_text('[listen]\ntcp = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n')
    process, text = await start_daemon("--config", str(config_file), announces=b"metrics on")
    try:
        url = served_url(text)
        metrics_port = int(text.split("metrics on http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        async with rsnet.connect(url) as conn:
            await publish(conn, "orders", list(range(5)))
            async with conn.subscribe("orders", {"from": "earliest"}) as records:
                await records.__anext__()
                metrics = await http_get(metrics_port, "/metrics")
        assert 'rsnet_broker_records_in_total{topic="orders"} 5.0' in metrics
        assert 'rsnet_broker_streams{kind="subscribe"} 1.0' in metrics
        assert 'rsnet_broker_subscriber_lag{subscriber="s1",topic="orders"}' in metrics
        assert "rsnet_broker_connections 1.0" in metrics
        assert "rsnet_broker_storage_bytes" in metrics
        health = await http_get(metrics_port, "/health")
        assert '"healthy": true' in health or '"healthy":true' in health
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            assert await process.wait() == 0


async def http_get(port: int, path: str) -> str:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        response = b""
        with trio.fail_after(5):
            while data := await stream.receive_some(65536):
                response += data
    return response.decode()


async def test_the_daemon_serves_tls_from_its_config(tmp_path):
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1")
    certificate.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    config_file = tmp_path / "rsnet.toml"
    config_file.write_text(
        f'[listen]\ntcp = "127.0.0.1:0"\ntls = {{ cert = "{tmp_path / "server.pem"}", key = "{tmp_path / "server.pem"}" }}\n'
    )
    process, text = await start_daemon("--config", str(config_file), announces=b"serving tls://")
    try:
        url = served_url(text)
        trusting = ssl.create_default_context()
        authority.configure_trust(trusting)
        async with rsnet.connect(url, ssl_context=trusting) as conn:
            assert await publish(conn, "secure", ["x"]) == 1
        with pytest.raises(rsnet.TransportClosed):  # an untrusting client refuses the server
            async with rsnet.connect(url):
                pass
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            await process.wait()


async def test_the_daemon_takes_keepalive_and_max_connections_from_its_config(tmp_path):
    """Issue 10 findings 7 and the connection budget: both are settings of ``rsnet broker``,
    as the handshake timeout is (attack round 5: silent sockets held the slots 10 s)."""
    config = tmp_path / "rsnet.toml"
    config.write_text(
        '[listen]\ntcp = "127.0.0.1:0"\nkeepalive_interval_s = 0.3\nmax_connections = 1\nhandshake_timeout_s = 0.5\n'
    )
    process, printed = await start_daemon("--config", str(config), announces=b"serving ")
    try:
        url = served_url(printed)
        async with rsnet.connect(url) as first:
            with pytest.raises(rsnet.HandshakeError) as refused:
                async with rsnet.connect(url):
                    pass
            assert refused.value.code == ErrorCode.GOING_AWAY
            assert first._session.conn.keepalive_interval == 300  # the WELCOME's, from the config
        port = int(url.rsplit(":", 1)[1])
        with trio.fail_after(10):  # the slot is free again once the first connection is gone
            while True:
                silent = await trio.open_tcp_stream("127.0.0.1", port)
                await silent.send_all(encode_frame(Hello("rsnet", [1], {})))
                answer = [parse_frame(f) for f in FrameDecoder(1 << 20).frames(await silent.receive_some(4096))]
                if isinstance(answer[0], Welcome):
                    break
                await silent.aclose()
                await trio.sleep(0.05)
        with trio.fail_after(3 * 0.3 + 2):  # a silent peer is dropped after three intervals
            while await silent.receive_some(4096):
                pass
        with trio.fail_after(5):  # one that never says HELLO, after the handshake timeout (not 10 s)
            while True:
                mute = await trio.open_tcp_stream("127.0.0.1", port)
                started = trio.current_time()
                while await mute.receive_some(4096):
                    pass
                if trio.current_time() - started > 0.3:  # (not refused at once: a slot was free)
                    break
                await mute.aclose()
                await trio.sleep(0.05)
    finally:
        process.terminate()
        with trio.fail_after(10):
            await process.wait()
