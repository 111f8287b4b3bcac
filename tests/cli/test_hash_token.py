"""``rsnet broker hash-token`` as a user runs it: on a terminal it asks for the token and does
not echo it; Ctrl-C is one line and 130; a token too short points to the CLI's own option."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time

from rsnet.broker.auth import hash_token

from .support import RSNET, env, one_line, rsnet
from .test_broken import as_in_a_terminal

TOKEN = "tok-0123456789abcdef-0123456789"


def read_until(fd: int, text: bytes, timeout: float = 10.0) -> bytes:
    """What the terminal's other side ``fd`` shows, up to and including ``text``."""
    shown = b""
    deadline = time.monotonic() + timeout
    while text not in shown:
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], shown
        shown += os.read(fd, 4096)
    return shown


def on_a_terminal() -> tuple[subprocess.Popen[bytes], int]:
    """``rsnet broker hash-token`` with stdin and stderr on a pseudo-terminal (of a session of
    its own, so it cannot reach the terminal this test runs in), stdout a pipe; started and
    showing its prompt. Returns the process and the terminal's other side."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [RSNET, "broker", "hash-token"],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=terminal,
        env=env(),
        start_new_session=True,
        preexec_fn=as_in_a_terminal,
    )
    os.close(terminal)
    read_until(controller, b"token to hash (not shown): ")
    return process, controller


def test_on_a_terminal_the_token_is_asked_for_and_not_shown():
    process, controller = on_a_terminal()
    try:
        os.write(controller, f"{TOKEN}\n".encode())
        out, _ = process.communicate(timeout=10)
        assert (process.returncode, out.decode()) == (0, f"{hash_token(TOKEN)}\n")
        shown = read_until(controller, b"\n")
        assert TOKEN.encode() not in shown, shown
    finally:
        process.kill()
        process.wait()
        os.close(controller)


def test_ctrl_c_at_the_prompt_is_one_line_and_exit_130():
    process, controller = on_a_terminal()
    try:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 130
        # The terminal shows \r\n for \n: a new line after the prompt, then one line, no traceback.
        assert read_until(controller, b"interrupted\r\n") == b"\r\nrsnet broker hash-token: interrupted\r\n"
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        os.close(controller)


def test_a_token_too_short_points_to_the_clis_own_way_to_make_one():
    short = rsnet("broker", "hash-token", stdin="short\n")
    assert short.returncode == 1
    assert one_line(short.stderr) == (
        "rsnet broker hash-token: a token must be at least 16 characters of random data (got 5): "
        "make one with rsnet broker hash-token --generate (in Python: generate_token())"
    )
    piped = rsnet("broker", "hash-token", stdin=f"{TOKEN}\n")
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, f"{hash_token(TOKEN)}\n", "")
