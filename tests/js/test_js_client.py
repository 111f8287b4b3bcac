"""The JavaScript client's own suite (client/js: tsc, then node's test runner) as one test.

It covers every golden vector in protocol/vectors/ and end-to-end runs against this
checkout's ``rsnet serve`` and ``rsnet broker`` over TCP and WebSocket. A failing node test
fails this test (with node's report); only a machine without node/npm skips it.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import warnings

import pytest

CLIENT = pathlib.Path(__file__).resolve().parents[2] / "client" / "js"
TIMEOUT = 300


def _failures(report: str) -> str:
    """Each failing test's lines (node's TAP: ``not ok`` and its indented details), which the
    tail of a long report does not reach."""
    lines = report.splitlines()
    shown = []
    for index, line in enumerate(lines):
        if line.lstrip().startswith("not ok"):
            shown += [*lines[index : index + 40], "..."]
    return "\n".join(shown) + "\n"


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=CLIENT, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)


@pytest.mark.timeout(TIMEOUT * 2)
def test_js_client_suite() -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed: the JavaScript client (client/js) was not tested")
    env = dict(os.environ, RSNET_BIN=str(pathlib.Path(sys.executable).parent / "rsnet"))
    installed = CLIENT / "node_modules" / ".package-lock.json"
    lock = CLIENT / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        done = _run([npm, "ci", "--no-audit", "--no-fund"], env)  # `make test` normally did this
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = _run([npm, "test"], env)
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"the JavaScript client's tests failed:\n{_failures(report)}{report[-3000:]}"
    assert "# fail 0" in report and "# pass" in report, f"unexpected node test output:\n{report[-4000:]}"
    skipped = re.findall(r"^ok \d+ - (.*) # SKIP (.*)$", report, re.MULTILINE)
    for name, reason in skipped:  # e.g. the browser test without Chromium: say so, loudly
        warnings.warn(f"JavaScript test skipped: {name}: {reason}", stacklevel=1)
