"""The ceiling: the least a trio program must do to move msgpack frames between two processes.

It speaks just enough of rsnet's frame layout (protocol/SPEC.md section 4) to serve the same
scenarios: SUBSCRIBE ``[16, id, name, params, demand, {}]``, REQUEST ``[19, id, n]``, and the
answers ACCEPT, NEXT ``[21, id, item]`` and COMPLETE. There is no handshake, no validation, no
Reactive Streams object, no per-stream state beyond two counters. Each item is packed into a
complete frame by one reused ``Packer(autoreset=False)`` call (a real server's items differ,
so some per-item encoding is irreducible; repeating one pre-encoded frame with ``frame * k``
measured ~10M items/s, which is memcpy, not a yardstick), writes are batched up to
:data:`CHUNK` bytes, and the client lets msgpack's C ``Unpacker`` find the frames. The client
grants all its demand up front (one big request) except in stop-and-wait, which sends
REQUEST(1) per item.

WebSocket: websockets' sans-I/O core, driven directly, many frames per message. No rsnet code is
imported: this is the yardstick.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
import trio
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from .common import LIVE_CONCURRENCY, Clock, LiveCount, Pacer, payload, raise_fd_limit

SUBSCRIBE, REQUEST, ACCEPT, NEXT, COMPLETE = 16, 19, 18, 21, 23
CHUNK = 65536
"""Bytes per write on TCP, and per message on WebSocket (a write then carries many)."""
RECEIVE = 65536
WRITE_MESSAGES = 4
"""WebSocket messages per socket write."""

packb = msgpack.Packer().pack


# -- transports: bytes over TCP, or whole-frame binary messages over WebSocket ---------------------


class Raw:
    """TCP: ``send`` joins the chunks into one write."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    async def receive(self) -> bytes:
        return await self.stream.receive_some(RECEIVE)

    async def send(self, chunks: list[bytes]) -> None:
        await self.stream.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))


class Ws(Raw):
    """WebSocket through websockets' sans-I/O core: one binary message per chunk."""

    def __init__(self, stream: trio.abc.Stream, protocol: ServerProtocol | ClientProtocol) -> None:
        super().__init__(stream)
        self.protocol = protocol
        self.messages: list[bytes] = []

    async def receive(self) -> bytes:
        protocol = self.protocol
        while not self.messages:
            data = await self.stream.receive_some(RECEIVE)
            if not data:
                return b""
            protocol.receive_data(data)
            for event in protocol.events_received():
                if isinstance(event, Frame) and event.opcode is Opcode.BINARY:
                    self.messages.append(event.data)
            pending = protocol.data_to_send()  # pongs, close replies
            if pending:
                await self.stream.send_all(b"".join(pending))
        return self.messages.pop(0)

    async def send(self, chunks: list[bytes]) -> None:
        for i in range(0, len(chunks), WRITE_MESSAGES):
            for chunk in chunks[i : i + WRITE_MESSAGES]:
                self.protocol.send_binary(chunk)
            await self.stream.send_all(b"".join(self.protocol.data_to_send()))


async def _handshake(stream: trio.abc.Stream, protocol: Any, want: type) -> Any:
    while True:
        pending = protocol.data_to_send()
        if pending:
            await stream.send_all(b"".join(pending))
        for event in protocol.events_received():
            if isinstance(event, want):
                return event
        data = await stream.receive_some(RECEIVE)
        if not data:
            raise ConnectionError("closed during the WebSocket handshake")
        protocol.receive_data(data)


async def accept_ws(stream: trio.abc.Stream) -> Ws:
    protocol = ServerProtocol(max_size=1 << 24)
    request = await _handshake(stream, protocol, Request)
    protocol.send_response(protocol.accept(request))
    await stream.send_all(b"".join(protocol.data_to_send()))
    return Ws(stream, protocol)


async def connect(transport: str, port: int) -> Raw:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    if transport == "tcp":
        return Raw(stream)
    protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/"), max_size=1 << 24)
    protocol.send_request(protocol.connect())
    await _handshake(stream, protocol, Response)
    return Ws(stream, protocol)


# -- server ----------------------------------------------------------------------------------------


