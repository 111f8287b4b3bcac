"""Where a round trip's time goes: subscribe-to-first-item split into its legs, rsnet against the
ceiling (issue 13, target 1).

Command line: ``python -m benchmarks round-trip [--iterations N] [--runs R] [--quick]``; writes
``benchmarks/ROUND_TRIP.md`` (not for ``--quick``). Timings are never asserted anywhere. Each run
also times the same work in a hot loop (``benchmarks/hot_work.py``): what it costs warm; and
counts it, in instructions and bytecodes (``benchmarks/instructions.py``), which unlike the
timings do not move with the machine's load (instructions need valgrind, and are not counted
in ``--quick``).

Each system's own ``first_item`` client (the one scenario 2 times) runs against its own server
in another process, with both processes' transports timed at their edges (when a write starts
and ends, when a read returns) and the client's stream openings marked (``Client.subscribe``;
the ceiling's ``subscribe_frame``). Both processes read the same clock (``time.perf_counter``
is CLOCK_MONOTONIC on Linux), so the legs of one round trip line up across them:

1. client, before its write: opening the stream -> its SUBSCRIBE's write starts;
2. to the server: that write starting -> the server's read returning it (the write, the
   kernel's delivery, the server's wake-up from epoll and its scheduler, the read);
3. server processing: that read returned -> the server's answer's write starts;
4. back to the client: as 2, the other way;
5. client, after its read: the rest of the client's own latency (decoding the answer, handing
   the item to the user's loop).

They add up to the latency. Legs 2 and 4 are what any program pays here to move bytes between
two processes; 1, 3 and 5 are the program's own work. So the page shows how much of the gap to
the ceiling is rsnet's work per stream opened, and how small that work would have to be for a
given ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import trio

HERE = pathlib.Path(__file__).resolve().parent
LEGS = (
    "client, before its write",
    "to the server",
    "server processing",
    "back to the client",
    "client, after its read",
)
"""The round trip's legs in order: they add up to the latency."""
SYSTEMS = ("rsnet", "ceiling", "ceiling, two tasks")
"""The ceiling twice: as scenario 2 runs it (one task), and with its reader and its consumer in
two tasks, as any client must that shares a connection between streams and serves each with
``async for`` (the hand-over rsnet's client pays; ``ceiling.first_item_two_tasks``)."""
KINDS = {"rsnet": "first_item", "ceiling": "first_item", "ceiling, two tasks": "first_item_two_tasks"}
TRANSPORTS = {"tcp": "TCP", "ws": "WebSocket"}
WARMUP = 200

_events: list[tuple[str, float]] = []
_recording = False
_installed: set[str] = set()


def _record(label: str) -> None:
    if _recording:
        _events.append((label, time.perf_counter()))


# A write is marked (when it starts) only if it has bytes to write: rsnet's writer also calls
# send() with none, to flush what an earlier send_nowait left, or as a checkpoint.


def _marked_write(method: Callable[..., Any]) -> Callable[..., Any]:
    def write(transport: Any, chunks: Any) -> Any:
        if chunks:
            _record("w")
        return method(transport, chunks)

    return write


def _marked_async_write(method: Callable[..., Any]) -> Callable[..., Any]:
    async def write(transport: Any, chunks: Any) -> Any:
        if chunks:
            _record("w")
        return await method(transport, chunks)

    return write


def _marked_read(method: Callable[..., Any]) -> Callable[..., Any]:
    async def read(*args: Any) -> Any:
        data = await method(*args)
        _record("r")
        return data

    return read


def _marked(function: Callable[..., Any]) -> Callable[..., Any]:
    def start(*args: Any, **kwargs: Any) -> Any:
        _record("c0")
        return function(*args, **kwargs)

    return start


