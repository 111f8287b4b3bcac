"""An embedded broker on 127.0.0.1 for tests."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

import rsnet
from rsnet.broker.broker import Broker
from rsnet.broker.client import publish
from rsnet.broker.codes import BrokerCode
from rsnet.protocol import FrameDecoder, Hello, Welcome, encode_frame, parse_frame


@asynccontextmanager
async def broker_serving(broker: Broker, **server_settings: Any) -> AsyncIterator[tuple[str, rsnet.Server]]:
    """Run ``broker`` behind an rsnet server; yields its tcp:// URL and the server."""
    server = rsnet.Server(host=broker, **server_settings)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        port = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        try:
            yield f"tcp://127.0.0.1:{port}", server
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def broker_running(broker: Broker, **server_settings: Any) -> AsyncIterator[str]:
    """Run ``broker`` behind an rsnet server; yields its tcp:// URL."""
    async with broker_serving(broker, **server_settings) as (url, _):
        yield url


async def check_refused_until_unclean(data_dir: pathlib.Path, topic: str, problem: str, **settings: Any) -> None:
    """A broker on ``data_dir`` starts and serves, but refuses ``topic``, whose stored log it
    cannot open, with STORAGE_ERROR saying ``problem`` (a regular expression) and how to go
    on; ``$topics`` marks it unavailable; another topic is served all the while."""
    broker = Broker(data_dir=data_dir, **settings)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        for _ in range(2):  # and again: it is not opened meanwhile
            try:
                await publish(conn, topic, ["refused"], producer="refused")
            except rsnet.StreamError as refused:
                assert refused.code == BrokerCode.STORAGE_ERROR, refused
                assert re.search(problem, refused.message) and "unclean_recovery = true" in refused.message, refused
            else:
                raise AssertionError(f"{topic} was not refused")
        (listed,) = [item async for item in conn.subscribe("$topics", {"match": topic})]
        assert re.search(problem, listed["unavailable"]), listed
        await publish(conn, f"not-{topic}", ["served"], producer="p")


async def take(conn, name: str, count: int, /, **params: Any) -> list[dict]:
    """The first ``count`` items of a subscription to ``name``."""
    records = []
    async with conn.subscribe(name, params) as items:
        async for record in items:
            records.append(record)
            if len(records) == count:
                break
    return records


async def start_daemon(*args: str, announces: bytes, **options: Any) -> tuple[trio.Process, str]:
    """Start ``rsnet broker *args`` in a child process (``options`` go to ``subprocess.Popen``);
    return it and what it printed on stderr up to the line containing ``announces``."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "rsnet.cli", "broker", *args], stderr=subprocess.PIPE, **options
    )
    printed = b""
    with trio.fail_after(20):
        while announces not in printed:
            data = await process.stderr.receive_some(4096)
            assert data, f"the broker exited: {printed.decode()}"
            printed += data
    return process, printed.decode()


def served_url(printed: str) -> str:
    """The URL of the first "serving ..." line the daemon printed."""
    return printed.split("serving ", 1)[1].split()[0]


class RawClient:
    """A TCP client that speaks the wire protocol by hand (protocol/SPEC.md): it sends what a
    test tells it, whatever a well-behaved client would, and reads frames."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(1 << 24)
        self.frames: list[Any] = []

    @classmethod
    async def connect(cls, url: str) -> RawClient:
        port = int(url.rsplit(":", 1)[1])
        client = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await client.send(Hello("rsnet", [1], {}))
        assert isinstance(await client.next_frame(), Welcome)
        return client

    async def send(self, *frames: Any) -> None:
        await self.stream.send_all(b"".join(encode_frame(frame) for frame in frames))

    async def next_frame(self, timeout: float = 5.0) -> Any:
        with trio.fail_after(timeout):
            while not self.frames:
                data = await self.stream.receive_some(65536)
                if not data:
                    return None  # the server closed the connection
                self.frames.extend(parse_frame(fields) for fields in self.decoder.frames(data))
        return self.frames.pop(0)

    async def frame_of(self, kind: type, stream_id: int, timeout: float = 5.0) -> Any:
        """The next frame of type ``kind`` on ``stream_id``, skipping others."""
        while True:
            frame = await self.next_frame(timeout)
            if frame is None or (isinstance(frame, kind) and frame.stream_id == stream_id):
                return frame

    async def aclose(self) -> None:
        await self.stream.aclose()
