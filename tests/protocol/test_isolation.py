"""rsnet.protocol is sans-I/O: it loads no event loop, socket, thread or clock module."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The parent package ``rsnet`` loads its re-exports of the streams core (built on trio) lazily,
# so importing the protocol package pulls in only what the protocol itself needs. The probe
# reports the modules the import added and the modules each protocol module holds a reference
# to (``time`` is loaded by the interpreter itself, so only the second list can show that the
# protocol uses it).
PROBE = f"""
import json, sys, types
sys.path.insert(0, {str(ROOT)!r})
baseline = set(sys.modules)
import rsnet.protocol
loaded = sorted(set(sys.modules) - baseline)
used = sorted({{
    value.__name__
    for name in loaded if name.startswith("rsnet.protocol")
    for value in vars(sys.modules[name]).values() if isinstance(value, types.ModuleType)
}})
print(json.dumps({{"loaded": loaded, "used": used}}))
"""

IO_AND_CLOCKS = {
    "trio",
    "asyncio",
    "anyio",
    "sniffio",
    "socket",
    "_socket",
    "ssl",
    "select",
    "selectors",
    "threading",
    "sched",
    "time",
    "datetime",
    "random",
    "os",
    "websockets",
    "rsnet.streams",
}


def test_importing_the_protocol_loads_no_io_thread_or_clock_module() -> None:
    result = subprocess.run([sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    loaded, used = set(report["loaded"]), set(report["used"])
    assert "rsnet.protocol.connection" in loaded
    assert not (loaded - {"datetime", "_datetime"}) & IO_AND_CLOCKS  # msgpack loads datetime for Timestamp
    assert not any(name.startswith(("trio.", "asyncio.", "rsnet.streams")) for name in loaded)
    assert not used & IO_AND_CLOCKS, used
