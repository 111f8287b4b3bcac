"""The Python client's rate on the same stream: python python_client.py URL COUNT PREFETCH."""

import sys
import time

import trio

import rsnet


async def main(url: str, count: int, prefetch: int) -> None:
    async with rsnet.connect(url) as conn:

        def stream(n: int):
            try:  # the params mapping of issue 14, else the keyword form it replaces
                return conn.subscribe("items", {"count": n, "size": 16}, prefetch=prefetch)
            except TypeError:
                return conn.subscribe("items", {"count": n, "size": 16}, prefetch=prefetch)

        async for _ in stream(count // 5):  # warm-up
            pass
        started = time.perf_counter()
        received = 0
        async for _ in stream(count):
            received += 1
        elapsed = time.perf_counter() - started
    assert received == count
    print(f"{count / elapsed:.0f}")


trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
