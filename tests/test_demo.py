"""`make demo` must keep working: the live broker demo runs and shows backpressure."""

from __future__ import annotations

import subprocess
import sys


def test_the_demo_runs_and_the_producer_follows_the_slowest_subscriber():
    result = subprocess.run(
        [sys.executable, "-m", "rsnet.cli", "demo", "--seconds", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    ticks = [line for line in lines if line.startswith("t=")]
    assert len(ticks) == 4
    assert "the slow subscriber leaves" in result.stdout
    worst = max(int(line.rsplit("unsent", 1)[1]) for line in ticks)
    assert worst <= 500  # the topic's bound held while the slow subscriber read
