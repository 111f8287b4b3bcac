"""The Connection state machine, rule by rule (SPEC sections cited in each test's docstring).

The golden vectors already replay the wire behaviour; these tests cover the local side:
what this end refuses to send, what it reports, and what state it is left in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from rsnet.protocol import (
    MAX_ERROR_MESSAGE,
    MAX_INT,
    MIN_MAX_FRAME_SIZE,
    TRUNCATED,
    Accept,
    Batch,
    Cancel,
    Complete,
    Connection,
    ConnectionClosed,
    ConnError,
    Error,
    ErrorCode,
    GoAway,
    Hello,
    Items,
    LocalProtocolError,
    Next,
    Pong,
    Request,
    Role,
    State,
    Subscribe,
    Welcome,
    encode_frame,
)

from .support import decode, open_pair, subscribed, transfer


@contextlib.contextmanager
def refused(code: ErrorCode) -> Iterator[None]:
    """Expect the block to raise LocalProtocolError with ``code``."""
    with pytest.raises(LocalProtocolError) as caught:
        yield
    assert caught.value.code == code


# ------------------------------------------------------------------ handshake


def test_client_writes_hello_first_and_waits_for_welcome() -> None:
    client = Connection(Role.CLIENT, auth_token="t0k", metadata={"app": "x"})
    (hello,) = decode(bytes(client.data_to_send()))
    assert hello == Hello(
        "rsnet",
        [1],
        {
            "max_frame_size": 1 << 20,
            "max_streams": 1024,
            "keepalive_interval": 20000,
            "auth_token": "t0k",
            "metadata": {"app": "x"},
        },
    )
    assert client.state is State.AWAIT_WELCOME
    with refused(ErrorCode.PROTOCOL_ERROR):
        client.send_subscribe("ticks")


def test_server_reports_hello_and_the_application_decides() -> None:
    client, server = Connection(Role.CLIENT, auth_token="t0k"), Connection(Role.SERVER, keepalive_interval=5000)
    (hello,) = transfer(client, server)
    assert isinstance(hello, Hello) and hello.settings["auth_token"] == "t0k"
    assert server.state is State.AWAIT_ACCEPT and not server.data_to_send()
    server.send_welcome({"node": "a"})
    (welcome,) = transfer(server, client)
    assert welcome == Welcome(
        1, {"max_frame_size": 1 << 20, "max_streams": 1024, "keepalive_interval": 5000, "metadata": {"node": "a"}}
    )
    assert client.state is server.state is State.OPEN
    assert client.version == server.version == 1
    assert client.keepalive_interval == server.keepalive_interval == 5000, "the server's interval is used"


@pytest.mark.parametrize("first", [b"G", b"\x16"], ids=["an HTTP method", "a TLS handshake"])
def test_a_hello_split_before_a_byte_that_would_start_another_protocol_is_still_a_hello(first: bytes) -> None:
    """Attack round 6: the first bytes of a connection say whether it speaks HTTP or TLS, but
    the check looked at the first byte of every chunk until a frame was whole, so a HELLO
    whose second write began with a capital letter was refused as "an HTTP request"."""
    client = Connection(Role.CLIENT, metadata={"client": first.decode("latin-1") + "o client"})
    server = Connection(Role.SERVER)
    hello = client.data_to_send()
    cut = hello.index(first + b"o client")
    server.receive_data(hello[:cut])
    server.receive_data(hello[cut:])
    (event,) = server.events_received()
    assert isinstance(event, Hello) and event.settings["metadata"] == {"client": first.decode("latin-1") + "o client"}
    assert server.state is State.AWAIT_ACCEPT


def test_rejected_hello_closes_the_connection_and_further_data_is_ignored() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    transfer(client, server)
    server.send_conn_error(ErrorCode.UNAUTHORIZED, "bad token")
    assert server.state is State.CLOSED
    (closed,) = transfer(server, client)
    assert closed == ConnectionClosed(ErrorCode.UNAUTHORIZED, "bad token", None, by_peer=True)
    client.receive_data(encode_frame(Welcome(1, {})))
    assert client.events_received() == [] and client.state is State.CLOSED


def test_each_side_sends_no_frame_larger_than_the_peer_accepts() -> None:
    client, server = open_pair(max_frame_size=MIN_MAX_FRAME_SIZE)
    stream_id = client.send_offer("big")
    transfer(client, server)
    server.send_accept(stream_id)
    server.send_request(stream_id, 2)
    transfer(server, client)
    with refused(ErrorCode.FRAME_TOO_LARGE):
        client.send_next(stream_id, "x" * MIN_MAX_FRAME_SIZE)
    assert not client.data_to_send() and client.outstanding_demand(stream_id) == 2


def test_a_violation_in_the_same_bytes_as_hello_leaves_conn_error_as_the_only_answer() -> None:
    """SPEC 6.1: the server's first frame is WELCOME or CONN_ERROR. Bytes that break the protocol
    right behind the HELLO close the connection before the application answers it; its
    WELCOME is then a no-op, so the CONN_ERROR stays the first and last frame (issue 10 finding 6)."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(bytes(client.data_to_send()) + b"\xc1")
    hello, closed = server.events_received()
    assert isinstance(hello, Hello) and isinstance(closed, ConnectionClosed)
    assert closed.code == ErrorCode.PROTOCOL_ERROR and not closed.by_peer
    server.send_welcome()
    server.send_conn_error(ErrorCode.UNAUTHORIZED, "too late")
    (conn_error,) = decode(bytes(server.data_to_send()))
    assert conn_error.code == ErrorCode.PROTOCOL_ERROR and server.state is State.CLOSED


