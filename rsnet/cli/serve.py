"""``rsnet serve``: host publishers over TCP and WebSocket.

    rsnet serve [--tcp H:P] [--ws H:P] [--demo] [module:attr ...]

Each ``module:attr`` is an :class:`rsnet.Server` or a mapping of names to factories
``f(params, ctx) -> Publisher``; modules are imported from the current directory first (as
``uvicorn`` and ``hypercorn`` do; ``--app-dir`` chooses another). A Server is served with its
own settings (``token`` or ``authenticate``, limits, keepalive); ``--keepalive`` and
``--max-connections`` given on the command line win over them, and ``--token`` is refused
for a Server that has its own authentication rather than replacing it. Addresses are validated as
the broker's configuration validates them (``HOST:PORT``, ``[::1]:7600``, port 0-65535).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
import trio

from ..broker.config import Address
from ..client_rules import DEFAULT_KEEPALIVE
from ..demo.publishers import add_demo_publishers
from ..net.gc_tuning import tune_for_serving
from ..net.server import DEFAULT_MAX_CONNECTIONS, Server, connection_limit
from .common import EXIT_USAGE, CommandError, say

GRACE = 5.0
"""Seconds open streams get to end on shutdown, unless ``--grace`` says otherwise (serve, broker)."""


def address(text: str) -> tuple[str, int]:
    """An argparse type: ``HOST:PORT`` as the broker's config reads it."""
    try:
        parsed = Address.model_validate(text)
    except pydantic.ValidationError as invalid:
        message = invalid.errors()[0]["msg"]
        raise argparse.ArgumentTypeError(f"{text!r}: {message}") from None
    return parsed.host, parsed.port


def add_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="host publishers over TCP and WebSocket")
    serve.add_argument("--tcp", type=address, help="HOST:PORT for TCP (default 127.0.0.1:7600)")
    serve.add_argument("--ws", type=address, help="HOST:PORT for WebSocket")
    serve.add_argument(
        "--demo",
        action="store_true",
        help="host the demo publishers: range (start=0, count), ticks (interval=1.0 seconds: 0, 1, 2... forever), fail (n=0: n items, then an application error)",
    )
    serve.add_argument("--token", help="require this auth token from clients")
    serve.add_argument(
        "--grace", type=float, default=GRACE, help=f"seconds to drain streams on shutdown (default {GRACE:g})"
    )
    serve.add_argument(
        "--keepalive",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"PING after this long without sending; drop a peer silent for three (SPEC 10.1; 0: off; default {DEFAULT_KEEPALIVE:g})",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help=f"connections served at once; one more is refused with GOING_AWAY (default {DEFAULT_MAX_CONNECTIONS:,}, "
        "at most half the file descriptor limit, less 32)",
    )
    serve.add_argument(
        "--app-dir", default=".", help="directory to import module:attr from, before sys.path (default: .)"
    )
    serve.add_argument("publishers", nargs="*", metavar="module:attr")


def load(spec: str) -> Server | dict[str, Any]:
    """The rsnet.Server or the dict of factories ``module:attr`` names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CommandError(f"expected module:attr, got {spec!r}", EXIT_USAGE)
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise CommandError(f"cannot load {spec!r}: {error}") from None
    if not isinstance(target, Server | dict):
        raise CommandError(f"{spec!r} is neither an rsnet.Server nor a dict of factories")
    return target


def serving_options(args: argparse.Namespace, loaded: dict[str, Server | dict[str, Any]]) -> dict[str, Any]:
    """The settings of the server to run: a loaded Server's own (never silently dropped: its
    token is what protects it), then what the command line gives explicitly."""
    defaults = Server().options
    configured = {spec: t.options for spec, t in loaded.items() if isinstance(t, Server) and t.options != defaults}
    first = next(iter(configured.values()), defaults)
    if any(other != first for other in configured.values()):
        raise CommandError(
            f"{' and '.join(configured)} are Servers with different settings (token, limits, keepalive): "
            "serve one, and add the other's publishers to it"
        )
    options = dict(first)
    if args.token is not None:
        if options["token"] is not None or options["authenticate"] is not None:
            spec = next(iter(configured))
            raise CommandError(
                f"{spec} has its own token (or authenticate), which --token would replace: drop --token", EXIT_USAGE
            )
        options["token"] = args.token
    if args.keepalive is not None:
        options["keepalive_interval"] = args.keepalive
    return options


async def run(args: argparse.Namespace) -> int:
    sys.path.insert(0, os.path.abspath(args.app_dir))
    if args.keepalive is not None and args.keepalive < 0:
        raise CommandError(f"--keepalive must be >= 0 (seconds; 0: off), got {args.keepalive:g}", EXIT_USAGE)
    if args.max_connections is not None and args.max_connections < 1:
        raise CommandError(f"--max-connections must be >= 1, got {args.max_connections}", EXIT_USAGE)
    loaded = {spec: load(spec) for spec in args.publishers}
    options = serving_options(args, loaded)
    max_connections = connection_limit(args.max_connections or options["max_connections"])
    if args.max_connections is not None and max_connections < args.max_connections:
        say(
            "serve",
            f"--max-connections lowered from {args.max_connections} to {max_connections}: connections get "
            "half of the process's file descriptor limit, less 32 (raise `ulimit -n` to allow more)",
        )
    server = Server(**{**options, "max_connections": max_connections})
    if args.demo:
        add_demo_publishers(server)
    for target in loaded.values():
        if isinstance(target, Server):
            server.include(target)
        else:
            for name, factory in target.items():
                server.add_publisher(name, factory)
    if not server.publisher_names:
        raise CommandError("nothing to serve (give module:attr or --demo)", EXIT_USAGE)
    tune_for_serving()  # this process only serves: see rsnet/net/gc_tuning.py
    tcp = args.tcp or (None if args.ws else ("127.0.0.1", 7600))
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            if tcp:
                port = await _listen(nursery, server.serve_tcp, tcp)
                say("serve", f"serving tcp://{Address.model_validate((tcp[0], port))}")  # [::1]:7600 for IPv6
            if args.ws:
                port = await _listen(nursery, server.serve_websocket, args.ws)
                say("serve", f"serving ws://{Address.model_validate((args.ws[0], port))}/")
            say("serve", f"publishers: {', '.join(server.publisher_names)}")
            async for _ in signals:
                say("serve", f"shutting down: open streams get up to {args.grace:g} s to end (--grace)")
                await server.shutdown(grace=args.grace)
                nursery.cancel_scope.cancel()
                break
    return 0


async def _listen(nursery: trio.Nursery, serve: Callable[..., Awaitable[Any]], where: tuple[str, int]) -> int:
    """Start one listener; a port in use or an address we cannot bind is one line, not a group."""
    try:
        port: int = await nursery.start(functools.partial(serve, *where))
    except* OSError as failed:
        error = failed.exceptions[0]
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CommandError(f"cannot listen on {where[0]}:{where[1]}: {reason}") from None
    return port
