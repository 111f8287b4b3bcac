"""Run the installed ``rsnet`` script as a user would: real processes, real servers on 127.0.0.1."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time

RSNET = str(pathlib.Path(sys.executable).parent / "rsnet")  # the console script pip installed


def auth_config(path: pathlib.Path, **grants: dict[str, list[str]]) -> dict[str, str]:
    """Write a broker config to ``path`` with one token per keyword (its name), each with its
    grants (``publish``, ``subscribe``, ``admin`` patterns); return the tokens by name."""
    from rsnet.broker.auth import generate_token, hash_token

    tokens = {name: generate_token() for name in grants}
    blocks = [
        f'[[auth.tokens]]\nname = "{name}"\nhash = "{hash_token(tokens[name])}"\n'
        + "".join(f"{action} = {patterns!r}\n".replace("'", '"') for action, patterns in given.items())
        for name, given in grants.items()
    ]
    path.write_text("\n".join(blocks))
    return tokens


def env(**extra: str) -> dict[str, str]:
    """The environment of a child: ours without RSNET_* defaults, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RSNET_")}
    return {**base, **extra}


def rsnet(*args: str, stdin: str | None = None, timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
    """``rsnet *args`` to completion; output as text."""
    kwargs.setdefault("env", env())
    return subprocess.run([RSNET, *args], input=stdin, capture_output=True, text=True, timeout=timeout, **kwargs)


class Daemon:
    """A long-running ``rsnet`` (broker or serve) in a child process, killed at the end."""

    def __init__(self, *args: str, cwd: str | None = None) -> None:
        self.process = subprocess.Popen([RSNET, *args], stderr=subprocess.PIPE, text=True, env=env(), cwd=cwd)
        self.printed = ""
        deadline = time.monotonic() + 20
        while "serving " not in self.printed:
            line = self.process.stderr.readline()
            assert line, f"rsnet {' '.join(args)} exited: {self.printed}"
            self.printed += line
            assert time.monotonic() < deadline
        self.url = self.printed.split("serving ", 1)[1].split()[0]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.process.stderr.close()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


def one_line(text: str) -> str:
    """``text`` is exactly one line besides the broker's log lines, and no traceback: return it."""
    assert "Traceback" not in text, text
    lines = [line for line in text.strip().splitlines() if not _LOG_LINE.match(line)]
    assert len(lines) == 1, text
    return lines[0]
