"""The blocking client against real rsnet servers on 127.0.0.1, over TCP and WebSocket."""

from __future__ import annotations

import itertools
import pathlib
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
import trustme

import rsnet.sync
from rsnet.errors import ConnectionLost, StreamError
from rsnet.protocol import Connection, ErrorCode, FrameDecoder, FrameType, Pong, Role, State

from .support import Listener, Probes, ScriptedPeer, ServerThread, make_server

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMES = ["tcp", "ws"]
TOKEN = "s3cret"


@pytest.fixture(scope="module")
def probes() -> Probes:
    return Probes()


@pytest.fixture(scope="module")
def urls(probes):
    """("plain" | "guarded" (needs TOKEN) | "brisk" (100 ms keepalive), scheme) -> URL."""
    servers = {
        "plain": make_server(probes),
        "guarded": make_server(probes, token=TOKEN),
        "brisk": make_server(probes, keepalive_interval=0.1),
    }
    keys = [(name, scheme) for name in servers for scheme in SCHEMES]
    with ServerThread([Listener(servers[name], scheme) for name, scheme in keys]) as thread:
        yield dict(zip(keys, thread.urls, strict=False))


@pytest.fixture
def tag(request) -> str:
    """A name for this test's probes."""
    return request.node.name


# -- subscribe -----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_stream_delivers_every_item_in_order_then_ends(urls, scheme):
    with rsnet.sync.connect(urls["plain", scheme]) as client:
        assert list(client.subscribe("range", {"start": 5, "count": 3000}, prefetch=64)) == list(range(5, 3005))
        assert list(client.subscribe("range", {"count": 3}, prefetch=1)) == [0, 1, 2]
        assert list(client.subscribe("range", {"count": 0})) == []


