"""Bad input from raw sockets gets the documented errors; well-behaved clients keep streaming.

These clients speak the wire protocol by hand (protocol/SPEC.md), so they can break it.
"""

from __future__ import annotations

import itertools
import pathlib
import socket
import time

import msgpack
import pytest
import trio
import trio.testing

import rsnet
from rsnet.client_rules import FLUSH_TIMEOUT
from rsnet.net.session import DEFAULT_CONNECTION_WINDOW_BYTES, MAX_UNTAKEN_ANSWERS, Session
from rsnet.protocol import (
    MAX_INT,
    Batch,
    Cancel,
    ConnError,
    Error,
    ErrorCode,
    FrameDecoder,
    GoAway,
    Hello,
    Ping,
    Pong,
    Request,
    Subscribe,
    Welcome,
    encode_frame,
    parse_frame,
)
from rsnet.transport.tcp import TcpTransport

from .support import demo_server, opened_pair, running

HELLO = encode_frame(Hello("rsnet", [1], {}))


class RawClient:
    """A TCP client that writes bytes and reads frames, with no rules of its own."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(1 << 24)
        self.frames: list = []

    @classmethod
    async def connect(cls, url: str, *, handshake: bool = True) -> RawClient:
        port = int(url.rsplit(":", 1)[1])
        client = cls(await trio.open_tcp_stream("127.0.0.1", port))
        if handshake:
            await client.send(HELLO)
            assert isinstance(await client.next_frame(), Welcome)
        return client

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def next_frame(self, timeout: float = 5.0):
        with trio.fail_after(timeout):
            while not self.frames:
                data = await self.stream.receive_some(65536)
                if not data:
                    return None  # the server closed the connection
                self.frames.extend(parse_frame(fields) for fields in self.decoder.frames(data))
        return self.frames.pop(0)

    async def frame_of(self, kind, timeout: float = 5.0):
        """The next frame of type ``kind``, skipping others (e.g. NEXT on other streams)."""
        while True:
            frame = await self.next_frame(timeout)
            if frame is None or isinstance(frame, kind):
                return frame

    async def closed(self, timeout: float = 5.0) -> bool:
        while True:
            if await self.next_frame(timeout) is None:
                return True


async def well_behaved_traffic(url: str, stop: trio.Event, counts: list[int]) -> None:
    async with rsnet.connect(url) as conn:
        while not stop.is_set():
            counts.append(len([x async for x in conn.subscribe("range", {"count": 500})]))


@pytest.fixture
def server():
    return demo_server(max_streams=8)


async def with_bystander(server, attack):
    """Run ``attack(url)`` while another client streams; the bystander must be unaffected."""
    async with running(server) as urls:
        stop, counts = trio.Event(), []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(well_behaved_traffic, urls["tcp"], stop, counts)
            await attack(urls["tcp"])
            await trio.sleep(0.05)
            before = len(counts)
            await trio.sleep(0.1)
            stop.set()
        assert all(count == 500 for count in counts)
        assert len(counts) > before  # still streaming after the attack
        assert len(server.sessions) == 0


async def test_garbage_bytes_get_protocol_error_and_close(server):
    async def attack(url):
        raw = await RawClient.connect(url, handshake=False)
        await raw.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        frame = await raw.next_frame()
        assert isinstance(frame, ConnError) and frame.code == ErrorCode.PROTOCOL_ERROR
        assert await raw.closed()

    await with_bystander(server, attack)


async def test_an_oversized_frame_gets_frame_too_large(server):
    async def attack(url):
        raw = await RawClient.connect(url)
        huge = msgpack.packb([21, 1, "x" * (2 << 20)])  # far over the 1 MiB default limit
        try:
            await raw.send(huge)
        except trio.BrokenResourceError:
            pass  # the server may close before it has read it all
        frame = await raw.next_frame()
        assert isinstance(frame, ConnError) and frame.code == ErrorCode.FRAME_TOO_LARGE

    await with_bystander(server, attack)


async def test_frames_for_a_stream_never_opened_are_a_protocol_error(server):
    async def attack(url):
        raw = await RawClient.connect(url)
        await raw.send(encode_frame(Request(41, 5)))
        frame = await raw.next_frame()
        assert isinstance(frame, ConnError) and frame.code == ErrorCode.PROTOCOL_ERROR
        assert await raw.closed()

    await with_bystander(server, attack)


async def test_stream_id_reuse_is_a_protocol_error(server):
    async def attack(url):
        raw = await RawClient.connect(url)
        await raw.send(encode_frame(Subscribe(1, "range", {"count": 1}, 5, {})))
        await raw.send(encode_frame(Subscribe(1, "range", {"count": 1}, 5, {})))
        frame = await raw.frame_of(ConnError)
        assert frame.code == ErrorCode.PROTOCOL_ERROR

    await with_bystander(server, attack)


async def test_request_zero_and_demand_overflow(server):
    async def attack(url):
        raw = await RawClient.connect(url)
        await raw.send(encode_frame(Subscribe(1, "range", {"count": 10**9}, 0, {})))
        await raw.send(encode_frame(Request(1, 0)))  # rule 3.9
        frame = await raw.frame_of(Error)
        assert (frame.stream_id, frame.code) == (1, ErrorCode.INVALID_REQUEST)
        # demand saturates at 2**63-1 (rule 3.17): no error for MAX + MAX
        await raw.send(encode_frame(Subscribe(3, "range", {"count": 5}, MAX_INT, {})))
        await raw.send(encode_frame(Request(3, MAX_INT)))
        frames = []
        while not frames or type(frames[-1]).__name__ != "Complete":
            frames.append(await raw.next_frame())
        assert not any(isinstance(f, Error) for f in frames)
        # a REQUEST beyond 2**63-1 is malformed: a connection error
        await raw.send(msgpack.packb([19, 3, 2**64 - 1]))
        frame = await raw.frame_of(ConnError)
        assert frame.code == ErrorCode.PROTOCOL_ERROR

    await with_bystander(server, attack)


async def test_a_flood_of_subscribes_beyond_max_streams_is_refused_per_stream(server):
    async def attack(url):
        raw = await RawClient.connect(url)
        # slow streams (no demand granted) pile up: only 8 may be open at once
        await raw.send(b"".join(encode_frame(Subscribe(2 * i + 1, "range", {"count": 10}, 0, {})) for i in range(20)))
        refused = []
        while len(refused) < 12:
            frame = await raw.frame_of(Error)
            refused.append(frame)
        assert {f.code for f in refused} == {ErrorCode.TOO_MANY_STREAMS}
        # the connection lives on: cancel one and it serves again
        await raw.send(encode_frame(Cancel(1)))
        await raw.send(encode_frame(Subscribe(41, "range", {"count": 2}, 2, {})))
        while True:
            frame = await raw.next_frame()
            if getattr(frame, "stream_id", None) == 41 and type(frame).__name__ == "Complete":
                break

    await with_bystander(server, attack)


async def test_a_peer_that_reads_nothing_cannot_stop_the_server_reading():
    """The server answers what it reads by writing from its reader task, but only writes that
    never wait (the rest is the writer task's): so with its socket full towards a peer that
    reads nothing, it still reads, handles that peer's CANCEL and queues the PONG."""
    server = rsnet.Server()

    @server.publisher("big")
    def big(params, ctx):
        return rsnet.from_iterable(itertools.repeat(b"x" * 65536))  # endless, synchronous

    async with running(server) as urls:
        raw = await RawClient.connect(urls["tcp"])
        (session,) = server.sessions
        await raw.send(encode_frame(Subscribe(1, "big", None, MAX_INT, {})))
        with trio.fail_after(5):
            while not session._sending:  # the writer is in a send the peer does not drain
                await trio.sleep(0.01)
        await trio.sleep(0.1)  # megabytes more: both socket buffers are full by now
        await raw.send(encode_frame(Cancel(1)) + encode_frame(Ping(7)))
        with trio.fail_after(5):
            while session.conn.stream_count:
                await trio.sleep(0.01)
        # the items already written, then the PONG: the connection still works
        assert await raw.frame_of(Pong) == Pong(7)


@pytest.mark.parametrize("flood", ["pings", "refused subscribes", "one-item streams"])
async def test_a_peer_that_asks_for_answers_and_reads_none_holds_bounded_memory_then_is_dropped(flood):
    """Frames that each want an answer (a PING its PONG, a SUBSCRIBE to an unknown name its
    ERROR, one to a one-item stream its ACCEPT, item and COMPLETE), sent as fast as the peer
    can while it reads nothing: once MAX_UNTAKEN_ANSWERS of answers wait behind the write it
    does not take, the server stops reading from it, so what it holds for the peer stays
    bounded (it grew by gigabytes a minute before); with nothing received from then on, it
    drops the peer three keepalive intervals later, and a bystander streams throughout."""
    server = demo_server(keepalive_interval=0.1)

    pings = encode_frame(Ping(7)) * 20_000  # the same one each time: quick to send

    def chunks():
        """The flood, 2,000 frames at a time (stream ids rising, as the protocol requires)."""
        for first in itertools.count(1, 4000):
            if flood == "pings":
                yield pings
            elif flood == "refused subscribes":
                name = "no such publisher " + "x" * 500
                yield b"".join(msgpack.packb([16, first + 2 * i, name, None, 1, {}]) for i in range(2000))
            else:
                yield b"".join(msgpack.packb([16, first + 2 * i, "range", {"count": 1}, 1, {}]) for i in range(2000))

    async def attack(url: str) -> None:
        with trio.fail_after(5):
            while not server.sessions:  # the bystander's
                await trio.sleep(0.01)
        bystander = set(server.sessions)
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        await sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        raw = RawClient(trio.SocketStream(sock))
        await raw.send(HELLO)
        assert isinstance(await raw.next_frame(), Welcome)
        (session,) = set(server.sessions) - bystander
        # The bound, plus the answers to one read (64 KiB of frames, each answered by at most
        # about its own size again, and a one-item stream's 40 bytes for its 20).
        bound = MAX_UNTAKEN_ANSWERS + 3 * 65536

        async def send_until_refused() -> None:
            try:
                for chunk in chunks():
                    await raw.send(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # dropped

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_until_refused)
            # Dropped within a second or two here: the socket buffers fill (the server's send
            # buffer grows to a few MB first), then three keepalive intervals pass.
            with trio.fail_after(30):
                while session in server.sessions:
                    held = session.conn.buffered + sum(map(len, session.transport._rest))
                    assert held <= bound, held  # checked as it goes: a regression fails fast
                    await trio.sleep(0.005)
            nursery.cancel_scope.cancel()
        await trio.aclose_forcefully(raw.stream)

    await with_bystander(server, attack)


async def test_a_peer_with_many_streams_that_reads_none_holds_the_connection_window_not_one_per_stream():
    """Each stream may hold a window of about 4 MiB between its publisher and the socket; a peer
    that opened max_streams of them and read nothing made the server hold them all (4 GiB, an
    outside attack found). The windows of one connection's streams now share
    DEFAULT_CONNECTION_WINDOW_BYTES (16 MiB): 64 streams of 64 KiB items take about that from
    their publishers, not 64 x 4 MiB."""
    blob = b"x" * 65536
    taken = 0

    def blobs(params, ctx):
        def items():
            nonlocal taken
            while True:
                taken += 1
                yield blob

        return rsnet.from_iterable(items())

    server = rsnet.Server()
    server.add_publisher("blobs", blobs)
    async with running(server) as urls:
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        await sock.connect(("127.0.0.1", int(urls["tcp"].rsplit(":", 1)[1])))
        raw = RawClient(trio.SocketStream(sock))
        await raw.send(HELLO)
        assert isinstance(await raw.next_frame(), Welcome)
        (session,) = server.sessions
        await raw.send(b"".join(msgpack.packb([16, 2 * i + 1, "blobs", None, 100_000, {}]) for i in range(64)))
        with trio.fail_after(10):
            while len(session._outbound) < 64:
                await trio.sleep(0.01)
        await trio.testing.wait_all_tasks_blocked(0.05)  # the server's writer waits for the peer
        # Taken from the publishers: what the server holds, plus what the kernel took into the
        # socket's send buffer (at most tcp_wmem's maximum, 4 MiB by default on Linux) and the
        # one look-ahead item each publisher fetched.
        kernel = int(pathlib.Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
        assert taken * len(blob) <= DEFAULT_CONNECTION_WINDOW_BYTES + kernel + 64 * len(blob)
        assert len(session._outbound) == 64  # all open, each with its share
        await raw.stream.aclose()


async def test_a_client_that_never_says_hello_is_timed_out():
    server = demo_server(handshake_timeout=0.2)
    async with running(server) as urls:
        raw = await RawClient.connect(urls["tcp"], handshake=False)
        frame = await raw.next_frame()
        assert isinstance(frame, ConnError) and frame.code == ErrorCode.TIMEOUT


async def test_wrong_magic_and_unsupported_version_are_refused():
    async with running(demo_server()) as urls:
        raw = await RawClient.connect(urls["tcp"], handshake=False)
        await raw.send(encode_frame(Hello("rsnet", [7, 9], {})))
        frame = await raw.next_frame()
        assert frame.code == ErrorCode.UNSUPPORTED_VERSION and frame.data == {"versions": [1]}
        raw = await RawClient.connect(urls["tcp"], handshake=False)
        await raw.send(msgpack.packb([1, "rsocket", [1], {}]))
        assert (await raw.next_frame()).code == ErrorCode.PROTOCOL_ERROR


def counting_server() -> tuple[rsnet.Server, list[object]]:
    """A demo server with a publisher ``counted`` that notes each subscription it serves."""
    server, opened = demo_server(), []

    @server.publisher("counted")
    def counted(params, ctx):
        opened.append(params)
        return rsnet.from_iterable([1, 2, 3])

    return server, opened


async def test_after_a_clients_go_away_the_server_closes_first_and_serves_nothing_more():
    """SPEC 10.2: a client that sent GO_AWAY with no stream open is answered by the server
    ending the connection: it half-closes at once (the client reads the end of the stream),
    then reads on to the client's own close, so that closing never resets the connection over
    bytes it did not read. What the client sends meanwhile is dropped: a stream opened against
    the rule is not served."""
    server, opened = counting_server()
    async with running(server) as urls:
        raw = await RawClient.connect(urls["tcp"])
        await raw.send(encode_frame(GoAway("done")))
        assert await raw.next_frame() is None  # the server's half-close
        await raw.send(encode_frame(Subscribe(1, "counted", {"n": 1}, 5, {})))
        await trio.testing.wait_all_tasks_blocked()
        assert len(server.sessions) == 1, "the server reads on to the client's close"
        await raw.stream.send_eof()
        with trio.fail_after(5):
            while server.sessions:
                await trio.sleep(0.001)
        await raw.stream.aclose()
    assert opened == []


async def test_a_client_that_says_go_away_and_never_closes_is_closed_after_the_flush_timeout(mock_clock):
    """The reading to the client's close is bounded: FLUSH_TIMEOUT after the server ended the
    connection its socket is closed, and only once (no second wait of the same length)."""
    server, opened = counting_server()
    async with running(server) as urls:
        raw = await RawClient.connect(urls["tcp"])
        await raw.send(encode_frame(GoAway("done")))
        assert await raw.next_frame() is None
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(FLUSH_TIMEOUT * 0.9)
        await trio.testing.wait_all_tasks_blocked()
        assert len(server.sessions) == 1
        mock_clock.jump(FLUSH_TIMEOUT * 0.2)
        await trio.testing.wait_all_tasks_blocked()
        assert len(server.sessions) == 0
        await raw.stream.aclose()
    assert opened == []


async def test_a_silent_client_is_dropped_by_keepalive_but_a_busy_one_is_not(autojump_clock=None):
    server = demo_server(keepalive_interval=0.1)

    @server.publisher("trickle")
    def trickle(params, ctx):
        async def items():
            for i in range(40):
                await trio.sleep(0.02)
                yield i

        return rsnet.from_async_iterable(items, nursery=ctx.nursery)

    async with running(server) as urls:
        silent = await RawClient.connect(urls["tcp"])
        # busy: a normal client whose stream takes ~8 keepalive intervals, and which
        # answers PINGs (the protocol does it): it must not be dropped
        async with rsnet.connect(urls["tcp"]) as conn:
            assert [x async for x in conn.subscribe("trickle")] == list(range(40))
        # silent: answers nothing, sends nothing: dropped after 3 intervals
        frames = []
        with trio.fail_after(2):
            while True:
                frame = await silent.next_frame()
                if frame is None:
                    break
                frames.append(frame)
        assert any(isinstance(f, ConnError) and f.code == ErrorCode.TIMEOUT for f in frames)


async def test_a_peer_that_only_reads_is_given_up_on_while_the_server_streams_to_it_flat_out():
    """SPEC 10.1 counts bytes received: a peer that subscribed with unbounded demand and then
    never sends a byte (no PING, no REQUEST) is closed with CONN_ERROR TIMEOUT after three
    intervals, however busy the server is writing to it (real time: the stream never idles,
    so a mock clock would never advance)."""
    server = demo_server(keepalive_interval=0.1)
    async with running(server) as urls:
        raw = await RawClient.connect(urls["tcp"])
        await raw.send(encode_frame(Subscribe(1, "range", {"count": 10**12}, MAX_INT, {})))
        decoder, batches, closing = FrameDecoder(1 << 24), 0, None
        with trio.fail_after(10):
            while data := await raw.stream.receive_some(1 << 20):
                for fields in decoder.frames(data):
                    if fields[0] == Batch.TYPE.value:  # read, never answered
                        batches += 1
                    elif fields[0] == ConnError.TYPE.value:
                        closing = parse_frame(fields)
        assert batches > 10, "the server was streaming when it gave up"
        assert isinstance(closing, ConnError) and closing.code == ErrorCode.TIMEOUT


async def test_a_peer_gone_while_a_write_to_it_waits_is_given_up_on_but_one_that_pings_is_not():
    """SPEC 10.1 with the server's write stuck: a peer that neither reads nor sends (a host
    gone, a partition) fills the socket buffers, so the writer waits; three keepalive
    intervals without a byte end that wait and the connection (its stream's publisher is
    cancelled), where TCP alone would wait many minutes. A peer that does not read but still
    sends (here a PING each interval) is alive, and keeps its connection and its stream."""
    stopped_by_pinger = trio.Event()
    server = demo_server(keepalive_interval=0.1)

    @server.publisher("flood")
    def flood(params, ctx):
        async def chunks():
            try:
                while True:
                    yield b"x" * 4096
                    await trio.sleep(0)
            finally:
                if params.get("who") == "pinger":
                    stopped_by_pinger.set()

        return rsnet.from_async_iterable(chunks, nursery=ctx.nursery)

    async with running(server) as urls:
        gone = await RawClient.connect(urls["tcp"])
        await gone.send(encode_frame(Subscribe(1, "flood", {}, MAX_INT, {})))
        with trio.fail_after(5):  # the buffers fill (about 4-8 MB), then three intervals pass
            while server.sessions:
                await trio.sleep(0.05)

        pinger = await RawClient.connect(urls["tcp"])
        await pinger.send(encode_frame(Subscribe(1, "flood", {"who": "pinger"}, MAX_INT, {})))
        for _ in range(20):  # 2 s, 20 intervals: its writes wait all along, it pings
            await trio.sleep(0.1)
            await pinger.send(encode_frame(Ping(0)))
        assert len(server.sessions) == 1 and not stopped_by_pinger.is_set()
        await trio.aclose_forcefully(pinger.stream)


async def test_an_idle_connection_is_kept_by_pings_on_both_sides_for_many_intervals(autojump_clock=None):
    """SPEC 10.1 on a connection with no stream and no traffic at all: each side PINGs after an
    interval without sending and the other answers, so neither gives up (three intervals of
    silence would end it); a stream afterwards works. A raw peer sees the server's PINGs."""
    server = demo_server(keepalive_interval=0.1)
    async with running(server) as urls:
        async with rsnet.connect(urls["tcp"], keepalive_interval=0.1) as conn:
            await trio.sleep(2.0)  # 20 intervals
            assert [x async for x in conn.subscribe("range", {"count": 3})] == [0, 1, 2]
        raw = await RawClient.connect(urls["tcp"])
        pings = 0
        with trio.fail_after(2.0):
            while pings < 5:  # answered, so the server keeps pinging instead of timing out
                frame = await raw.next_frame()
                assert isinstance(frame, Ping), frame
                pings += 1
                await raw.send(encode_frame(Pong(frame.token)))


async def test_a_huge_invalid_params_map_gets_a_bounded_rejection_and_the_connection_lives():
    """Issue 10 finding 4: a 0.9 MB params map of unknown keys used to produce a ~9 MB error
    message, which failed to send and took the whole connection (and a healthy stream) down."""
    import pydantic

    class Strict(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        count: int = 1

    server = demo_server()
    server.add_publisher("strict", lambda params, ctx: rsnet.range_(0, params.count), params=Strict)
    async with running(server) as urls:
        async with rsnet.connect(urls["tcp"]) as conn:
            async with conn.subscribe("range", {"count": 10**9}, prefetch=4) as healthy:
                assert await healthy.__anext__() == 0
                huge = {f"k{i:05d}": i for i in range(80_000)}  # ~0.8 MB, within max_frame_size
                with pytest.raises(rsnet.StreamError) as rejected:
                    async for _ in conn.subscribe("strict", huge):
                        pass
                assert rejected.value.code == ErrorCode.REJECTED
                assert len(rejected.value.message) < 4096
                assert "and 79990 more" in rejected.value.message
                assert len(rejected.value.data) == 10
                assert all(len(entry["field"]) <= 220 for entry in rejected.value.data)
                assert [x async for x in conn.subscribe("strict", {"count": 3})] == [0, 1, 2]
                assert await healthy.__anext__() == 1  # the other stream never noticed


async def test_a_connection_beyond_max_connections_is_refused_with_going_away():
    """Resource budget: connections (all listeners together). One more than the limit gets
    CONN_ERROR GOING_AWAY ("try again later") at once; once a connection ends, a new one is served."""
    server = demo_server(max_connections=2)
    async with running(server) as urls:
        async with rsnet.connect(urls["tcp"]) as first, rsnet.connect(urls["ws"]) as second:
            for url in (urls["tcp"], urls["ws"]):
                with pytest.raises(rsnet.HandshakeError) as refused:
                    async with rsnet.connect(url):
                        pass
                assert refused.value.code == ErrorCode.GOING_AWAY
                assert "limit of 2 connections" in str(refused.value)
            assert len(server.sessions) == 2
            assert [x async for x in first.subscribe("range", {"count": 2})] == [0, 1]
            await second.aclose()
            with trio.fail_after(5):
                while len(server.sessions) > 1:
                    await trio.sleep(0.01)
            async with rsnet.connect(urls["tcp"]) as third:
                assert [x async for x in third.subscribe("range", {"count": 1})] == [0]


async def test_a_burst_of_costly_openings_lets_the_other_tasks_run_between_slices():
    """One peer's 50 SUBSCRIBEs in one write, each opening a publisher that costs 2 ms to open
    (a broker's pattern over many topics, say): the reader lets the process's other tasks run
    after about OPENING_SLICE of openings, where it used to run all 50 (100 ms) in one go."""
    server = rsnet.Server(max_streams=64)
    opened: list[int] = []

    @server.publisher("costly")
    def costly(params, ctx):
        time.sleep(0.002)  # work that holds the event loop, as a costly opening does
        opened.append(1)
        return rsnet.just(1)

    seen: list[int] = []  # how many openings were done each time another task ran

    async def bystander(task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        while len(opened) < 50:
            seen.append(len(opened))
            await trio.lowlevel.checkpoint()

    async with running(server) as urls:
        client = await RawClient.connect(urls["tcp"])
        async with trio.open_nursery() as nursery:
            await nursery.start(bystander)
            await client.send(b"".join(encode_frame(Subscribe(2 * n + 1, "costly", {}, 1, {})) for n in range(50)))
        assert any(0 < count < 50 for count in seen)  # it ran in the middle of the burst
        # Slices of 3 openings (the third passes 5 ms); trio runs each batch of tasks in a random
        # order, so the bystander may see two slices between its turns, never more.
        assert max(b - a for a, b in itertools.pairwise([0, *sorted(set(seen)), 50])) <= 6


class _HalfCloseWaits(TcpTransport):
    """A TCP transport whose half-close waits for ever, as a WebSocket close frame does behind
    answers that a peer reading nothing has not taken (an attack round found it)."""

    async def send_eof(self) -> None:
        await trio.sleep_forever()


async def test_a_connection_whose_half_close_waits_still_ends_within_the_flush_timeout(mock_clock):
    """The end of a connection is bounded from its start, the half-close included: a peer that
    said GO_AWAY and takes nothing could hold the connection, its slot and the server's
    shutdown for as long as it liked (the writer waited in the half-close, with no deadline
    set yet, and the reader read on)."""
    ours, theirs = trio.socket.socketpair()
    _, server_conn = opened_pair()
    session = Session(_HalfCloseWaits(trio.SocketStream(ours), "peer"), server_conn)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        peer = trio.SocketStream(theirs)
        await peer.send_all(encode_frame(GoAway("done")))  # no stream open: the server ends it
        await trio.testing.wait_all_tasks_blocked()
        assert not session.closed, "the server waits in its half-close"
        mock_clock.jump(FLUSH_TIMEOUT)
        await trio.testing.wait_all_tasks_blocked()
        assert session.closed
        await peer.aclose()