# ------------------------------------------------------------------ demand (rules 1.1, 3.8, 3.9, 3.17)


def test_rule_1_1_send_next_beyond_the_peers_demand_is_refused_locally() -> None:
    client, server, stream_id = subscribed(demand=1)
    server.send_next(stream_id, "a")
    with refused(ErrorCode.FLOW_CONTROL):
        server.send_next(stream_id, "b")
    assert [e.items for e in transfer(server, client)] == [["a"]]
    client.send_request(stream_id, 1)
    transfer(client, server)
    server.send_next(stream_id, "b")
    assert [e.items for e in transfer(server, client)] == [["b"]]


def test_rule_1_1_send_batch_beyond_demand_is_refused_whole() -> None:
    _client, server, stream_id = subscribed(demand=2)
    with refused(ErrorCode.FLOW_CONTROL):
        server.send_batch(stream_id, [1, 2, 3])
    assert not server.data_to_send() and server.outstanding_demand(stream_id) == 2


def test_rule_1_1_receiving_beyond_demand_is_a_stream_error_and_the_connection_lives_on() -> None:
    client, server, stream_id = subscribed(demand=1)
    other = client.send_subscribe("ticks", initial_demand=1)
    transfer(client, server)
    server.send_accept(other)
    transfer(server, client)
    client.receive_data(encode_frame(Next(stream_id, 1)) + encode_frame(Next(stream_id, 2)))
    items, error = client.events_received()
    assert items == Items(stream_id, [1]) and (error.stream_id, error.code) == (stream_id, ErrorCode.FLOW_CONTROL)
    assert decode(bytes(client.data_to_send()))[0].code == ErrorCode.FLOW_CONTROL
    server.send_next(other, "still fine")
    assert transfer(server, client) == [Items(other, ["still fine"])]


def test_rule_3_8_demand_is_cumulative() -> None:
    client, server, stream_id = subscribed()
    client.send_request(stream_id, 2)
    client.send_request(stream_id, 3)
    assert transfer(client, server) == [Request(stream_id, 2), Request(stream_id, 3)]
    assert server.outstanding_demand(stream_id) == client.outstanding_demand(stream_id) == 5
    server.send_batch(stream_id, [1, 2, 3, 4, 5])
    assert transfer(server, client) == [Items(stream_id, [1, 2, 3, 4, 5])]
    assert server.outstanding_demand(stream_id) == client.outstanding_demand(stream_id) == 0


