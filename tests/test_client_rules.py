"""The client rules as pure functions: no sockets, no event loop (they are what both clients
drive; tests/sync/test_both_clients.py checks the clients against real servers)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from rsnet.client_rules import (
    Due,
    Keepalive,
    Refill,
    client_connection,
    close_connection,
    handshake_outcome,
    keepalive_ms,
    parse_endpoint,
    stream_params,
)
from rsnet.errors import HandshakeError
from rsnet.protocol import Connection, ConnectionClosed, ErrorCode, Role, State, Welcome


def test_parse_endpoint_knows_the_four_schemes():
    assert parse_endpoint("tcp://127.0.0.1:7600").peer == "127.0.0.1:7600"
    assert parse_endpoint("tls://h:1").secure and not parse_endpoint("tls://h:1").websocket
    assert parse_endpoint("ws://h:1/x").websocket and not parse_endpoint("ws://h:1/x").secure
    assert parse_endpoint("wss://h:443/").secure and parse_endpoint("wss://h:443/").websocket
    for bad in ["http://h:1", "tcp://h", "tcp://:1", "tcp://h:99999", "h:1"]:
        with pytest.raises(ValueError):
            parse_endpoint(bad)


def test_keepalive_pings_after_an_interval_of_sending_nothing_and_gives_up_after_three_silent():
    timer = Keepalive(10.0, now=0.0)
    assert timer.due(5.0) == (Due.NOTHING, 10.0)
    assert timer.due(10.0)[0] is Due.PING
    timer.sent(10.0)
    assert timer.due(15.0) == (Due.NOTHING, 20.0)
    timer.received(12.0)  # any byte counts: the peer is alive until 12 + 30
    timer.sent(40.0)
    assert timer.due(41.0) == (Due.NOTHING, 42.0)
    assert timer.due(42.0)[0] is Due.DEAD


def test_keepalive_counts_silence_only_while_someone_watches():
    timer = Keepalive(1.0, now=0.0)
    timer.sent(100.0)
    # a blocking client that was not reading from 0 to 100 did not observe 100 s of silence
    assert timer.due(100.5, watching_since=100.0)[0] is Due.NOTHING
    assert timer.due(103.0, watching_since=100.0)[0] is Due.DEAD


def test_keepalive_off_on_both_sides_means_no_timer():
    assert Keepalive(None, 0.0).due(1e9) == (Due.NOTHING, float("inf"))


def test_the_shorter_of_the_welcome_and_our_proposal_and_a_zero_is_no_preference():
    conn = Connection(Role.CLIENT)
    conn.keepalive_interval = 20_000
    assert Keepalive.negotiated(conn, 5.0, 0.0).interval == 5.0  # we watch the server more closely
    assert Keepalive.negotiated(conn, 60.0, 0.0).interval == 20.0  # never less than the server asks
    conn.keepalive_interval = 0
    assert Keepalive.negotiated(conn, 5.0, 0.0).interval == 5.0
    assert Keepalive.negotiated(conn, 0.0, 0.0).interval is None


@pytest.mark.parametrize("seconds", [-1.0, math.inf, math.nan, 1e300, 2_147_484.0, 1e-6])
def test_a_keepalive_no_hello_can_carry_is_refused_when_given(seconds):
    # A server given one failed every handshake instead (a traceback each, no CONN_ERROR).
    import rsnet

    with pytest.raises(
        ValueError, match=r"keepalive_interval must be 0 \(none\) or a number of seconds from 0\.001 to 2147483\.647"
    ):
        client_connection(token=None, max_streams=0, keepalive_interval=seconds)
    with pytest.raises(ValueError, match="keepalive_interval must be 0"):
        rsnet.Server(keepalive_interval=seconds)
    assert keepalive_ms(2_147_483.647) == 2**31 - 1


def test_refill_requests_three_quarters_of_prefetch_per_batch():
    refill = Refill(8)
    assert (refill.prefetch, refill.batch) == (8, 6)
    assert [refill.consumed() for _ in range(13)] == [0] * 5 + [6] + [0] * 5 + [6] + [0]
    assert Refill(1).batch == 1
    assert Refill(2**70).prefetch == 2**63 - 1  # capped at the protocol's maximum (rule 3.17)
    with pytest.raises(ValueError):
        Refill(0)


def test_refill_with_a_limit_never_asks_for_more_than_the_limit():
    refill = Refill(8, limit=20)
    asked = refill.initial + sum(refill.consumed() for _ in range(20))
    assert (refill.initial, asked) == (8, 20)
    assert Refill(64, limit=5).initial == 5
    assert Refill(8, limit=0).initial == 0
    for bad in (-1, 1.5, None.__class__):
        with pytest.raises(ValueError):
            Refill(8, limit=bad)  # type: ignore[arg-type]  # the point of the test


def test_params_are_one_mapping_or_nothing():
    assert stream_params(None) is None
    assert stream_params({}) is None
    assert stream_params({"from": "earliest", "prefetch": 1}) == {"from": "earliest", "prefetch": 1}
    with pytest.raises(TypeError):
        stream_params([("count", 1)])  # type: ignore[arg-type]  # the point of the test


def _open_client() -> Connection:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.data_to_send())
    server.events_received()
    server.send_welcome()
    client.receive_data(server.data_to_send())
    assert handshake_outcome(client.events_received(), Welcome, "peer") == []
    assert client.state is State.OPEN
    return client


def test_close_policy_is_go_away_when_idle_and_conn_error_with_streams_open():
    idle = _open_client()
    lost = close_connection(idle)
    assert idle.going_away and idle.state is State.OPEN and lost.code is None
    busy = _open_client()
    busy.send_subscribe("range", None, initial_demand=1)
    lost = close_connection(busy)
    assert busy.state is State.CLOSED and lost.code == ErrorCode.GOING_AWAY


def test_a_refusal_during_the_handshake_is_a_handshake_error_with_its_code():
    closed = ConnectionClosed(code=ErrorCode.UNAUTHORIZED, message="bad token", data=None, by_peer=True)
    with pytest.raises(HandshakeError) as raised:
        handshake_outcome([closed], Welcome, "peer")
    assert raised.value.code == ErrorCode.UNAUTHORIZED
    assert handshake_outcome([], Welcome, "peer") is None


def test_the_rules_import_no_event_loop():
    code = "import sys, rsnet.client_rules; sys.exit(bool({'trio', 'asyncio'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
