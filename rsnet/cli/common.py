"""What every ``rsnet`` command shares: defaults, error lines, exit codes, output, the event loop.

The conventions (those of kcat, the ``nats`` CLI and websocat):

- exit 0: done; 1: the command failed (one line on stderr says why); 2: wrong usage;
  130: interrupted with Ctrl-C (one line); a closed stdout (``rsnet sub ... | head -3``)
  ends the command quietly with 0, like a completed ``--count``.
- an error is one line ``rsnet CMD: ...``; a coded stream error names its code
  (``OFFSET_OUT_OF_RANGE: offset 9 ... does not exist yet``), never "application error N":
  :func:`code_name` knows the protocol's codes and the broker's.
- the server's URL and token come from the command line, else ``RSNET_URL`` / ``RSNET_TOKEN``
  (a token given with ``--token`` is visible in ``ps``: prefer ``RSNET_TOKEN`` or
  ``--token-file``), else the context file (:func:`context`), else ``tcp://127.0.0.1:7600``
  and no token.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
import tomllib
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio

from ..broker.codes import BrokerCode
from ..client_rules import parse_endpoint
from ..errors import ConnectionLost, RsnetError, StreamError
from ..protocol import ErrorCode

DEFAULT_URL = "tcp://127.0.0.1:7600"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


class CommandError(Exception):
    """A failure the command explains in one line (exit 1, or ``exit_code``)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def code_name(code: int) -> str:
    """The name of an error code: the protocol's table (SPEC 11), then the broker's
    (``rsnet.broker.codes``, protocol/BROKER.md), else ``code N``.

    The CLI formats errors with both tables because it may import the broker and
    ``rsnet.errors`` may not (it sits below the broker in ARCHITECTURE.md's layers)."""
    for table in (ErrorCode, BrokerCode):
        try:
            return table(code).name
        except ValueError:
            pass
    return f"code {code}"


def describe(error: BaseException) -> str:
    """One line for an error a command ends with."""
    if isinstance(error, StreamError):
        name = code_name(error.code)
        return f"{name}: {error.message}" if error.message else name
    if isinstance(error, ConnectionLost):
        if error.code == ErrorCode.UNAUTHORIZED:  # the wire's word is auth_token; a user gives it so
            return f"{error} (UNAUTHORIZED: give the token with --token-file, --token or RSNET_TOKEN)"
        if error.code is not None:
            return f"{error} ({code_name(error.code)})"
        return str(error)
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{where}"
    return str(error) or type(error).__name__


def context() -> dict[str, Any]:
    """The context file: ``$RSNET_CONTEXT``, else ``~/.config/rsnet/context.toml`` (under
    ``$XDG_CONFIG_HOME`` if set), if it exists. Keys: ``url``, ``token_file``; anything else
    is refused (a typo must not be ignored), and a token itself is not accepted there (keep
    it in a file of its own, readable by you only)."""
    path = os.environ.get("RSNET_CONTEXT")
    if not path:
        base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        path = os.path.join(base, "rsnet", "context.toml")
        if not os.path.exists(path):
            return {}
    try:
        with open(path, "rb") as file:
            values = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise CommandError(f"cannot read the context file {path}: {describe(error)}", EXIT_USAGE) from None
    unknown = set(values) - {"url", "token_file"}
    if unknown or not all(isinstance(value, str) for value in values.values()):
        raise CommandError(f"{path}: expected only url and token_file, as strings; got {sorted(values)}", EXIT_USAGE)
    if "token_file" in values:  # a relative path is the context file's neighbour, wherever we run
        values["token_file"] = os.path.join(os.path.dirname(path), os.path.expanduser(values["token_file"]))
    return values


def token_from(args: argparse.Namespace) -> str | None:
    """``--token-file``, then ``--token``, then ``RSNET_TOKEN``, then the context's ``token_file``."""
    token_file, source = getattr(args, "token_file", None), "--token-file"
    if not token_file and not getattr(args, "token", None) and not os.environ.get("RSNET_TOKEN"):
        token_file, source = context().get("token_file"), "the context file's token_file"
    if token_file:
        try:
            with open(os.path.expanduser(token_file), encoding="utf-8") as file:
                return file.readline().strip() or None
        except OSError as error:
            raise CommandError(f"cannot read the token file ({source}): {describe(error)}", EXIT_USAGE) from None
    return getattr(args, "token", None) or os.environ.get("RSNET_TOKEN") or None


