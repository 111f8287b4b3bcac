"""Runs one measurement: a fresh server process, a separate client process, both bounded in time.

Each process is started in its own session (process group) and killed with its whole group
when the measurement ends, fails or times out, and at interpreter exit; and as its stdin is a
pipe from this process, it exits by itself if the suite is killed outright (see
:mod:`benchmarks.worker`): nothing outlives the suite. Only 127.0.0.1 is used. While the
client runs, a sampler thread reads the resident set size (and CPU time) of both processes
from ``/proc`` every :data:`SAMPLE_INTERVAL` seconds.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

SAMPLE_INTERVAL = 0.05
READY_TIMEOUT = 20.0
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_live: set[Process] = set()


class MeasurementError(RuntimeError):
    """A process failed, answered nonsense, or ran out of time; the message says which."""


class Process:
    """A worker process (``python -m benchmarks.worker SPEC``) whose output lines are collected."""

    def __init__(self, spec: dict[str, Any], label: str, env: dict[str, str] | None = None) -> None:
        self.label = label
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.worker", json.dumps({**spec, "exit_with_parent": True})],
            cwd=ROOT,
            stdin=subprocess.PIPE,  # never written: its end of file tells the worker we are gone
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        _live.add(self)
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read_stdout(self) -> None:
        for line in self.popen.stdout:  # type: ignore[union-attr]
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _read_stderr(self) -> None:
        for line in self.popen.stderr:  # type: ignore[union-attr]
            self.stderr.append(line.rstrip("\n"))
            del self.stderr[:-40]

    def wait_line(self, prefix: str, timeout: float) -> str:
        """The rest of the first stdout line starting with ``prefix``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MeasurementError(f"{self.label}: no {prefix.strip()} within {timeout:.0f} s{self._tail()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.popen.wait()
                time.sleep(0.05)  # let the stderr reader catch up
                raise MeasurementError(
                    f"{self.label}: exited {self.popen.returncode} before {prefix.strip()}{self._tail()}"
                )
            if line.startswith(prefix):
                return line[len(prefix) :]

    def _tail(self) -> str:
        tail = [line for line in self.stderr if line.strip()][-6:]
        return (": " + " | ".join(tail)) if tail else ""

    def kill(self) -> None:
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        _live.discard(self)


def kill_all() -> None:
    """Kill every worker still running (at exit, on Ctrl-C)."""
    for process in list(_live):
        process.kill()


atexit.register(kill_all)


def proc_sample(pid: int) -> tuple[float, float] | None:
    """(RSS in MiB, CPU seconds) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * PAGE / 2**20
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class Sampler:
    """Samples RSS of the named processes every :data:`SAMPLE_INTERVAL` s until stopped."""

    pids: dict[str, int]
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # name -> [(t, MiB)]
    cpu: dict[str, list[float]] = field(default_factory=dict)  # name -> [first, last] CPU s

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._start = time.monotonic()
        for name in self.pids:
            self.samples[name] = []
        self._take()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _take(self) -> None:
        now = time.monotonic() - self._start
        for name, pid in self.pids.items():
            sample = proc_sample(pid)
            if sample is not None:
                self.samples[name].append((round(now, 3), round(sample[0], 2)))
                self.cpu.setdefault(name, [sample[1], sample[1]])[1] = sample[1]

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL):
            self._take()

    def stop(self) -> None:
        self._take()
        self._stop.set()
        self._thread.join()


@dataclass
class Measurement:
    result: dict[str, Any]
    rss: dict[str, list[tuple[float, float]]]
    server_cpu_s: float
    wall_s: float


def measure(
    system: str,
    transport: str,
    kind: str,
    params: dict[str, Any],
    timeout: float,
    server_params: dict[str, Any] | None = None,
    profile: str | None = None,
    profile_rate: int = 250,
) -> Measurement:
    """Start ``system``'s server, run one client measurement against it, kill both.

    ``server_params`` go to the system's ``serve`` as keyword arguments; a server that needs
    disk space (a durable broker) finds a fresh scratch directory in ``$RSNET_BENCH_SCRATCH``,
    removed afterwards. The client learns the server's pid and scratch directory (``server_pid``,
    ``server_scratch`` in its spec: the connections-at-scale kind reads the server's memory).
    With ``profile`` (a path), ``py-spy`` records the server (``profile_rate`` samples/s) while
    the client runs and writes a flame graph there. Raises :class:`MeasurementError` on failure or when ``timeout``
    (seconds, client run) expires.
    """
    started = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="rsnet-bench-")
    server = Process(
        {"system": system, "role": "server", "transport": transport, "server": server_params or {}},
        f"{system} server",
        env={"RSNET_BENCH_SCRATCH": scratch},
    )
    client: Process | None = None
    profiler: Profiler | None = None
    try:
        ready = server.wait_line("READY ", READY_TIMEOUT).split()
        port = int(ready[0])
        server_pid = int(ready[1]) if len(ready) > 1 else server.pid  # nats-server: the worker's child
        if profile is not None:
            profiler = Profiler(server_pid, profile, profile_rate)
        client = Process(
            {
                "system": system,
                "role": "client",
                "transport": transport,
                "kind": kind,
                "port": port,
                "params": params,
                "deadline": max(1.0, timeout - 2),
                "server_pid": server_pid,
                "server_scratch": scratch,
            },
            f"{system} client",
        )
        sampler = Sampler({"server": server_pid, "client": client.pid})
        try:
            result = json.loads(client.wait_line("RESULT ", timeout))
        finally:
            sampler.stop()
            if profiler is not None:
                profiler.stop()
        if server.popen.poll() is not None:
            raise MeasurementError(f"{system} server died during the run{server._tail()}")
        server_cpu = sampler.cpu.get("server", [0.0, 0.0])
        return Measurement(result, sampler.samples, server_cpu[1] - server_cpu[0], time.monotonic() - started)
    finally:
        if profiler is not None:
            profiler.stop()
        if client is not None:
            client.kill()
        server.kill()
        shutil.rmtree(scratch, ignore_errors=True)


class Profiler:
    """``py-spy record`` attached to a running server process, writing a flame graph (SVG).

    Started once the server listens and stopped (SIGINT: py-spy then writes its output) when
    the client has its result, so the graph shows the measured part, not start-up. It samples
    without pausing the server (``--nonblocking``): pausing it 250 times a second cost the
    1,000-connection scenario a third of its speed, reading a stack while it changes costs a
    few odd samples.
    """

    def __init__(self, pid: int, output: str, rate: int = 250) -> None:
        self.output = output
        self.popen: subprocess.Popen[bytes] | None = subprocess.Popen(
            [
                py_spy(),
                "record",
                "--pid",
                str(pid),
                "--output",
                output,
                "--format",
                "flamegraph",
                "--rate",
                str(rate),
                "--nonblocking",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        time.sleep(0.5)  # let it attach before the client starts
        if self.popen.poll() is not None:
            error = self.popen.stderr.read().decode(errors="replace") if self.popen.stderr else ""
            self.popen = None
            raise MeasurementError(f"py-spy could not attach to pid {pid}: {error.strip()}")

    def stop(self) -> None:
        if self.popen is None:
            return
        popen, self.popen = self.popen, None
        popen.send_signal(signal.SIGINT)
        try:
            _, error = popen.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.communicate()
            raise MeasurementError("py-spy did not write its flame graph within 60 s") from None
        if not os.path.exists(self.output):
            raise MeasurementError(f"py-spy wrote no flame graph: {error.decode(errors='replace').strip()}")


def py_spy() -> str:
    """The ``py-spy`` executable (the bench extra installs it next to this Python)."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    found = beside if os.access(beside, os.X_OK) else shutil.which("py-spy")
    if found is None:
        raise MeasurementError("py-spy is not installed (pip install -e '.[bench]')")
    return found