def test_rule_3_9_request_zero_is_a_stream_error() -> None:
    client, server, stream_id = subscribed()
    server.receive_data(encode_frame(Request(stream_id, 0)))
    (error,) = server.events_received()
    assert (error.stream_id, error.code) == (stream_id, ErrorCode.INVALID_REQUEST)
    assert "3.9" in error.message and server.state is State.OPEN and server.stream_count == 0
    (sent,) = transfer(server, client)
    assert (sent.code, client.stream_count) == (ErrorCode.INVALID_REQUEST, 0)


def test_rule_3_9_request_zero_is_never_sent() -> None:
    client, _server, stream_id = subscribed()
    for n in (0, -1):
        with refused(ErrorCode.INVALID_REQUEST):
            client.send_request(stream_id, n)
    assert not client.data_to_send()


def test_rule_3_17_demand_saturates_at_unbounded() -> None:
    client, server, stream_id = subscribed(demand=MAX_INT - 1)
    client.send_request(stream_id, 10)
    client.send_request(stream_id, 2**70)  # clamped to 2**63-1 on the wire
    assert transfer(client, server) == [Request(stream_id, 10), Request(stream_id, MAX_INT)]
    server.send_batch(stream_id, list(range(100)))
    transfer(server, client)
    assert server.outstanding_demand(stream_id) == client.outstanding_demand(stream_id) == MAX_INT


def test_initial_demand_counts_as_a_request_made_with_the_subscribe() -> None:
    client, server = open_pair()
    stream_id = client.send_subscribe("ticks", {"since": 0}, initial_demand=3, metadata={"content_type": "x"})
    assert transfer(client, server) == [Subscribe(stream_id, "ticks", {"since": 0}, 3, {"content_type": "x"})]
    assert server.outstanding_demand(stream_id) == 3


# ------------------------------------------------------------------ items (rules 1.9, 2.13)


def test_rule_2_13_none_is_never_sent_as_an_item() -> None:
    _client, server, stream_id = subscribed(demand=5)
    with refused(ErrorCode.PROTOCOL_ERROR):
        server.send_next(stream_id, None)
    with refused(ErrorCode.PROTOCOL_ERROR):
        server.send_batch(stream_id, [1, None])
    assert not server.data_to_send()


def test_rule_1_9_items_only_after_accept() -> None:
    client, server = open_pair()
    stream_id = client.send_subscribe("ticks", initial_demand=5)
    transfer(client, server)
    with refused(ErrorCode.PROTOCOL_ERROR):
        server.send_next(stream_id, 1)
    with refused(ErrorCode.PROTOCOL_ERROR):
        server.send_complete(stream_id)


def test_unencodable_item_is_an_application_error_and_nothing_is_written() -> None:
    _client, server, stream_id = subscribed(demand=5)
    with refused(ErrorCode.APPLICATION_ERROR):
        server.send_next(stream_id, {1, 2})
    assert not server.data_to_send() and server.outstanding_demand(stream_id) == 5


def test_consecutive_items_of_a_stream_are_gathered_into_one_event() -> None:
    client, server, first = subscribed(demand=10)
    second = client.send_subscribe("ticks", initial_demand=10)
    transfer(client, server)
    server.send_accept(second)
    transfer(server, client)
    server.send_next(first, 1)
    server.send_batch(first, [2, 3])
    server.send_next(first, 4)
    server.send_next(second, "x")
    server.send_next(first, 5)
    assert transfer(server, client) == [Items(first, [1, 2, 3, 4]), Items(second, ["x"]), Items(first, [5])]


