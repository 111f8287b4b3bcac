"""Subscribe-to-first-item's own work counted, not timed: CPU instructions and Python bytecodes.

The round trip's timings (``benchmarks/round_trip.py``) move by a third from one run to the
next on this shared machine; counts do not. Each system's hot loop (``benchmarks/hot_work.py``:
both sides' work for one subscribe-to-first-item, back to back, no socket and no scheduler)
runs in a child process:

- under valgrind's callgrind, once with ``rounds`` and once with ``5 x rounds`` rounds, so
  that the difference divided by ``4 x rounds`` is the instructions of one round, without the
  interpreter's start-up, the imports and the warm-up (repeatable to about 0.2% here, whatever
  else the machine is doing);
- under ``sys.settrace`` with opcode events, one round after the warm-up: the bytecodes the
  interpreter executes for it (no valgrind needed).

Neither counts what a round trip adds between the processes (system calls, the kernel, the
scheduler's steps): they measure the part of the gap to the ceiling that is the program's own
code, which is what a change to rsnet's hot path can move. Nothing here is asserted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

SYSTEMS = ("rsnet", "ceiling")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def valgrind() -> str | None:
    """The valgrind executable, or None where it is not installed."""
    return shutil.which("valgrind")


def instructions_per_round(system: str, rounds: int) -> float:
    """Instructions of one round of ``system``'s hot loop (callgrind's Ir, by difference; the
    warm-up's rounds run in both)."""
    tool = valgrind()
    if tool is None:
        raise RuntimeError("valgrind is not installed")
    counts = []
    for n in (rounds, 5 * rounds):
        with tempfile.TemporaryDirectory() as scratch:
            done = subprocess.run(
                [
                    tool,
                    "--tool=callgrind",
                    f"--callgrind-out-file={os.path.join(scratch, 'out')}",
                    sys.executable,
                    "-m",
                    "benchmarks.instructions",
                    "--child",
                    system,
                    str(n),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
        counts.append(collected(done.stderr))
    return (counts[1] - counts[0]) / (4 * rounds)


def collected(report: str) -> int:
    """The instructions callgrind counted, from its summary on stderr ("I   refs: 1,234")."""
    found = re.search(r"I\s+refs:\s+([\d,]+)", report)
    if found is None:
        raise RuntimeError(f"no instruction count in callgrind's output: {report[-500:]!r}")
    return int(found.group(1).replace(",", ""))


def bytecodes_per_round(system: str) -> int:
    """Bytecodes the interpreter executes for one round of ``system``'s hot loop, after the
    warm-up (the last of its rounds)."""
    from . import hot_work

    executed = 0
    last = False

    def count(frame: Any, event: str, arg: Any) -> Any:
        nonlocal executed
        if event == "opcode":
            executed += 1
        return count

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return count

    def on_round(number: int) -> None:
        nonlocal last
        if number == hot_work.WARMUP:  # the round after the warm-up is traced, alone
            last = True
            sys.settrace(trace)
        elif last:
            sys.settrace(None)
            last = False

    try:
        hot_work.rounds(system, 2, on_round)  # the second round after the warm-up ends the trace
    finally:
        sys.settrace(None)
    return executed


if __name__ == "__main__":  # the child callgrind runs: ``--child SYSTEM ROUNDS``
    from . import hot_work

    hot_work.rounds(sys.argv[2], int(sys.argv[3]))
