"""`make demo` installs only what the demo needs; `make test` keeps installing the test extras."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def planned(target: str) -> str:
    """The commands ``make TARGET`` would run from scratch (``-n -B``: printed, not run)."""
    return subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_installs_rsnet_without_extras_and_make_test_with_them():
    demo = [line for line in planned("demo").splitlines() if "pip install" in line and "-e" in line]
    assert demo and all(line.rstrip().endswith("-e .") for line in demo), demo
    test = [line for line in planned("test").splitlines() if "pip install" in line and "-e" in line]
    assert test and all("[test,bench]" in line for line in test), test