def test_items_are_delivered_whatever_their_msgpack_type() -> None:
    values = [0, -1, 2**64 - 1, 1.5, "é", b"\x00", [1, [2]], {"k": None}, False, True]
    client, server, stream_id = subscribed(demand=len(values))
    for value in values:
        server.send_next(stream_id, value)
    assert transfer(server, client) == [Items(stream_id, values)]


# ------------------------------------------------------------------ cancel and terminal frames


def test_rule_2_8_late_frames_after_cancel_are_dropped() -> None:
    client, server, stream_id = subscribed(demand=3)
    client.send_cancel(stream_id)
    server.send_next(stream_id, 1)
    server.send_error(stream_id, 4100, "late")
    assert transfer(server, client) == []
    assert transfer(client, server) == []  # the CANCEL crossed the ERROR: dropped too
    assert client.stream_count == server.stream_count == 0


def test_rule_3_6_and_3_7_request_and_cancel_after_cancel_are_no_ops() -> None:
    client, server, stream_id = subscribed()
    client.send_cancel(stream_id)
    client.send_cancel(stream_id)
    client.send_request(stream_id, 5)
    assert transfer(client, server) == [Cancel(stream_id)]


def test_sends_on_a_stream_the_peer_cancelled_are_no_ops() -> None:
    client, server, stream_id = subscribed(demand=3)
    client.send_cancel(stream_id)
    transfer(client, server)
    server.send_next(stream_id, 1)
    server.send_batch(stream_id, [1, 2])
    server.send_complete(stream_id)
    assert not server.data_to_send()


def test_terminal_frames_end_the_stream_on_both_sides() -> None:
    for terminate in (
        lambda s, i: s.send_complete(i),
        lambda s, i: s.send_error(i, ErrorCode.APPLICATION_ERROR, "boom", {"why": 1}),
    ):
        client, server, stream_id = subscribed(demand=1)
        terminate(server, stream_id)
        (event,) = transfer(server, client)
        assert isinstance(event, (Complete, Error)) and event.stream_id == stream_id
        assert client.stream_count == server.stream_count == 0
        assert client.outstanding_demand(stream_id) == 0


def test_application_error_codes_and_data_are_delivered_unchanged() -> None:
    for code in (4096, 4097, 65536, MAX_INT, 13):  # 13: a protocol code v1 does not define
        client, server, stream_id = subscribed()
        server.send_error(stream_id, code, "m", {"detail": [1, 2]})
        assert transfer(server, client) == [Error(stream_id, code, "m", {"detail": [1, 2]})]


def test_an_offer_is_rejected_with_an_error_before_accept() -> None:
    client, server = open_pair()
    stream_id = client.send_offer("orders")
    transfer(client, server)
    server.send_error(stream_id, ErrorCode.REJECTED, "read-only")
    assert transfer(server, client) == [Error(stream_id, ErrorCode.REJECTED, "read-only", None)]
    assert client.stream_count == 0


# ------------------------------------------------------------------ stream ids


def test_client_ids_are_odd_server_ids_even_and_never_reused() -> None:
    client, server = open_pair()
    ids = []
    for _ in range(3):
        ids.append(client.send_subscribe("a"))
        client.send_cancel(ids[-1])
        ids.append(server.send_offer("b"))
        server.send_error(ids[-1], ErrorCode.APPLICATION_ERROR)
    assert ids == [1, 2, 3, 4, 5, 6]


def test_sends_on_never_opened_streams_raise() -> None:
    client, server = open_pair()
    for send in (
        lambda: client.send_request(1, 1),
        lambda: client.send_cancel(3),
        lambda: server.send_next(2, 1),
        lambda: server.send_accept(1),
        lambda: client.send_error(0, 1),
    ):
        with refused(ErrorCode.PROTOCOL_ERROR):
            send()


