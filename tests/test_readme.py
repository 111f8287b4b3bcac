"""Every code example in the README runs as shown (issue 12).

The README's fenced blocks are read in order and each is handled by its language:

- ``text``: not code (diagrams, layouts, sample output): nothing to run;
- ``python``: saved to a file and run with this interpreter; exit 0. A block whose first line
  is ``# NAME.py: run with COMMAND`` is saved as ``NAME.py`` and ``COMMAND`` is run instead;
- ``sh``: a line starting ``rsnet serve`` or ``rsnet broker`` (not ``hash-token``) starts a
  server that runs until the block ends; the other lines run in order as one bash script with
  ``-e -o pipefail`` (every command and every part of a pipe must succeed);
- ``js``: saved inside ``client/js`` (so that ``import ... from "rsnet-client"`` resolves to
  the package) and run with node; exit 0.

A ``python`` or ``js`` block that needs a server says so on its first line,
``# with: rsnet ...`` or ``// with: rsnet ...``: the test starts that command first, as the
reader would. Every block runs in a fresh temporary directory, on free ports in place of
7600 and 7601 (the README says so). A block that cannot run in the suite is preceded, in the
README itself, by a visible line ``_Not run by the test suite: REASON._``; any other
language, or a block without a language, fails this test.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = pathlib.Path(sys.executable).parent
JS_CLIENT = ROOT / "client" / "js"
NOT_RUN = re.compile(r"^_Not run by the test suite: (?P<reason>.+?)\._$")
RUNNABLE = {"python", "sh", "js"}
TIMEOUT = 90


@dataclasses.dataclass
class Block:
    line: int  # where the block starts in the README (1-based), for messages
    language: str
    code: str
    not_run: str | None  # the visible reason, if any

    @property
    def id(self) -> str:
        return f"README.md:{self.line}:{self.language or 'no-language'}"


def blocks(text: str) -> list[Block]:
    found = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        match = re.match(r"^```(\S*)\s*$", lines[index])
        if not match:
            index += 1
            continue
        start = index
        end = start + 1
        while not lines[end].startswith("```"):
            end += 1
        before = [line for line in lines[:start] if line.strip()]
        marker = NOT_RUN.match(before[-1].strip()) if before else None
        code = "\n".join(lines[start + 1 : end]) + "\n"
        found.append(Block(start + 1, match[1], code, marker["reason"] if marker else None))
        index = end + 1
    return found


BLOCKS = blocks(README.read_text())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Servers:
    """The long-running commands a block starts (``rsnet serve``, ``rsnet broker``)."""

    def __init__(self, cwd: pathlib.Path, environment: dict[str, str]) -> None:
        self.cwd, self.environment = cwd, environment
        self.processes: list[subprocess.Popen] = []

    def start(self, command: str) -> None:
        # Not through a shell: kill() must reach the server itself, not a shell around it.
        words = shlex.split(command)
        process = subprocess.Popen(
            [shutil.which(words[0], path=self.environment["PATH"]) or words[0], *words[1:]],
            cwd=self.cwd,
            env=self.environment,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.processes.append(process)
        printed = ""
        deadline = time.monotonic() + 20
        while not ("serving " in printed and ("topics " in printed or "publishers: " in printed)):
            line = process.stderr.readline()
            assert line, f"{command!r} exited: {printed}"
            assert time.monotonic() < deadline, f"{command!r} did not start: {printed}"
            printed += line

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
            process.stderr.close()


def ports(code: str, mapping: dict[str, str]) -> str:
    return re.sub(r"\b(7600|7601)\b", lambda match: mapping[match[1]], code)


def run(command: list[str] | str, cwd: pathlib.Path, environment: dict[str, str], what: str) -> None:
    result = subprocess.run(
        command,
        shell=isinstance(command, str),
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, (
        f"{what} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


def test_every_block_has_a_language_the_suite_runs_or_a_visible_reason():
    assert BLOCKS
    problems = [
        f"{block.id}: give it a language (text for non-code)"
        if not block.language
        else f"{block.id}: the suite cannot run {block.language!r}: add '_Not run by the test suite: REASON._' before it"
        for block in BLOCKS
        if block.not_run is None and block.language not in RUNNABLE | {"text"}
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(TIMEOUT * 3)
@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.language in RUNNABLE and b.not_run is None], ids=lambda b: b.id
)
def test_readme_block_runs_as_shown(block: Block, tmp_path: pathlib.Path):
    mapping = {"7600": str(free_port()), "7601": str(free_port())}
    code = ports(block.code, mapping)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RSNET_")}
    environment["PATH"] = f"{BIN}{os.pathsep}{environment.get('PATH', '')}"
    servers = Servers(tmp_path, environment)
    try:
        first = code.splitlines()[0] if code.strip() else ""
        needs = re.match(r"^(?:#|//) with: (.+)$", first)
        if needs:
            servers.start(needs[1])
        if block.language == "python":
            saved = re.match(r"^# (\S+\.py): run with (.+)$", first)
            name = saved[1] if saved else "example.py"
            (tmp_path / name).write_text(code)
            run(saved[2] if saved else [sys.executable, name], tmp_path, environment, block.id)
        elif block.language == "sh":
            script = []
            for line in code.splitlines():
                command = line.split("  #", 1)[0].strip()
                if re.match(r"^rsnet (serve|broker)\b", command) and "hash-token" not in command:
                    servers.start(command)  # a server for the lines after it
                elif command and not command.startswith("#"):
                    script.append(line)
            # The other lines run as one script, as typed into one shell (an export holds for
            # the lines after it); -e -o pipefail: every command, and every part of a pipe, must succeed.
            run(["bash", "-e", "-o", "pipefail", "-x", "-c", "\n".join(script)], tmp_path, environment, block.id)
        else:
            node = shutil.which("node")
            if node is None:
                pytest.skip("node is not installed: the README's JavaScript examples were not run")
            if not (JS_CLIENT / "dist" / "index.js").exists():
                run("npm run build", JS_CLIENT, environment, "npm run build")
            script = JS_CLIENT / f".readme-example-{uuid.uuid4().hex[:8]}.mjs"
            script.write_text(code)
            try:
                run([node, str(script)], tmp_path, environment, block.id)
            finally:
                script.unlink()
    finally:
        servers.stop()