def url_from(args: argparse.Namespace) -> str:
    """``-s/--url`` (or a URL argument), then ``RSNET_URL``, then the context's ``url``, then
    :data:`DEFAULT_URL`. One that is not a server URL is wrong usage (exit 2), said with where
    it came from."""
    url, source = getattr(args, "url", None), "the URL given"
    if not url:
        url, source = os.environ.get("RSNET_URL"), "RSNET_URL"
    if not url:
        url, source = context().get("url"), "the context file's url"
    if not url:
        return DEFAULT_URL
    try:
        parse_endpoint(url)
    except ValueError as wrong:
        raise CommandError(f"{wrong} ({source})", EXIT_USAGE) from None
    return url


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``-s/--url``, ``--token``, ``--token-file``: how a command reaches its server."""
    parser.add_argument(
        "-s", "--url", help=f"server URL (default: $RSNET_URL, else the context file's url, else {DEFAULT_URL})"
    )
    parser.add_argument("--token", help="auth token (visible in ps: prefer $RSNET_TOKEN or --token-file)")
    parser.add_argument("--token-file", metavar="FILE", help="read the auth token from the first line of FILE")


def split_url(
    args: argparse.Namespace, positionals: list[str], names: tuple[str, ...], command: str | None = None
) -> None:
    """Accept ``[URL] NAME...``: a first positional containing ``://`` is the server's URL
    (the form the README shows), the rest fill ``names`` in order. ``command``: as in
    :func:`fail_usage`."""
    values = list(positionals)
    if values and "://" in values[0]:
        if args.url:
            fail_usage(args, f"the URL is given twice ({values[0]} and --url {args.url})", command)
        args.url = values.pop(0)
    if len(values) != len(names):
        wanted = " ".join(n.upper() for n in names) or "nothing more"
        hint = url_hint(values[0]) if values else ""
        fail_usage(args, f"expected {wanted}, got {' '.join(values) or 'nothing'}{hint}", command)
    for name, value in zip(names, values, strict=True):
        setattr(args, name, value)


def description(doc: str | None) -> str | None:
    """A command's ``--help`` text from its module's docstring: what follows the first two
    paragraphs (a summary and a usage block), as plain text: ``code`` and :role:`target` lose
    their reStructuredText markup, which a terminal would show as it is, and each paragraph
    is filled again."""
    if doc is None:
        return None
    text = doc.split("\n\n", 2)[2]
    text = re.sub(r"``(.+?)``", r"\1", re.sub(r":\w+:`([^`]+)`", r"\1", text), flags=re.DOTALL)
    return "\n\n".join(textwrap.fill(" ".join(paragraph.split()), 92) for paragraph in text.split("\n\n"))


_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[\w.-]+):\d{1,5}")


def url_hint(word: str) -> str:
    """For a word that looks like ``HOST:PORT`` where a URL could stand: how to write it as one
    (``tcp://`` or ``ws://``), to end an error message; else empty."""
    if not _HOST_PORT.fullmatch(word):
        return ""
    return f"; {word} is no URL: write tcp://{word} (or ws://{word}/ for WebSocket)"


def fail_usage(args: argparse.Namespace, message: str, command: str | None = None) -> NoReturn:
    """Exit 2 as argparse does for a wrong argument found after parsing: the command's usage,
    then ``rsnet COMMAND: error: message``. ``args.parser`` is the command's parser (every
    command's default); ``command`` names it more precisely (``topics alter``)."""
    parser: argparse.ArgumentParser = args.parser
    parser.print_usage(sys.stderr)
    parser.exit(EXIT_USAGE, f"{'rsnet ' + command if command else parser.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (``--count 0`` would mean nothing, ``-1`` forever)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float | None:
    """The seconds in a duration such as ``90s``, ``10m``, ``1h30m``, ``7d`` or ``250ms``; None
    if ``text`` is not one."""
    text = text.strip()
    if not re.fullmatch(f"(?:{_DURATION.pattern})+", text):
        return None
    return sum(float(amount) * _UNIT_SECONDS[unit] for amount, unit in _DURATION.findall(text))


def say(command: str, message: str) -> None:
    """A line on stderr, ``rsnet COMMAND: message``."""
    print(f"rsnet {command}: {message}", file=sys.stderr, flush=True)


def _only(error: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (a nursery's wrapping)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def _contains(error: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(error, BaseExceptionGroup):
        return any(_contains(inner, kind) for inner in error.exceptions)
    return isinstance(error, kind)


def _silence_stdout() -> None:
    """After the reader of stdout went away: point stdout at /dev/null so that the
    interpreter's final flush does not fail again (the Python documentation's advice)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def printing(command: str, function: Callable[[], int]) -> int:
    """``function()``, for a command that prints and ends without trio: a reader of stdout that
    went away (``| head -1``) ends it quietly and Ctrl-C is one line and 130, as in
    :func:`run_command`."""
    try:
        code = function()
        sys.stdout.flush()  # here, not at exit: a closed pipe is found where it is handled
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        if sys.stderr.isatty():
            print(file=sys.stderr)  # below the line ^C was typed on (after a prompt, say)
        say(command, "interrupted")
        return EXIT_INTERRUPTED


def run_command(command: str, function: Callable[..., Awaitable[int]], *args: Any) -> int:
    """Run ``function(*args)`` under trio and turn how it ended into an exit code and at most
    one line on stderr: no traceback for an expected failure (a refused stream, a lost
    connection, a port in use, a directory that cannot be created, Ctrl-C, a closed pipe)."""
    try:
        return trio.run(function, *args)
    except BaseException as raised:  # every ending becomes an exit code here
        error = _only(raised)
        if _contains(raised, KeyboardInterrupt):
            say(command, "interrupted")
            return EXIT_INTERRUPTED
        if _contains(raised, BrokenPipeError):
            _silence_stdout()
            return EXIT_OK
        if isinstance(error, SystemExit):
            raise error from None
        if isinstance(error, CommandError):
            say(command, str(error))
            return error.exit_code
        if isinstance(error, (RsnetError, OSError, ValueError)):
            say(command, describe(error))
            return EXIT_FAILED
        raise
