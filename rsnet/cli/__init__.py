"""The ``rsnet`` command line (one module per command in this package).

    rsnet demo                                   live demo on the embedded broker
    rsnet serve [--tcp H:P] [--ws H:P] [--demo] [module:attr ...]
    rsnet sub [URL] NAME [-p key=value ...] [--from POSITION] [--until-end] [--count N] [--format F]
    rsnet pub [URL] TOPIC [--raw] [--producer ID] [--sequence N]   lines from stdin, as they arrive
    rsnet topics [URL] [--json]                  topics, offsets, lag, settings
    rsnet topics create|alter [URL] TOPIC [--policy P] [--max-lag N] [--retention LIMITS] [--storage S]
    rsnet topics delete|purge [URL] TOPIC --yes
    rsnet broker [--config FILE] [--data-dir DIR] [--tcp H:P] [--ws H:P] [--metrics H:P] [--fsync POLICY]
    rsnet broker hash-token [--generate]         the hash of a token, for the config
    rsnet completion bash|zsh|fish               a shell completion script

The URL defaults to ``$RSNET_URL``, else ``tcp://127.0.0.1:7600``; the token to
``--token-file``, ``--token`` or ``$RSNET_TOKEN``. Exit codes and error lines follow one
convention (:mod:`rsnet.cli.common`): 0 done, 1 failed with one line on stderr naming the
error code, 2 wrong usage, 130 Ctrl-C; a closed stdout ends ``sub`` quietly with 0.
"""

from __future__ import annotations

import argparse
import difflib
import getpass
import importlib.metadata
import logging
import math
import sys
from collections.abc import Sequence

from ..broker.config import BrokerConfig, ListenConfig
from . import completion, pub, serve, sub, topics
from .common import EXIT_FAILED, EXIT_OK, fail_usage, printing, run_command, say
from .completion import COMPLETIONS
from .serve import GRACE

BROKER_ACTIONS = ("hash-token",)
"""What ``rsnet broker``'s optional positional may be (without one, it runs the broker)."""