def test_a_stream_id_that_only_equals_an_int_is_refused_and_nothing_is_written() -> None:
    # True and 1.0 equal stream 1 and hash alike, so a dict lookup finds the stream; sent,
    # they would go on the wire as a boolean or a float, which peers refuse (SPEC 3).
    client, server, stream_id = subscribed(demand=2)
    assert stream_id == 1
    for wrong in (True, 1.0):
        for send, *rest in (
            (client.send_request, 1),
            (client.send_cancel,),
            (client.send_error, ErrorCode.APPLICATION_ERROR),
            (server.send_next, "item"),
            (server.send_batch, ["item"]),
            (server.send_complete,),
            (server.send_error, ErrorCode.APPLICATION_ERROR),
        ):
            with refused(ErrorCode.PROTOCOL_ERROR):
                send(wrong, *rest)
    assert client.data_to_send() == b""
    assert server.data_to_send() == b""
    # The stream is as it was: the right id still works.
    server.send_next(stream_id, "item")
    (event,) = transfer(server, client)
    assert (event.stream_id, event.items) == (stream_id, ["item"])


def test_each_side_only_sends_its_own_signals() -> None:
    client, server, stream_id = subscribed(demand=1)
    for send in (
        lambda: client.send_next(stream_id, 1),
        lambda: client.send_complete(stream_id),
        lambda: server.send_request(stream_id, 1),
        lambda: server.send_cancel(stream_id),
        lambda: client.send_accept(stream_id),
        lambda: server.send_accept(stream_id),
    ):
        with refused(ErrorCode.PROTOCOL_ERROR):
            send()


# ------------------------------------------------------------------ limits


def test_max_streams_is_respected_by_the_opener() -> None:
    client, _server = open_pair(max_streams=2)
    client.send_subscribe("a")
    second = client.send_subscribe("b")
    with refused(ErrorCode.TOO_MANY_STREAMS):
        client.send_subscribe("c")
    client.send_cancel(second)
    assert client.send_subscribe("c") == 5


def test_send_batch_splits_into_frames_the_peer_accepts() -> None:
    client, server = Connection(Role.CLIENT, max_frame_size=MIN_MAX_FRAME_SIZE), Connection(Role.SERVER)
    server.receive_data(client.data_to_send())
    server.send_welcome()
    client.receive_data(server.data_to_send())
    stream_id = client.send_subscribe("big", initial_demand=100)
    transfer(client, server)
    server.send_accept(stream_id)
    items = [f"{i:04d}" + "x" * 1000 for i in range(100)]
    server.send_batch(stream_id, items)
    data = bytes(server.data_to_send())
    frames = decode(data[len(encode_frame(Accept(stream_id, {}))) :])
    assert len(frames) > 6 and all(isinstance(f, Batch) for f in frames)
    assert all(len(encode_frame(f)) <= MIN_MAX_FRAME_SIZE for f in frames)
    client.receive_data(data)
    assert [i for e in client.events_received() if isinstance(e, Items) for i in e.items] == items


def test_websocket_messages_hold_whole_frames_within_the_peer_limit() -> None:
    client, server = Connection(Role.CLIENT, max_frame_size=MIN_MAX_FRAME_SIZE), Connection(Role.SERVER)
    server.receive_data(client.data_to_send())
    server.send_welcome()
    client.receive_data(server.data_to_send())
    stream_id = client.send_subscribe("ticks", initial_demand=MAX_INT)
    transfer(client, server)
    server.send_accept(stream_id)
    for i in range(3000):
        server.send_next(stream_id, {"i": i, "pad": "y" * (i % 50)})
    messages = server.data_to_send_messages()
    assert len(messages) > 3
    for message in messages:
        assert len(message) <= MIN_MAX_FRAME_SIZE
        decode(message)  # whole frames only: nothing left buffered
    for message in messages:
        client.receive_data(message)
    items = [i for e in client.events_received() if isinstance(e, Items) for i in e.items]
    assert [item["i"] for item in items] == list(range(3000))


