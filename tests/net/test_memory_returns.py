"""What a burst of peers allocates is given back when they leave (issue 10 finding 4): after
1,000 idle connections close, and after a burst of huge invalid params maps, the Python heap is
back near where it started (measured with tracemalloc, which sees every object rsnet allocates;
the process's RSS may stay higher, as the allocator keeps freed pages for reuse)."""

from __future__ import annotations

import gc
import tracemalloc

import pydantic
import pytest
import trio

import rsnet

from .support import demo_server, running

SLACK = 2 * 1024 * 1024  # bytes: interned strings, trio's lazily pruned timer heap, caches


class Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    count: int = 1


def _heap() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


@pytest.fixture
def traced():
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


async def test_idle_connections_give_their_memory_back(traced):
    """Two rounds of 600 idle connections (TCP and WebSocket), each round closed before the next:
    after the second, the heap is where the first left it. (The first round warms what grows
    once and is kept: trio's timer heap, which it prunes lazily, interned strings, caches.)"""
    server = demo_server()

    async def round_of(url_of, count: int) -> int:
        """Open ``count`` idle connections, return the heap with them open, then close them."""
        async with trio.open_nursery() as nursery:
            opened, release = [0], trio.Event()

            async def idle(url: str) -> None:
                async with rsnet.connect(url):
                    opened[0] += 1
                    await release.wait()

            for i in range(count):
                nursery.start_soon(idle, url_of(i))
            with trio.fail_after(60):
                while opened[0] < count:
                    await trio.sleep(0.05)
            during = _heap()
            release.set()
        with trio.fail_after(10):
            while server.sessions:
                await trio.sleep(0.01)
        await trio.sleep(0.1)  # the handlers' last steps (closing their sockets)
        return during

    async with running(server) as urls:
        url_of = lambda i: urls["tcp" if i % 2 else "ws"]  # noqa: E731 - a one-line chooser
        await round_of(url_of, 600)
        baseline = _heap()
        during = await round_of(url_of, 600)
        after = _heap()
    assert during - baseline > 5 * SLACK, "the connections really were allocated"
    assert after - baseline < SLACK, f"{(after - baseline) / 1e6:.1f} MB stayed after the connections closed"


async def test_a_burst_of_huge_invalid_params_gives_its_memory_back(traced):
    """24 invalid 0.8 MB params maps (the issue's burst took a server from 39 to 857 MB, and
    657 MB stayed): each is answered with a bounded rejection, and once the connection that
    sent them is gone the heap is back to where it was (a connection's buffers grow to its
    largest frame, at most max_frame_size, and go with it)."""
    server = demo_server()
    server.add_publisher("strict", lambda params, ctx: rsnet.range_(0, params.count), params=Strict)
    huge = {f"k{i:05d}": i for i in range(80_000)}

    async def burst(url: str, times: int) -> None:
        async with rsnet.connect(url) as conn:
            for _ in range(times):
                with pytest.raises(rsnet.StreamError):
                    async for _ in conn.subscribe("strict", huge):
                        pass
            assert [x async for x in conn.subscribe("strict", {"count": 2})] == [0, 1]

    async with running(server) as urls:
        # First-use allocations are not a leak: among them, the table of interned strings
        # (msgpack interns map keys) grows to the largest map seen and keeps that capacity.
        await burst(urls["tcp"], 3)
        with trio.fail_after(10):
            while server.sessions:
                await trio.sleep(0.01)
        baseline = _heap()
        await burst(urls["tcp"], 24)
        with trio.fail_after(10):
            while server.sessions:
                await trio.sleep(0.01)
        after = _heap()
    assert after - baseline < SLACK, f"{(after - baseline) / 1e6:.1f} MB stayed after the burst"