@pytest.mark.parametrize("scheme", SCHEMES)
def test_closing_the_iterator_early_cancels_the_hosted_publisher(urls, scheme, probes, tag):
    with rsnet.sync.connect(urls["plain", scheme]) as client:
        items = client.subscribe("endless", {"tag": tag}, prefetch=16)
        assert [next(items) for _ in range(10)] == list(range(10))
        items.close()
        assert probes[tag].cancelled.wait(2)
        assert probes[tag].requested == 16  # 10 taken: below the refill point, 16 - 16 // 4

        for item in client.subscribe("endless", {"tag": tag + "-dropped"}, prefetch=16):
            if item == 3:
                break  # the for loop drops the generator, which cancels
        assert probes[tag + "-dropped"].cancelled.wait(2)
        assert list(client.subscribe("range", {"count": 2})) == [0, 1]  # the connection lives on


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_remote_error_arrives_after_the_items_with_its_code_message_and_data(urls, scheme):
    with rsnet.sync.connect(urls["plain", scheme]) as client:
        seen = []
        with pytest.raises(StreamError) as caught:
            for item in client.subscribe("fail", {"n": 3}):
                seen.append(item)
        assert seen == [0, 1, 2]
        assert (caught.value.code, caught.value.message, caught.value.data) == (4711, "quota exceeded", {"limit": 10})


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_unknown_publisher_is_refused_and_the_connection_lives_on(urls, scheme):
    with rsnet.sync.connect(urls["plain", scheme]) as client:
        with pytest.raises(StreamError) as caught:
            next(client.subscribe("nowhere"))
        assert caught.value.code == ErrorCode.UNKNOWN_PUBLISHER
        assert list(client.subscribe("range", {"count": 2})) == [0, 1]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_two_streams_on_one_connection_interleave(urls, scheme):
    with rsnet.sync.connect(urls["plain", scheme]) as client:
        low = client.subscribe("range", {"count": 1000}, prefetch=8)
        high = client.subscribe("range", {"start": 5000, "count": 1000}, prefetch=32)
        assert list(zip(low, high, strict=False)) == [(i, 5000 + i) for i in range(1000)]
        assert next(low, "done") == next(high, "done") == "done"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_stream_nobody_reads_holds_no_more_than_its_demand(urls, scheme, probes, tag):
    with rsnet.sync.connect(urls["plain", scheme]) as client:
        idle = client.subscribe("endless", {"tag": tag}, prefetch=8)
        assert next(idle) == 0
        assert sum(1 for _ in client.subscribe("range", {"count": 20_000}, prefetch=64)) == 20_000
        # Received while the other stream ran, but never requested beyond the first 8.
        assert probes[tag].requested == probes[tag].emitted == 8
        assert [next(idle) for _ in range(50)] == list(range(1, 51))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_closing_the_client_ends_its_streams_and_cancels_them_at_the_server(urls, scheme, probes, tag):
    client = rsnet.sync.connect(urls["plain", scheme])
    items = client.subscribe("endless", {"tag": tag}, prefetch=4)
    assert next(items) == 0
    client.close()
    assert client.closed
    assert probes[tag].cancelled.wait(2)
    with pytest.raises(ConnectionLost, match="closed locally"):
        list(items)
    with pytest.raises(ConnectionLost):
        next(client.subscribe("range", {"count": 1}))
    client.close()  # idempotent


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_idle_stream_is_kept_alive_by_keepalive(urls, scheme):
    # The server drops a client it hears nothing from for 3 x 100 ms; the item comes after 600.
    with rsnet.sync.connect(urls["brisk", scheme]) as client:
        assert list(client.subscribe("late", {"delay": 0.6})) == ["late"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_server_shutting_down_lets_the_stream_finish_and_the_client_closes_once_drained(probes, scheme):
    server = make_server(probes)
    shut_down = threading.Event()

    async def shutdown() -> None:
        await server.shutdown(grace=5)
        shut_down.set()

    with ServerThread([Listener(server, scheme)]) as thread, rsnet.sync.connect(thread.urls[0]) as client:
        items = client.subscribe("range", {"count": 50_000}, prefetch=64)
        assert next(items) == 0
        thread.start_soon(shutdown)  # GO_AWAY now; the stream has far more to send
        taken = 1
        while not client._conn.going_away:  # the client hears of it as it reads
            next(items)
            taken += 1
        # A new stream is refused as the server would refuse it: GOING_AWAY, retryable elsewhere.
        with pytest.raises(StreamError) as refused:
            next(client.subscribe("range", {"count": 1}))
        assert refused.value.code == ErrorCode.GOING_AWAY
        assert taken + sum(1 for _ in items) == 50_000
        # Our close, not the 5 s grace, ended the server's wait.
        assert shut_down.wait(2)
        assert client.closed
        with pytest.raises(ConnectionLost):
            next(client.subscribe("range", {"count": 1}))


# -- offer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_offer_takes_items_only_as_the_server_requests_them(urls, scheme, probes, tag):
    probe = probes[tag]
    taken = []

    def rows():
        for i in range(200):
            taken.append((i, len(probe.items)))  # what the sink had when row i was taken
            yield i

    with rsnet.sync.connect(urls["plain", scheme]) as client:
        client.offer("sink", rows(), {"tag": tag, "window": 4})
    assert probe.ended.wait(2) and probe.error is None
    assert probe.items == list(range(200))
    # The sink requests 4 more each time 4 arrived: row i may leave only once i - 3 arrived.
    assert all(i < received + 4 for i, received in taken)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_offer_returns_when_the_server_cancels_even_with_unbounded_demand(urls, scheme, probes, tag):
    with rsnet.sync.connect(urls["plain", scheme]) as client:
        client.offer("sink", itertools.count(), {"tag": tag, "cancel_after": 5000})
        assert probes[tag].items == list(range(5000))
        assert list(client.subscribe("range", {"count": 2})) == [0, 1]


def test_a_stream_closed_in_the_middle_of_another_call_is_cancelled_when_that_call_ends(urls, probes, tag):
    with rsnet.sync.connect(urls["plain", "tcp"]) as client:
        items = client.subscribe("endless", {"tag": tag}, prefetch=4)
        assert next(items) == 0

        def rows():
            items.close()  # while offer is writing: the CANCEL waits for offer's write to end
            yield "row"

        client.offer("sink", rows(), {"tag": tag + "-sink"})
        assert probes[tag].cancelled.wait(2)
        assert probes[tag + "-sink"].ended.wait(2) and probes[tag + "-sink"].items == ["row"]


def test_offer_to_an_unknown_sink_is_refused(urls):
    with rsnet.sync.connect(urls["plain", "tcp"]) as client:
        with pytest.raises(StreamError) as caught:
            client.offer("nowhere", [1, 2, 3])
        assert caught.value.code == ErrorCode.UNKNOWN_PUBLISHER


def test_an_iterable_that_fails_ends_the_offered_stream_with_its_error(urls, probes, tag):
    def rows():
        yield from (1, 2)
        raise LookupError("no more rows")

    with rsnet.sync.connect(urls["plain", "tcp"]) as client:
        with pytest.raises(LookupError):
            client.offer("sink", rows(), {"tag": tag})
        with pytest.raises(StreamError) as caught:
            client.offer("sink", [1, None], {"tag": tag + "-none"})
        assert caught.value.code == ErrorCode.PROTOCOL_ERROR
    probe = probes[tag]
    assert probe.ended.wait(2) and probe.items == [1, 2]
    assert probe.error.code == ErrorCode.APPLICATION_ERROR and "LookupError: no more rows" in probe.error.message
    assert probes[tag + "-none"].ended.wait(2) and probes[tag + "-none"].items == [1]


# -- connecting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_wrong_or_missing_token_is_refused_with_unauthorized(urls, scheme):
    for token in (None, "wrong"):
        with pytest.raises(ConnectionLost) as caught:
            rsnet.sync.connect(urls["guarded", scheme], token=token)
        assert caught.value.code == ErrorCode.UNAUTHORIZED
    with rsnet.sync.connect(urls["guarded", scheme], token=TOKEN) as client:
        assert list(client.subscribe("range", {"count": 2})) == [0, 1]


def test_tls_and_wss_carry_streams_and_an_untrusted_certificate_is_refused(probes):
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)
    server = make_server(probes)
    with ServerThread([Listener(server, scheme, server_context) for scheme in SCHEMES]) as thread:
        for url in thread.urls:
            with rsnet.sync.connect(url, ssl_context=client_context) as client:
                assert list(client.subscribe("range", {"count": 500})) == list(range(500))
        with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
            rsnet.sync.connect(thread.urls[0])