def _install(system: str) -> None:
    """Time the edges of ``system``'s transports, and mark where its client opens a stream
    (``c0``: ``Client.subscribe``, or the ceiling's ``subscribe_frame``), in this process, once."""
    module = _module(system).__name__
    if module in _installed:
        return
    _installed.add(module)
    if system == "rsnet":
        from rsnet.net.client import Client
        from rsnet.transport.tcp import TcpTransport
        from rsnet.transport.websocket import WebSocketTransport

        Client.subscribe = _marked(Client.subscribe)  # type: ignore[method-assign]
        classes: tuple[type, ...] = (TcpTransport, WebSocketTransport)
        for cls in classes:
            cls.send_nowait = _marked_write(cls.send_nowait)  # type: ignore[attr-defined]
            cls.send = _marked_async_write(cls.send)  # type: ignore[attr-defined]
            cls.receive = _marked_read(cls.receive)  # type: ignore[attr-defined]
    else:
        from .systems import ceiling

        ceiling.subscribe_frame = _marked(ceiling.subscribe_frame)
        for cls in (ceiling.Raw, ceiling.Ws):
            cls.send = _marked_async_write(cls.__dict__["send"])  # type: ignore[method-assign]
            cls.receive = _marked_read(cls.__dict__["receive"])  # type: ignore[method-assign]


def _module(system: str) -> Any:
    from .systems import ceiling, rsnet_system

    return rsnet_system if system == "rsnet" else ceiling


def _serve(system: str, transport: str, ports: Any, control: Any, recording: Any, out: str) -> None:
    """The server process: serve; at the first ``control`` set, start recording and say so
    (``recording``); at the second, write the events to ``out`` and exit."""
    _install(system)

    def controller() -> None:
        global _recording
        control.wait()
        control.clear()
        _events.clear()
        _recording = True
        recording.set()
        control.wait()
        pathlib.Path(out).write_text(json.dumps(_events))
        os._exit(0)

    threading.Thread(target=controller, daemon=True).start()
    _module(system).serve(transport, ports.put)


def _side(events: list[tuple[str, float]], side: str) -> list[tuple[str, float]]:
    """One process's events, labels prefixed with ``side``."""
    return [(side + label, t) for label, t in events]


def _round_trips(client: list[tuple[str, float]], server: list[tuple[str, float]]) -> list[dict[str, float]]:
    """Each round trip's legs, by walking both processes' events in time order: the client
    opens a stream (c0), writes, the server's next read returns, it writes, the client's next
    read returns. The handshake and the close, outside any c0, are skipped."""
    merged = sorted(_side(client, "C") + _side(server, "S"), key=lambda e: e[1])
    trips, want = [], ("Cc0", "Cw", "Sr", "Sw", "Cr")
    step, marks = 0, dict[str, float]()
    for label, t in merged:
        if label == "Cc0":  # a stream opened: its round trip starts (an unfinished one is dropped)
            step, marks = 0, {}
        if label != want[step]:
            continue
        marks[label] = t
        step += 1
        if step == len(want):
            opened, sent, read, answered, back = (marks[k] for k in want)
            trips.append(
                {
                    "client, before its write": sent - opened,
                    "to the server": read - sent,
                    "server processing": answered - read,
                    "back to the client": back - answered,
                    "opened": opened,
                    "back": back,
                }
            )
            step, marks = 0, {}
    return trips


def measure(system: str, transport: str, iterations: int) -> dict[str, float]:
    """One run: the median of each leg (µs) over ``iterations`` round trips, and of the latency."""
    global _recording
    context = multiprocessing.get_context("spawn")
    ports, control, recording = context.Queue(), context.Event(), context.Event()
    with tempfile.TemporaryDirectory() as scratch:
        out = str(pathlib.Path(scratch) / "server.json")
        server = context.Process(target=_serve, args=(system, transport, ports, control, recording, out), daemon=True)
        server.start()
        try:
            port = ports.get(timeout=60)
            _install(system)
            client, kind = _module(system).client, KINDS[system]
            trio.run(client, kind, transport, port, {"iterations": WARMUP, "size": 16})
            control.set()
            if not recording.wait(60):
                raise RuntimeError("the server did not start recording")
            _events.clear()
            _recording = True
            result = trio.run(client, kind, transport, port, {"iterations": iterations, "size": 16})
            _recording = False
            control.set()
            server.join(30)
            server_events = json.loads(pathlib.Path(out).read_text())
        finally:
            server.kill()
    latencies = result["latencies_us"]
    trips = _round_trips(list(_events), server_events)
    if len(trips) != len(latencies):
        raise RuntimeError(f"{system} {transport}: {len(trips)} round trips found for {len(latencies)} latencies")
    legs = {leg: statistics.median(trip[leg] for trip in trips) * 1e6 for leg in LEGS[:4]}
    # The client's latency starts just before c0: the rest of it, after its read, is its own.
    legs[LEGS[4]] = statistics.median(
        latency - (trip["back"] - trip["opened"]) * 1e6 for latency, trip in zip(latencies, trips, strict=True)
    )
    legs["latency"] = statistics.median(latencies)
    return legs


