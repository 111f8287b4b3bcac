"""Items sent as already-encoded bytes (``Encoded``): what goes on the wire is exactly what
packing the values would have written, so a peer cannot tell, and every send rule still holds."""

from __future__ import annotations

import io

import msgpack
import pytest

from rsnet.protocol import MIN_MAX_FRAME_SIZE, Connection, Encoded, ErrorCode, Items, LocalProtocolError, Role

from .support import subscribed, transfer

VALUES = [0, -1, 2**64 - 1, 1.5, "é", b"\x00", [1, [2]], {"k": None, "v": {"x": 1}}, False, True]


def encoded(value: object) -> Encoded:
    return Encoded(msgpack.packb(value, use_bin_type=True))


def test_a_batch_of_encoded_items_is_the_same_bytes_as_the_batch_of_their_values() -> None:
    client, server, stream_id = subscribed(demand=2 * len(VALUES))
    server.send_batch(stream_id, VALUES)
    packed = bytes(server.data_to_send())
    server.send_batch(stream_id, [encoded(v) for v in VALUES], encoded=True)
    assert bytes(server.data_to_send()) == packed
    client.receive_data(packed)
    assert client.events_received() == [Items(stream_id, VALUES)]


def test_encoded_and_plain_items_mix_in_one_batch_in_order() -> None:
    client, server, stream_id = subscribed(demand=len(VALUES))
    mixed = [encoded(v) if i % 2 else v for i, v in enumerate(VALUES)]
    server.send_batch(stream_id, mixed, encoded=True)
    assert transfer(server, client) == [Items(stream_id, VALUES)]
    assert server.outstanding_demand(stream_id) == 0


def test_send_next_sends_an_encoded_item_as_its_bytes() -> None:
    client, server, stream_id = subscribed(demand=2)
    server.send_next(stream_id, encoded({"a": [1, 2]}))
    server.send_next(stream_id, {"a": [1, 2]})
    assert transfer(server, client) == [Items(stream_id, [{"a": [1, 2]}, {"a": [1, 2]}])]


def test_encoded_items_are_split_into_frames_the_peer_accepts() -> None:
    client, server = Connection(Role.CLIENT, max_frame_size=MIN_MAX_FRAME_SIZE), Connection(Role.SERVER)
    server.receive_data(client.data_to_send())
    server.send_welcome()
    client.receive_data(server.data_to_send())
    stream_id = client.send_subscribe("big", initial_demand=64)
    transfer(client, server)
    server.send_accept(stream_id)
    item = "x" * (MIN_MAX_FRAME_SIZE // 8)
    server.send_batch(stream_id, [encoded(item)] * 64, encoded=True)
    data = bytes(server.data_to_send())
    frames = list(msgpack.Unpacker(io.BytesIO(data)))
    assert len(frames) > 8  # ACCEPT, then the 64 items in frames no larger than the client takes
    assert max(len(msgpack.packb(f)) for f in frames) <= MIN_MAX_FRAME_SIZE
    client.receive_data(data)
    assert [item for event in client.events_received() if isinstance(event, Items) for item in event.items] == [
        item
    ] * 64
    client.send_request(stream_id, 1)
    transfer(client, server)
    with pytest.raises(LocalProtocolError) as refused:
        server.send_batch(stream_id, [encoded("x" * MIN_MAX_FRAME_SIZE)], encoded=True)
    assert refused.value.code == ErrorCode.FRAME_TOO_LARGE
    assert server.outstanding_demand(stream_id) == 1  # nothing was sent


def test_encoded_items_obey_demand_and_rule_2_13_like_values() -> None:
    _client, server, stream_id = subscribed(demand=1)
    with pytest.raises(LocalProtocolError) as refused:
        server.send_batch(stream_id, [encoded(1), encoded(2)], encoded=True)
    assert refused.value.code == ErrorCode.FLOW_CONTROL
    with pytest.raises(LocalProtocolError) as refused:
        server.send_batch(stream_id, [encoded(1), None], encoded=True)
    assert refused.value.code == ErrorCode.PROTOCOL_ERROR
    assert not server.data_to_send() and server.outstanding_demand(stream_id) == 1