def test_unusable_urls_and_unreachable_servers():
    with pytest.raises(ValueError):
        rsnet.sync.connect("http://127.0.0.1:80/")
    with pytest.raises(ValueError):
        rsnet.sync.connect("tcp://127.0.0.1")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(ConnectionLost, match="cannot connect"):
        rsnet.sync.connect(f"tcp://127.0.0.1:{port}")


# -- peers a real server would never be ------------------------------------------------------------


def _welcome(sock: socket.socket, keepalive_interval_ms: int) -> Connection:
    """Play the server's side of the handshake on ``sock``."""
    conn = Connection(Role.SERVER, keepalive_interval=keepalive_interval_ms)
    while conn.state is State.AWAIT_HELLO:
        conn.receive_data(sock.recv(65536))
    conn.send_welcome()
    sock.sendall(conn.data_to_send())
    return conn


def _read_until_eof(sock: socket.socket) -> bytes:
    received = b""
    while data := sock.recv(65536):
        received += data
    return received


def test_a_server_that_does_not_answer_the_handshake_is_timed_out():
    received = []
    with ScriptedPeer(lambda sock: received.append(_read_until_eof(sock))) as peer:
        started = time.monotonic()
        with pytest.raises(ConnectionLost) as caught:
            rsnet.sync.connect(peer.url, timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 1.0
    assert caught.value.code == ErrorCode.TIMEOUT
    hello, conn_error = FrameDecoder().frames(received[0])
    assert hello[0] == FrameType.HELLO and conn_error[:2] == [FrameType.CONN_ERROR, ErrorCode.TIMEOUT]


def test_a_server_that_falls_silent_is_pinged_then_given_up_after_three_keepalive_intervals():
    received = []

    def silent(sock: socket.socket) -> None:
        _welcome(sock, keepalive_interval_ms=100)
        received.append(_read_until_eof(sock))  # and never write again

    with ScriptedPeer(silent) as peer, rsnet.sync.connect(peer.url) as client:
        started = time.monotonic()
        with pytest.raises(ConnectionLost) as caught:
            next(client.subscribe("anything"))
        assert 0.3 <= time.monotonic() - started < 1.0
        assert caught.value.code == ErrorCode.TIMEOUT
        assert client.closed
    kinds = [frame[0] for frame in FrameDecoder().frames(received[0])]
    # A PING per interval of sending nothing (at 100 and 200 ms), then CONN_ERROR at 300.
    assert kinds[:2] == [FrameType.SUBSCRIBE, FrameType.PING]
    assert kinds[2:-1] in ([FrameType.PING], [FrameType.PING, FrameType.PING])
    assert kinds[-1] == FrameType.CONN_ERROR


def test_pings_are_answered_while_waiting_and_a_conn_error_ends_the_streams():
    pongs = []

    def pinging(sock: socket.socket) -> None:
        conn = _welcome(sock, keepalive_interval_ms=60_000)
        conn.send_ping(42)
        sock.sendall(conn.data_to_send())
        while not pongs:
            conn.receive_data(sock.recv(65536))
            pongs.extend(event.token for event in conn.events_received() if isinstance(event, Pong))
        conn.send_conn_error(ErrorCode.REJECTED, "that will be all", {"retry": False})
        sock.sendall(conn.data_to_send())
        _read_until_eof(sock)

    with ScriptedPeer(pinging) as peer, rsnet.sync.connect(peer.url) as client:
        with pytest.raises(ConnectionLost) as caught:
            next(client.subscribe("anything"))
    assert pongs == [42]
    assert (caught.value.code, caught.value.data) == (ErrorCode.REJECTED, {"retry": False})
    assert "that will be all" in str(caught.value)


# -- processes -------------------------------------------------------------------------------------

SERVER_PROCESS = """
import itertools, trio, rsnet

async def main():
    server = rsnet.Server()
    server.add_publisher("endless", lambda params, ctx: rsnet.from_iterable(itertools.count()))
    async with trio.open_nursery() as nursery:
        tcp = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        ws = await nursery.start(server.serve_websocket, "127.0.0.1", 0)
        print(f"tcp://127.0.0.1:{tcp} ws://127.0.0.1:{ws}/", flush=True)

trio.run(main)
"""


@pytest.fixture
def server_process():
    process = subprocess.Popen([sys.executable, "-c", SERVER_PROCESS], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_server_killed_mid_stream_ends_the_stream_with_connection_lost_at_once(server_process, scheme):
    urls = dict(zip(SCHEMES, server_process.stdout.readline().split(), strict=False))
    with rsnet.sync.connect(urls[scheme]) as client:
        items = client.subscribe("endless", prefetch=64)
        assert [next(items) for _ in range(100)] == list(range(100))
        server_process.kill()
        server_process.wait()
        started = time.monotonic()
        with pytest.raises(ConnectionLost):
            for _ in items:
                pass
        assert time.monotonic() - started < 1.0


def test_importing_and_using_the_blocking_client_loads_no_event_loop():
    probe = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import rsnet, rsnet.sync
try:
    rsnet.sync.connect("tcp://127.0.0.1:1", timeout=1)
except rsnet.ConnectionLost:
    pass
print(sorted(name for name in sys.modules if name.split(".")[0] in ("trio", "asyncio", "anyio", "sniffio")))
"""
    result = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