def run(iterations: int, runs: int) -> dict[str, dict[str, list[dict[str, float]]]]:
    """``runs`` rounds; in each, every transport and system in turn, then the hot loop (under
    the key ``"hot"``: ``{system: [{"server", "client"}, ...]}``)."""
    from . import hot_work

    results: dict[str, dict[str, list[dict[str, float]]]] = {t: {s: [] for s in SYSTEMS} for t in TRANSPORTS}
    results["hot"] = {"rsnet": [], "ceiling": []}
    for number in range(1, runs + 1):
        for system, work in hot_work.measure(max(iterations, 5000)).items():
            results["hot"][system].append(work)
            print(
                f"[run {number}/{runs}] hot loop {system}: server {work['server']:.1f}, client {work['client']:.1f} (µs)",
                file=sys.stderr,
            )
        for transport in TRANSPORTS:
            for system in SYSTEMS:
                legs = measure(system, transport, iterations)
                results[transport][system].append(legs)
                shown = ", ".join(f"{k} {v:.0f}" for k, v in legs.items())
                print(f"[run {number}/{runs}] {transport} {system}: {shown} (µs)", file=sys.stderr)
    return results


Counts = dict[str, dict[str, float | None]]
"""Per system, per round of the hot loop: ``{"instructions": Ir or None, "bytecodes": n}``."""


def count(with_instructions: bool) -> Counts:
    """The hot loop's work per round, counted (``benchmarks/instructions.py``); instructions
    only if asked and valgrind is installed."""
    from . import instructions

    measured = with_instructions and instructions.valgrind() is not None
    counts: Counts = {}
    for system in instructions.SYSTEMS:
        counts[system] = {
            "instructions": instructions.instructions_per_round(system, 500) if measured else None,
            "bytecodes": instructions.bytecodes_per_round(system),
        }
        print(f"counted {system}: {counts[system]}", file=sys.stderr)
    return counts


