"""``rsnet-js``: rsnet's JavaScript client (``client/js``) in Node, against rsnet's Python server.

The server is :mod:`.rsnet_system`'s (``rsnet.Server`` hosting ``items``), so a row measured on
``rsnet`` and ``rsnet-js`` differs only in the client: the Python client (``rsnet.connect``,
``subscribe(prefetch=P)``) against the Node one (``connect(url)``, ``for await`` over
``conn.subscribe(name, params, {prefetch: P})``, the same demand policy; P None: the option not
set in either client, adaptive demand; ``api: "subscriber"``: each client's Reactive Streams
Subscriber on ``conn.publisher(...)`` with the fixed rule done by hand). The client process is
this worker, which runs ``node rsnet_js.mjs`` (plain node, not ``node --test``) and returns the
numbers Node measured itself: items, seconds and CPU seconds of the measured part. Only the
``stream`` kind.

Needs ``node`` (20+) and ``client/js/node_modules`` (``npm ci``, as ``make test`` does);
:func:`unavailable` says what is missing, and compiles ``client/js/dist`` first when it is
older than ``client/js/src``.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
from typing import Any

from . import rsnet_system

CLIENT = pathlib.Path(__file__).resolve().parents[2] / "client" / "js"
SCRIPT = pathlib.Path(__file__).with_name("rsnet_js.mjs")

serve = rsnet_system.serve


def unavailable() -> str | None:
    """Why the Node client cannot be measured, or None (after compiling it if it was stale)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return "node and npm are not installed"
    if not (CLIENT / "node_modules").is_dir():
        return "client/js/node_modules is missing (cd client/js && npm ci)"
    built = CLIENT / "dist" / "index.js"
    sources = [p.stat().st_mtime for p in (CLIENT / "src").glob("*.ts")]
    if not built.exists() or built.stat().st_mtime < max(sources):
        done = subprocess.run([npm, "run", "build"], cwd=CLIENT, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            return f"npm run build failed: {(done.stdout + done.stderr).strip()[-500:]}"
    return None


def run_client(kind: str, transport: str, port: int, params: dict[str, Any], deadline: float) -> dict[str, Any]:
    spec = {"kind": kind, "url": rsnet_system.url(transport, port), "params": params}
    node = shutil.which("node") or "node"
    # stdin inherited: the runner's pipe (see benchmarks.worker), whose end node watches as we do.
    process = subprocess.Popen(
        [node, str(SCRIPT), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise TimeoutError(f"node did not finish within {deadline:.0f} s") from None
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"node exited {process.returncode}: {err.strip()[-1000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result