async def serve_connection(conn: Raw) -> None:
    """Answer SUBSCRIBE and REQUEST frames; write everything sendable before reading again."""
    unpacker = msgpack.Unpacker()
    streams: dict[int, list[Any]] = {}  # id -> [remaining, demand, item]
    packer = msgpack.Packer(autoreset=False)
    pack = packer.pack
    ready: dict[int, list[Any]] = {}  # streams with demand and items left
    out: list[bytes] = []
    while True:
        data = await conn.receive()
        if not data:
            return
        unpacker.feed(data)
        for frame in unpacker:
            kind, stream_id = frame[0], frame[1]
            if kind == SUBSCRIBE:
                params = frame[3]
                state = [params["count"], frame[4], payload(params["size"])]
                streams[stream_id] = state
                out.append(packb([ACCEPT, stream_id, {}]))
            elif kind == REQUEST and stream_id in streams:
                state = streams[stream_id]
                state[1] += frame[2]
            else:
                continue
            if state[1] > 0:
                ready[stream_id] = state
        # Pre-framed items: k copies of the stream's NEXT frame per chunk.
        pending = sum(map(len, out))
        while ready:
            for stream_id, state in list(ready.items()):
                remaining, demand, item = state
                k = min(remaining, demand, max(1, (CHUNK - pending) // (len(item) + 4)))
                for _ in range(k):
                    pack([NEXT, stream_id, item])
                frames = packer.bytes()
                packer.reset()
                out.append(frames)
                pending += len(frames)
                state[0] -= k
                state[1] -= k
                if not state[0]:
                    out.append(packb([COMPLETE, stream_id]))
                    del streams[stream_id], ready[stream_id]
                elif not state[1]:
                    del ready[stream_id]
                if pending >= CHUNK:
                    await conn.send([b"".join(out)])
                    out, pending = [], 0
        if out:
            await conn.send([b"".join(out)])
            out = []


def serve(transport: str, ready: Any) -> None:
    async def main() -> None:
        async def handle(stream: trio.SocketStream) -> None:
            try:
                conn = await accept_ws(stream) if transport == "ws" else Raw(stream)
                await serve_connection(conn)
            except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
                pass
            finally:
                await trio.aclose_forcefully(stream)

        raise_fd_limit()
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=4096)
        ready(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(handle, listeners)

    trio.run(main)


# -- client ----------------------------------------------------------------------------------------


def subscribe_frame(stream_id: int, count: int, size: int, demand: int) -> bytes:
    return packb([SUBSCRIBE, stream_id, "items", {"count": count, "size": size}, demand, {}])


async def receive_stream(conn: Raw, unpacker: msgpack.Unpacker, pace: float = 0) -> int:
    """Count NEXT frames until COMPLETE (one stream open); sleep to keep to ``pace`` items/s."""
    pacer = Pacer(pace)
    count = 0
    while True:
        data = await conn.receive()
        if not data:
            raise ConnectionError("the server closed mid-stream")
        unpacker.feed(data)
        for frame in unpacker:
            if frame[0] == NEXT:
                item = frame[2]  # noqa: F841 (a consumer would use it)
                count += 1
            elif frame[0] == COMPLETE:
                return count
        if pace:
            await trio.sleep(pacer.delay(count - count % 1000))


async def client(kind: str, transport: str, port: int, params: dict[str, Any]) -> dict[str, Any]:
    size = params["size"]
    if kind == "many_connections":
        return await many_connections(transport, port, params)
    if kind == "live_connections":
        return await live_connections(transport, port, params)
    conn = await connect(transport, port)
    unpacker = msgpack.Unpacker()
    if kind == "stream":
        count = params["count"]
        clock = Clock()
        await conn.send([subscribe_frame(1, count, size, count)])  # one big request
        received = await receive_stream(conn, unpacker, params.get("pace", 0))
        return {"items": received, **clock.elapsed()}
    if kind == "stop_and_wait":
        count = params["count"]
        clock = Clock()
        await conn.send([subscribe_frame(1, count, size, 1)])
        received = 0
        request_one = packb([REQUEST, 1, 1])
        while True:
            data = await conn.receive()
            unpacker.feed(data)
            done = False
            for frame in unpacker:
                if frame[0] == NEXT:
                    received += 1
                    if received < count:
                        await conn.send([request_one])
                elif frame[0] == COMPLETE:
                    done = True
            if done:
                return {"items": received, **clock.elapsed()}
    if kind == "first_item":
        latencies = []
        for i in range(params["iterations"]):
            stream_id = 2 * i + 1
            start = time.perf_counter()
            await conn.send([subscribe_frame(stream_id, 1, size, 1)])
            first = None
            while True:
                unpacker.feed(await conn.receive())
                for frame in unpacker:
                    if frame[0] == NEXT and first is None:
                        first = time.perf_counter()
                    elif frame[0] == COMPLETE:
                        break
                else:
                    continue
                break
            latencies.append((first - start) * 1e6)
        return {"latencies_us": latencies}
    if kind == "first_item_two_tasks":
        return await first_item_two_tasks(conn, unpacker, params["iterations"], size)
    if kind == "many_streams":
        streams, items = params["streams"], params["items"]
        clock = Clock()
        await conn.send([b"".join(subscribe_frame(2 * i + 1, items, size, items) for i in range(streams))])
        received = completed = 0
        while completed < streams:
            unpacker.feed(await conn.receive())
            for frame in unpacker:
                if frame[0] == NEXT:
                    received += 1
                elif frame[0] == COMPLETE:
                    completed += 1
        return {"streams": streams, "items": received, **clock.elapsed()}
    raise ValueError(f"unknown kind {kind!r}")


async def first_item_two_tasks(conn: Raw, unpacker: msgpack.Unpacker, iterations: int, size: int) -> dict[str, Any]:
    """``first_item`` as a client that shares its connection between streams must do it: a
    reader task takes every frame and hands a stream's items to the task consuming it, which
    waits for them. The reader lets the task it woke run before it reads again (two yields: trio
    runs a batch in random order), as rsnet's does. Not a benchmark scenario: the round trip's
    legs show what this hand-over costs any such client (``python -m benchmarks round-trip``)."""
    streams: dict[int, list[Any]] = {}  # id -> [items, done, the waiting consumer's event]
    woke = False

    async def reader() -> None:
        nonlocal woke
        while True:
            data = await conn.receive()
            if not data:
                return
            unpacker.feed(data)
            for frame in unpacker:
                stream = streams.get(frame[1])
                if stream is None:
                    continue
                if frame[0] == NEXT:
                    stream[0].append(frame[2])
                elif frame[0] == COMPLETE:
                    stream[1] = True
                if stream[2] is not None:
                    stream[2].set()
                    stream[2], woke = None, True
            if woke:
                woke = False
                await trio.lowlevel.cancel_shielded_checkpoint()
                await trio.lowlevel.cancel_shielded_checkpoint()

    latencies = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        for i in range(iterations):
            stream_id = 2 * i + 1
            start = time.perf_counter()
            stream = streams[stream_id] = [[], False, None]
            await conn.send([subscribe_frame(stream_id, 1, size, 1)])
            first = None
            while True:
                if stream[0]:
                    stream[0].pop()
                    if first is None:
                        first = time.perf_counter()
                elif stream[1]:
                    break
                else:
                    stream[2] = wakeup = trio.Event()
                    await wakeup.wait()
            del streams[stream_id]
            latencies.append((first - start) * 1e6)
        nursery.cancel_scope.cancel()
    return {"latencies_us": latencies}


async def many_connections(transport: str, port: int, params: dict[str, Any]) -> dict[str, Any]:
    connections, items, size = params["connections"], params["items"], params["size"]
    received = 0

    async def one() -> None:
        nonlocal received
        conn = await connect(transport, port)
        try:
            await conn.send([subscribe_frame(1, items, size, items)])
            count = await receive_stream(conn, msgpack.Unpacker())
            received += count  # not `received += await ...`: that reads `received` before awaiting
        finally:
            await trio.aclose_forcefully(conn.stream)

    clock = Clock()
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(one)
    return {"streams": connections, "items": received, **clock.elapsed()}


def run_client(kind: str, transport: str, port: int, params: dict[str, Any], deadline: float) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        raise_fd_limit()
        with trio.fail_after(deadline):
            return await client(kind, transport, port, {**params, "deadline": deadline})

    return trio.run(main)


async def live_connections(transport: str, port: int, params: dict[str, Any]) -> dict[str, Any]:
    """As rsnet's: each connection subscribes with demand 1; once every one has its first item,
    the server's memory is read; then each requests the rest and reads to COMPLETE."""
    items, size = params["items"], params["size"]
    live = LiveCount(params)
    handshakes = trio.Semaphore(LIVE_CONCURRENCY)
    received = 0

    async def one() -> None:
        nonlocal received
        waiting = True
        await handshakes.acquire()
        try:
            conn = await connect(transport, port)
            try:
                await conn.send([subscribe_frame(1, items, size, 1)])
                unpacker = msgpack.Unpacker()
                count, done = 0, False
                while not count:
                    data = await conn.receive()
                    if not data:
                        raise ConnectionError("the server closed before the first item")
                    unpacker.feed(data)
                    for frame in unpacker:
                        count += frame[0] == NEXT
                        done = done or frame[0] == COMPLETE
                waiting = False
                handshakes.release()
                live.first_item()
                await live.everyone.wait()
                if not done:
                    await conn.send([packb([REQUEST, 1, items])])
                    count += await receive_stream(conn, unpacker)
                received += count
            finally:
                await trio.aclose_forcefully(conn.stream)
        except (OSError, trio.BrokenResourceError) as error:  # counted and reported
            live.failed_connection(f"{type(error).__name__}: {error}", served=not waiting)
        finally:
            if waiting:
                handshakes.release()

    with trio.move_on_after(live.give_up_s) as giving_up:
        async with trio.open_nursery() as nursery:
            for _ in range(params["connections"]):
                nursery.start_soon(one)
    if giving_up.cancelled_caught:
        live.gave_up()
    return live.report(received)