def markdown(results: dict[str, dict[str, list[dict[str, float]]]], counts: Counts, command: str) -> str:
    def med(transport: str, system: str, key: str) -> float:
        return statistics.median(legs[key] for legs in results[transport][system])

    lines = [
        "# Where a round trip's time goes",
        "",
        f"Generated by `{command}` (benchmarks/round_trip.py, whose docstring defines the legs). Subscribe",
        "to first item, 16 B, each system's own scenario 2 client against its own server; median µs of",
        "each leg over a run's round trips, then the median over the runs. The first five legs add up",
        "to the latency; the two legs between the processes (a write, the kernel's delivery, the",
        "reader's wake-up and read) are what any program pays here, the other three its own work.",
        "A leg between the processes also holds whatever the receiving side was still doing when the",
        "bytes arrived (rsnet's client goes on setting up its stream after writing SUBSCRIBE), so if",
        "anything rsnet's own work is counted low.",
        "",
    ]

    def hot(system: str, side: str) -> float:
        return statistics.median(work[side] for work in results["hot"][system])

    allowed: dict[str, float] = {}  # per transport: rsnet's own work for 1.3x the ceiling

    for transport, name in TRANSPORTS.items():
        lines += [
            f"## {name}",
            "",
            "| leg | rsnet | ceiling | ceiling, two tasks | rsnet - ceiling |",
            "|---|---|---|---|---|",
        ]
        for key in (*LEGS, "latency"):
            ours, theirs, split = (med(transport, system, key) for system in SYSTEMS)
            lines.append(f"| {key} | {ours:.0f} | {theirs:.0f} | {split:.0f} | {ours - theirs:+.0f} |")
        ceiling = med(transport, "ceiling", "latency")
        moving = med(transport, "rsnet", LEGS[1]) + med(transport, "rsnet", LEGS[3])
        work = sum(med(transport, "rsnet", leg) for leg in (LEGS[0], LEGS[2], LEGS[4]))
        allowed[transport] = max(0.0, 1.3 * ceiling - moving)
        hand_over = med(transport, "ceiling, two tasks", LEGS[4]) - med(transport, "ceiling", LEGS[4])
        split_ratio = med(transport, "ceiling, two tasks", "latency") / ceiling
        lines += [
            "",
            f"For 1.3x the ceiling ({1.3 * ceiling:.0f} µs) with rsnet's own legs between the processes"
            f" ({moving:.0f} µs), its work per round trip, server and client together, would have to fit"
            f" in {allowed[transport]:.0f} µs; it is {work:.0f} µs. Handing the item from"
            f" a reader task to the consumer's task alone, with nothing else added, costs the ceiling"
            f" {hand_over:.0f} µs ({split_ratio:.2f}x its one-task latency).",
            "",
        ]
    own = {
        system: sum(med("tcp", system, leg) for leg in (LEGS[0], LEGS[2], LEGS[4])) for system in ("rsnet", "ceiling")
    }
    warm = {system: hot(system, "server") + hot(system, "client") for system in ("rsnet", "ceiling")}
    lines += [
        "## The same work in a hot loop",
        "",
        "`benchmarks/hot_work.py`: each side's work for one subscribe-to-first-item, back to back in one",
        "process with no socket and no scheduler (rsnet through its real connections, sessions and",
        "stream objects; the ceiling through its msgpack calls), median µs. Against it, the work as",
        "the round trip times it over TCP, after a wait in epoll (legs 1 + 3 + 5).",
        "",
        "| work | rsnet | ceiling |",
        "|---|---|---|",
        f"| server, hot | {hot('rsnet', 'server'):.1f} | {hot('ceiling', 'server'):.1f} |",
        f"| client, hot | {hot('rsnet', 'client'):.1f} | {hot('ceiling', 'client'):.1f} |",
        f"| both, hot | {warm['rsnet']:.1f} | {warm['ceiling']:.1f} |",
        f"| both, in the round trip | {own['rsnet']:.0f} | {own['ceiling']:.0f} |",
        "",
        f"rsnet's work costs {own['rsnet'] / warm['rsnet']:.1f}x in the round trip what it costs warm (caches"
        " and predictors cold after each wait, the scheduler's steps between); "
        + (
            f"so to reach 1.3x the ceiling, its work would have to shrink by about"
            f" {1 - allowed['tcp'] / own['rsnet']:.0%} (to the {allowed['tcp']:.0f} µs the TCP table allows),"
            " warm or cold alike."
            if own["rsnet"] > allowed["tcp"]
            else f"it fits in the {allowed['tcp']:.0f} µs the TCP table allows for 1.3x the ceiling, with"
            f" {1 - own['rsnet'] / allowed['tcp']:.0%} to spare."
        ),
        "",
        "## The same work, counted",
        "",
        "`benchmarks/instructions.py`: the hot loop's work for one round, counted rather than timed, so",
        "these do not move with the machine's load: CPU instructions (valgrind's callgrind, by the",
        "difference between two runs of different lengths) and the Python bytecodes the interpreter",
        "executes (`sys.settrace`). The round trip's system calls, kernel and scheduler are not in them.",
        "",
        "| per round | rsnet | ceiling | rsnet ÷ ceiling |",
        "|---|---|---|---|",
    ]
    for key, name in (("instructions", "instructions"), ("bytecodes", "Python bytecodes")):
        ours, theirs = counts["rsnet"][key], counts["ceiling"][key]
        if ours is None or theirs is None:
            lines.append(f"| {name} | not counted | not counted | |")
        else:
            lines.append(f"| {name} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.1f}x |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks round-trip", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--quick", action="store_true", help="50 round trips, one run, no instructions counted, no ROUND_TRIP.md"
    )
    args = parser.parse_args(argv)
    iterations, runs = (50, 1) if args.quick else (args.iterations, args.runs)
    results = run(iterations, runs)
    counts = count(with_instructions=not args.quick)
    command = "python -m benchmarks round-trip " + " ".join(argv if argv is not None else sys.argv[2:])
    page = markdown(results, counts, command.strip())
    print(page)
    if not args.quick:
        (HERE / "ROUND_TRIP.md").write_text(page)
    return 0