def small_client_pair() -> tuple[Connection, Connection]:
    """A client that accepts only MIN_MAX_FRAME_SIZE-byte frames, and its server, after the handshake."""
    client, server = Connection(Role.CLIENT, max_frame_size=MIN_MAX_FRAME_SIZE), Connection(Role.SERVER)
    server.receive_data(client.data_to_send())
    server.send_welcome()
    client.receive_data(server.data_to_send())
    client.events_received()
    server.events_received()
    return client, server


def test_an_oversized_error_message_is_cut_with_a_marker_and_never_costs_the_connection() -> None:
    """Issue 10 finding 4: a 9 MB validation message once made a frame the peer refused."""
    client, server = small_client_pair()
    doomed = client.send_subscribe("checked", initial_demand=1)
    healthy = client.send_subscribe("ticks", initial_demand=1)
    transfer(client, server)
    server.send_accept(healthy)
    huge = "params: " + "unknown key 'k'; " * 600_000  # about 10 MB
    server.send_error(doomed, ErrorCode.REJECTED, huge)
    data = bytes(server.data_to_send())
    assert len(data) < MIN_MAX_FRAME_SIZE
    client.receive_data(data)
    accept, error = client.events_received()
    assert accept == Accept(healthy, {})
    assert isinstance(error, Error) and error.code == ErrorCode.REJECTED
    assert len(error.message.encode()) <= MAX_ERROR_MESSAGE
    assert error.message.startswith("params: unknown key 'k'; ")
    assert error.message.endswith(f"{TRUNCATED} {len(huge)} bytes in all")
    server.send_next(healthy, "still here")
    assert transfer(server, client) == [Items(healthy, ["still here"])]
    assert client.state is server.state is State.OPEN


def test_a_cut_message_never_splits_a_character() -> None:
    client, server, stream_id = subscribed()
    server.send_error(stream_id, 4096, "é€😀" * 5000)
    (error,) = transfer(server, client)
    assert len(error.message.encode()) <= MAX_ERROR_MESSAGE and TRUNCATED in error.message
    head = error.message.split(f" {TRUNCATED}")[0]
    assert ("é€😀" * 5000).startswith(head) and len(head) > MAX_ERROR_MESSAGE // 8


def test_oversized_error_data_is_replaced_by_a_marker_and_small_data_is_kept() -> None:
    client, server, stream_id = subscribed()
    server.send_error(stream_id, 4096, "bad params", {"errors": ["x" * 100] * 1000})
    (error,) = transfer(server, client)
    assert isinstance(error.data, str) and error.data.startswith(TRUNCATED)
    assert "over the limit of 8192" in error.data
    client, server, stream_id = subscribed()
    kept = {"errors": ["x" * 100] * 70}  # a little under MAX_ERROR_DATA
    server.send_error(stream_id, 4096, "bad params", kept)
    assert transfer(server, client) == [Error(stream_id, 4096, "bad params", kept)]


def test_conn_error_and_go_away_messages_are_bounded_too() -> None:
    client, server = small_client_pair()
    server.send_go_away("bye " * 10_000)
    server.send_conn_error(ErrorCode.INTERNAL, "boom " * 1_000_000, {"trace": "t" * 100_000})
    data = bytes(server.data_to_send())
    assert len(data) < MIN_MAX_FRAME_SIZE
    client.receive_data(data)
    go_away, closed = client.events_received()
    assert isinstance(go_away, GoAway) and go_away.message.endswith("40000 bytes in all")
    assert isinstance(closed, ConnectionClosed) and closed.code == ErrorCode.INTERNAL
    assert len(closed.message.encode()) <= MAX_ERROR_MESSAGE and closed.data.startswith(TRUNCATED)


# ------------------------------------------------------------------ keepalive, shutdown, closing


def test_ping_is_answered_with_a_pong_carrying_its_token() -> None:
    client, server = open_pair()
    client.send_ping(41)
    assert transfer(client, server) == []
    assert transfer(server, client) == [Pong(41)]


