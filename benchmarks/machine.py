"""What the numbers were measured on: machine, Python, package versions, commit, command."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

from .runner import ROOT

PACKAGES = ("rsnet", "trio", "msgpack", "websockets", "rsocket", "aiohttp", "matplotlib", "nats-py", "py-spy")


def _nats_server() -> str | None:
    """The version of the ``nats-server`` scenario 7 runs, or None if it is not installed."""
    from .systems.jetstream import server_binary

    binary = server_binary()
    if binary is None:
        return None
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().rsplit(" ", 1)[-1].lstrip("v") or None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _node() -> str | None:
    """Node's version (for the JavaScript client's scenario), or None without node."""
    try:
        return subprocess.run(
            ["node", "--version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def describe(command: str) -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "executable": sys.executable,
        "node": _node(),
        "packages": versions,
        "tools": {"nats-server": _nats_server()},
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