def _demo_seconds(text: str) -> float:
    """An argparse type for ``demo --seconds``: the demo shows a row every half second and its
    slow subscriber leaves half way, so at least 1 (and finite)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 1 <= seconds < math.inf:
        raise argparse.ArgumentTypeError(f"must be at least 1 (and finite), got {text}")
    return seconds


def _hash_token(generate: bool) -> int:
    """``rsnet broker hash-token``: the hash of the token on stdin's first line; on a terminal
    the token is asked for on stderr and read without echo (it is a secret). ``--generate``:
    a new token and its hash."""
    from ..broker.auth import generate_token, hash_token

    if generate:
        token = generate_token()
        print(f"token: {token}\nhash:  {hash_token(token)}")
        return EXIT_OK
    if sys.stdin.isatty():
        try:
            token = getpass.getpass("token to hash (not shown): ", stream=sys.stderr).strip()
        except EOFError:  # Ctrl-D
            token = ""
    else:
        token = sys.stdin.readline().strip()
    try:
        print(hash_token(token))
    except ValueError as too_short:
        say("broker hash-token", str(too_short))
        return EXIT_FAILED
    return EXIT_OK


def _version() -> str:
    try:
        return importlib.metadata.version("rsnet")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def parser() -> argparse.ArgumentParser:
    """The whole command line (``rsnet --help``)."""
    root = argparse.ArgumentParser(
        prog="rsnet",
        allow_abbrev=False,
        description="Reactive Streams across the network: serve publishers, run a broker, publish and subscribe.",
        epilog="Defaults: $RSNET_URL, $RSNET_TOKEN, else the context file ($RSNET_CONTEXT, else "
        "~/.config/rsnet/context.toml: url, token_file), else tcp://127.0.0.1:7600. "
        "'rsnet COMMAND --help' for more.",
    )
    root.add_argument("--version", action="version", version=f"rsnet {_version()}")
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="run the live demo")
    demo.add_argument("--seconds", type=_demo_seconds, default=6.0, help="how long to run (at least 1; default 6)")

    serve.add_parser(commands)
    sub.add_parser(commands)
    pub.add_parser(commands)
    topics.add_parser(commands)
    completion.add_parser(commands)

    broker = commands.add_parser("broker", help="run the stream broker")
    broker.add_argument("--config", help="TOML configuration file")
    broker.add_argument("--data-dir", help="directory for durable topics (default: in memory)")
    broker.add_argument(
        "--tcp", type=serve.address, help=f"HOST:PORT for TCP (default: the config's, else {ListenConfig().tcp})"
    )
    broker.add_argument("--ws", type=serve.address, help="HOST:PORT for WebSocket (default: the config's, else off)")
    broker.add_argument(
        "--fsync",
        choices=["always", "interval", "never"],
        help=f"fsync policy of durable topics (default: the config's, else {BrokerConfig().fsync})",
    )
    broker.add_argument(
        "--metrics",
        type=serve.address,
        help="HOST:PORT for HTTP: /metrics, /health and the live view at / (default: the config's, else off)",
    )
    broker.add_argument(
        "--grace", type=float, default=GRACE, help=f"seconds to drain streams on shutdown (default {GRACE:g})"
    )
    # Not choices: a value left by a misspelled option (--metrix 127.0.0.1:9100) would be
    # refused as an action before the option could be named (main checks the action).
    action = broker.add_argument(
        "action",
        nargs="?",
        metavar="hash-token",
        help="hash-token: print the hash of a token read from stdin (for [[auth.tokens]])",
    )
    setattr(action, COMPLETIONS, BROKER_ACTIONS)
    broker.add_argument("--generate", action="store_true", help="with hash-token: make a new random token")
    for command in commands.choices.values():
        # Options are never abbreviated (--form must not pass for --format), and each command
        # keeps its parser for the usage errors found after parsing (common.fail_usage).
        command.allow_abbrev = False
        command.set_defaults(parser=command)
    return root


def _unrecognized(args: argparse.Namespace, extra: list[str]) -> str:
    """The error for words no argument took, with the option closest to a misspelled one."""
    options = list(args.parser._option_string_actions)
    given = (word.split("=", 1)[0] for word in extra if word.startswith("-"))
    close = next((match for word in given for match in difflib.get_close_matches(word, options, 1, 0.75)), None)
    return f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {close}?)" if close else "")


def main(argv: Sequence[str] | None = None) -> int:
    commands = parser()
    args, extra = commands.parse_known_args(argv)
    if extra:
        # argparse takes a command's positionals in one run: those after an option
        # (``topics create --max-lag 100 TOPIC``) come back here, and are the command's too.
        if not hasattr(args, "target") or any(word.startswith("-") for word in extra):
            fail_usage(args, _unrecognized(args, extra))
        args.target = [*args.target, *extra]
    if args.command == "broker":
        if args.action is not None and args.action not in BROKER_ACTIONS:
            fail_usage(args, f"unknown action {args.action!r}: the broker's only action is hash-token")
        if args.generate and args.action is None:
            fail_usage(args, "--generate goes with hash-token: rsnet broker hash-token --generate")
    if args.command != "broker":  # the broker configures logging from its config
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from ..demo.live import run_demo

        async def demo() -> int:
            await run_demo(args.seconds)
            return EXIT_OK

        return run_command("demo", demo)
    if args.command == "completion":
        return printing("completion", lambda: print(completion.script(args.shell, parser()), end="") or EXIT_OK)
    if args.command == "broker" and args.action == "hash-token":
        return printing("broker hash-token", lambda: _hash_token(args.generate))
    if args.command == "broker":
        from ..broker.daemon import run_broker

        return run_command("broker", run_broker, args)
    runs = {"serve": serve.run, "sub": sub.run, "pub": pub.run, "topics": topics.run}
    return run_command(args.command, runs[args.command], args)


if __name__ == "__main__":
    sys.exit(main())