def test_go_away_stops_new_streams_both_ways_and_lets_open_ones_drain() -> None:
    client, server, stream_id = subscribed(demand=1)
    server.send_go_away("restart")
    assert transfer(server, client) == [GoAway("restart")]
    assert client.going_away and server.going_away
    for conn in (client, server):
        with refused(ErrorCode.GOING_AWAY):
            conn.send_subscribe("more")
    server.send_next(stream_id, "x")
    server.send_complete(stream_id)
    assert transfer(server, client) == [Items(stream_id, ["x"]), Complete(stream_id)]
    assert client.stream_count == server.stream_count == 0


def test_a_peer_violation_closes_with_conn_error_and_reports_it() -> None:
    _client, server = open_pair()
    server.receive_data(encode_frame(Next(9, 1)))
    (closed,) = server.events_received()
    assert closed.code == ErrorCode.PROTOCOL_ERROR and not closed.by_peer
    assert server.state is State.CLOSED
    (sent,) = decode(bytes(server.data_to_send()))
    assert sent.code == ErrorCode.PROTOCOL_ERROR


def test_eof_ends_the_connection() -> None:
    client, _server, _ = subscribed()
    client.receive_eof()
    (closed,) = client.events_received()
    assert closed.code is None and closed.by_peer and client.state is State.CLOSED
    assert client.stream_count == 0
    client.receive_eof()
    assert client.events_received() == []


def test_a_client_answered_in_http_is_told_so() -> None:
    """An HTTP port given for an rsnet one: the answer begins "HTTP/", which would otherwise
    read as the integer 72 and "a frame must be an array"."""
    client = Connection(Role.CLIENT)
    client.data_to_send()
    client.receive_data(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
    (closed,) = client.events_received()
    assert isinstance(closed, ConnectionClosed) and closed.code == ErrorCode.PROTOCOL_ERROR
    assert closed.message == "the server answered in HTTP, not the rsnet protocol: is it a web port?"


def test_a_conn_error_ends_processing_of_the_bytes_it_came_in() -> None:
    """Frames after the peer's CONN_ERROR, even in the same bytes, are not processed."""
    client, _server, stream_id = subscribed(demand=5)
    wire = encode_frame(Next(stream_id, "a")) + encode_frame(ConnError(ErrorCode.INTERNAL, "bye", None))
    client.receive_data(wire + encode_frame(Next(stream_id, "b")) + encode_frame(Complete(stream_id)))
    items, closed = client.events_received()
    assert items == Items(stream_id, ["a"])
    assert isinstance(closed, ConnectionClosed) and closed.by_peer and closed.code == ErrorCode.INTERNAL
    assert client.state is State.CLOSED and client.stream_count == 0
    assert client.data_to_send() == b""


def test_a_malformed_hello_after_the_handshake_is_refused_as_malformed() -> None:
    """Once open, HELLO and WELCOME are violations; a malformed one is named for what is wrong
    with it first, as parse_frame would."""
    for frame, message in (
        ([1, "x", [1], {}], "HELLO.magic must be 'rsnet', got 'x'"),
        ([2], "WELCOME needs 2 fields, got 0"),
        ([1, "rsnet", [1], {}], "HELLO after the handshake"),
    ):
        _client, server = open_pair()
        server.receive_data(msgpack.packb(frame))
        (closed,) = server.events_received()
        assert (closed.code, closed.message) == (ErrorCode.PROTOCOL_ERROR, message)


def test_opening_a_stream_names_the_first_reason_it_may_not() -> None:
    """The connection's state, then GO_AWAY, then the peer's max_streams, before the arguments."""
    client = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError, match="the connection is AWAIT_WELCOME"):
        client.send_subscribe(5, initial_demand=-1)  # type: ignore[arg-type]
    client, _server = open_pair(max_streams=1)
    with pytest.raises(LocalProtocolError, match="initial_demand must be a non-negative int"):
        client.send_subscribe(5, initial_demand=True)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="a stream name must be a str"):
        client.send_subscribe(5)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="metadata must be a dict with str keys"):
        client.send_subscribe("ok", metadata={1: 2})  # type: ignore[dict-item]
    client.send_subscribe("ok")
    with refused(ErrorCode.TOO_MANY_STREAMS):
        client.send_subscribe(5)  # type: ignore[arg-type]
    client.send_go_away()
    with refused(ErrorCode.GOING_AWAY):
        client.send_subscribe(5)  # type: ignore[arg-type]
    client.send_conn_error(ErrorCode.INTERNAL)
    with pytest.raises(LocalProtocolError, match="the connection is CLOSED"):
        client.send_subscribe("ok")


