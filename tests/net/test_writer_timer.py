"""The writer's keepalive timer never cuts a write short (SPEC 10.1 next to SPEC 2: the byte
stream is whole frames, in order).

The writer keeps one timer deadline for as long as nothing is due and looks at the keepalive
state again whenever it passes. When it passes just as the writer wakes to finish a write the
socket did not take at once, the timer's cancel must land before any of that write's bytes
are at stake: taken inside the write, it dropped the rest of a frame, and the PING written
next followed the frame's first part on the wire (a flaky test, 'bytes are not a msgpack
value', found it)."""

from __future__ import annotations

import socket
from typing import Any

import trio
import trio.testing

import rsnet
from rsnet.net.session import Session
from rsnet.protocol import ConnectionClosed, Pong, Subscribe, encode_frame
from rsnet.transport.tcp import TcpTransport

from .support import opened_pair


class Waiting(rsnet.Subscriber[Any]):
    """A subscriber that asks for nothing; the stream's frames are all this test looks at."""

    def on_subscribe(self, subscription: Any) -> None:
        pass

    def on_next(self, item: Any) -> None:
        pass

    def on_error(self, error: BaseException) -> None:
        pass

    def on_complete(self) -> None:
        pass


async def test_the_keepalive_timer_going_off_as_the_writer_finishes_a_write_cuts_nothing(mock_clock):
    ours, theirs = trio.socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # so the socket takes a part only
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client_conn, peer = opened_pair()
    session = Session(TcpTransport(trio.SocketStream(ours), "peer"), client_conn)
    params = {f"k{i:05d}": i for i in range(40_000)}  # a SUBSCRIBE of about 0.4 MB
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        await trio.testing.wait_all_tasks_blocked()  # the writer waits, its timer set
        session.publisher("big", params).subscribe(Waiting())  # written at once, in part
        assert session._unfinished, "the rest of the frame waits for the writer"
        # The timer's deadline (a PING is due after 1 s without sending) passes before the
        # writer, woken for the rest, gets to run.
        mock_clock.jump(1.5)
        mock_clock.rate = 1.0  # from here on, real time (for fail_after)
        events: list[Any] = []
        stream = trio.SocketStream(theirs)
        with trio.fail_after(5):
            # Up to the PING the writer sent next, which the peer's protocol answers itself
            # (a PONG, the only frame it writes here), or the end of the connection.
            while not peer.buffered and not any(isinstance(event, ConnectionClosed) for event in events):
                data = await stream.receive_some(65536)
                assert data, "the connection ended"
                peer.receive_data(data)
                events += peer.events_received()
        nursery.cancel_scope.cancel()
    assert not [event for event in events if isinstance(event, ConnectionClosed)]
    assert peer.data_to_send() == encode_frame(Pong(0))
    (subscribe,) = [event for event in events if isinstance(event, Subscribe)]
    assert subscribe.params == params
