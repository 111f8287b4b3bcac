"""The CLI and real process deaths: clients and servers in other processes, killed mid-stream."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import trio

import rsnet

from .support import endless_server, running

RSNET = [sys.executable, "-m", "rsnet.cli"]


class Process:
    """A child process whose output is read line by line; killed at the end no matter what."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffers = {"stdout": b"", "stderr": b""}

    @classmethod
    async def start(cls, *args: str) -> Process:
        process = await trio.lowlevel.open_process([*RSNET, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return cls(process)

    async def line(self, stream: str = "stdout", timeout: float = 10.0) -> str:
        pipe = getattr(self.process, stream)
        with trio.fail_after(timeout):
            while b"\n" not in self._buffers[stream]:
                data = await pipe.receive_some(65536)
                if not data:
                    raise EOFError(f"{stream} closed; stderr so far: {self._buffers['stderr']!r}")
                self._buffers[stream] += data
        line, _, rest = self._buffers[stream].partition(b"\n")
        self._buffers[stream] = rest
        return line.decode()

    async def rest(self, stream: str, timeout: float = 10.0) -> str:
        pipe = getattr(self.process, stream)
        with trio.fail_after(timeout):
            while data := await pipe.receive_some(65536):
                self._buffers[stream] += data
        text, self._buffers[stream] = self._buffers[stream].decode(), b""
        return text

    async def wait(self, timeout: float = 10.0) -> int:
        with trio.fail_after(timeout):
            return await self.process.wait()

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)


async def start_demo_server() -> tuple[Process, str]:
    server = await Process.start("serve", "--demo", "--tcp", "127.0.0.1:0")
    while True:
        line = await server.line("stderr")
        if "serving tcp://" in line:
            return server, line.split("serving ", 1)[1].strip()


async def run_sub(*args: str) -> tuple[int, list, str]:
    process = await Process.start("sub", *args)
    try:
        out = await process.rest("stdout")
        err = await process.rest("stderr")
        code = await process.wait()
    finally:
        process.kill()
    return code, [json.loads(line) for line in out.splitlines()], err


async def test_cli_serve_and_sub_print_json_lines_and_exit_codes():
    server, url = await start_demo_server()
    try:
        code, items, _ = await run_sub(url, "range", "-p", "start=3", "-p", "count=4")
        assert (code, items) == (0, [3, 4, 5, 6])

        code, items, err = await run_sub(url, "fail", "-p", "n=2")
        assert (code, items) == (1, [0, 1])
        assert "APPLICATION_ERROR" in err and "failed after 2 items" in err

        code, items, _ = await run_sub(url, "ticks", "-p", "interval=0.01", "--count", "3")
        assert (code, items) == (0, [0, 1, 2])

        code, _, err = await run_sub(url, "range", "-p", "count=-1")
        assert code == 1 and "REJECTED" in err and "count" in err

        code, _, err = await run_sub(url, "nothing-here")
        assert code == 1 and "UNKNOWN_PUBLISHER" in err
    finally:
        server.kill()
        await server.wait()


async def test_sub_to_an_unreachable_server_fails_cleanly():
    code, _, err = await run_sub("tcp://127.0.0.1:1", "range")
    assert code == 1 and "cannot connect" in err


async def test_a_killed_client_process_cancels_its_hosted_publisher_within_a_second():
    server, cancelled = endless_server(pause=0.001)

    async with running(server) as urls:
        client = await Process.start("sub", urls["tcp"], "endless", "--prefetch", "4")
        try:
            for _ in range(3):
                await client.line()
            client.kill()
            with trio.fail_after(1):
                await cancelled.wait()
        finally:
            client.kill()
            await client.wait()
        with trio.fail_after(1):
            while server.sessions:
                await trio.sleep(0.01)


async def test_a_killed_server_process_fails_every_subscription_with_connection_lost():
    server, url = await start_demo_server()
    errors = []
    try:
        async with rsnet.connect(url) as conn:

            async def consume():
                try:
                    async for _ in conn.subscribe("ticks", {"interval": 0.01}):
                        pass
                except rsnet.ConnectionLost as lost:
                    errors.append(lost)

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(consume)
                await trio.sleep(0.2)
                server.kill()
                with trio.fail_after(1):
                    while len(errors) < 3:
                        await trio.sleep(0.01)
    finally:
        server.kill()
        await server.wait()
    assert len(errors) == 3


async def test_serve_shuts_down_gracefully_on_sigterm():
    server, _url = await start_demo_server()
    try:
        server.process.send_signal(signal.SIGTERM)
        assert await server.wait() == 0
    finally:
        server.kill()