def _answered(items: list[Any], whole: bool) -> tuple[bytes, Connection]:
    """A server's answer to a SUBSCRIBE with demand 5: ``items`` and COMPLETE, sent whole
    (send_whole_stream) or frame by frame; its bytes, and the server."""
    client, server = open_pair()
    stream_id = client.send_subscribe("items", {"count": len(items)}, initial_demand=5)
    transfer(client, server)
    if whole:
        assert server.send_whole_stream(stream_id, items)
    else:
        server.send_accept(stream_id)
        if items:
            server.send_batch(stream_id, items)
        server.send_complete(stream_id)
    return bytes(server.data_to_send()), server


@pytest.mark.parametrize("items", [[], ["one"], [1, 2, 3], [b"x" * 300, {"a": [1, 2]}], list(range(5))])
def test_a_whole_stream_is_the_bytes_of_its_frames_one_by_one(items: list[Any]) -> None:
    """ACCEPT, the items' BATCH and COMPLETE, byte for byte; the stream is over after either."""
    whole, server = _answered(items, whole=True)
    one_by_one, _ = _answered(items, whole=False)
    assert whole == one_by_one
    assert server.stream_count == 0
    assert not server.send_whole_stream(1, ["again"])  # over: no second answer
    assert server.buffered == 0


def test_a_whole_stream_refuses_what_one_frame_at_a_time_would_and_writes_nothing() -> None:
    """False with nothing written (the frames one by one then say why, or cut): more items than
    the demand, a None, an item msgpack cannot pack, a stream already accepted or unknown, a
    BATCH over the peer's max_frame_size."""
    client, server = open_pair()
    stream_id = client.send_subscribe("items", initial_demand=2)
    transfer(client, server)
    assert not server.send_whole_stream(stream_id, [1, 2, 3])  # rule 1.1
    assert not server.send_whole_stream(stream_id, [1, None])  # rule 2.13
    assert not server.send_whole_stream(stream_id, [object()])
    assert not server.send_whole_stream(stream_id + 2, [1])  # never opened
    assert server.buffered == 0
    server.send_accept(stream_id)
    server.data_to_send()
    assert not server.send_whole_stream(stream_id, [1])  # accepted already
    assert server.buffered == 0

    client, server = small_client_pair()
    stream_id = client.send_subscribe("items", initial_demand=1)
    transfer(client, server)
    assert not server.send_whole_stream(stream_id, ["x" * MIN_MAX_FRAME_SIZE])
    assert server.buffered == 0


def test_a_whole_stream_starts_a_new_websocket_message_as_its_frames_would() -> None:
    """Where the current message has no room for the three frames, nothing is written: frame
    by frame, the session's fallback, cuts the message between them."""
    client, server = small_client_pair()
    first = client.send_subscribe("items", initial_demand=MAX_INT)
    second = client.send_subscribe("items", initial_demand=1)
    transfer(client, server)
    server.send_accept(first)
    server.send_batch(first, ["y" * (MIN_MAX_FRAME_SIZE - 40)])  # the message is nearly full
    assert not server.send_whole_stream(second, ["z" * 30])
    server.send_accept(second)
    server.send_batch(second, ["z" * 30])
    server.send_complete(second)
    messages = server.data_to_send_messages()
    assert len(messages) == 2 and all(len(message) <= MIN_MAX_FRAME_SIZE for message in messages)
