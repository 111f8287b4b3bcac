"""The ``rsnet`` command line.

    rsnet demo                                   live demo on the embedded broker
    rsnet serve [--tcp H:P] [--ws H:P] [--demo] [module:attr ...]
    rsnet sub URL NAME [-p key=value ...] [--from POSITION] [--count N] [--prefetch N]
    rsnet broker [--config FILE] [--data-dir DIR] [--tcp H:P] [--ws H:P] [--fsync POLICY]
    rsnet broker hash-token [--generate]         the hash of a token, for the config
    rsnet pub URL TOPIC [--producer ID] [--sequence N]   JSON lines from stdin
    rsnet topics URL

``serve`` hosts the publishers of each ``module:attr`` (an :class:`rsnet.Server`, or a
mapping of names to factories ``f(params, ctx) -> Publisher``) and, with ``--demo``, the
built-in ``range``, ``ticks`` and ``fail``. ``sub`` prints items as JSON lines; it exits 0
when the stream completes (or ``--count`` items arrived) and 1 with the error on stderr.
``pub`` exits 0 only when the broker acknowledged every line it read.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import trio

from .demo.publishers import add_demo_publishers
from .errors import RsnetError
from .net.client import connect
from .net.server import Server


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(value)  # numbers, booleans, lists... as JSON
    except json.JSONDecodeError:
        return key, value  # anything else is a string


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(value).decode()}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _load_publishers(server: Server, spec: str) -> None:
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"rsnet serve: expected module:attr, got {spec!r}")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise SystemExit(f"rsnet serve: cannot load {spec!r}: {error}") from None
    if isinstance(target, Server):
        server.include(target)
    elif isinstance(target, dict):
        for name, factory in target.items():
            server.add_publisher(name, factory)
    else:
        raise SystemExit(f"rsnet serve: {spec!r} is neither an rsnet.Server nor a dict of factories")


async def _serve(args: argparse.Namespace) -> None:
    server = Server(token=args.token)
    if args.demo:
        add_demo_publishers(server)
    for spec in args.publishers:
        _load_publishers(server, spec)
    if not server.publisher_names:
        raise SystemExit("rsnet serve: nothing to serve (give module:attr or --demo)")
    tcp = args.tcp or (None if args.ws else ("127.0.0.1", 7600))
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            if tcp:
                port = await nursery.start(server.serve_tcp, *tcp)
                print(f"rsnet: serving tcp://{tcp[0]}:{port}", file=sys.stderr, flush=True)
            if args.ws:
                port = await nursery.start(server.serve_websocket, *args.ws)
                print(f"rsnet: serving ws://{args.ws[0]}:{port}/", file=sys.stderr, flush=True)
            print(f"rsnet: publishers: {', '.join(server.publisher_names)}", file=sys.stderr, flush=True)
            async for _ in signals:
                print("rsnet: shutting down", file=sys.stderr, flush=True)
                await server.shutdown(grace=args.grace)
                nursery.cancel_scope.cancel()
                return


def _position(text: str) -> Any:
    return int(text) if text.lstrip("-").isdigit() else text


async def _sub(args: argparse.Namespace) -> int:
    params = dict(args.param)
    if args.start is not None:
        params["from"] = args.start
    received = 0
    try:
        async with connect(args.url, token=args.token) as conn:
            async with conn.subscribe(args.name, params, prefetch=args.prefetch) as items:
                async for item in items:
                    sys.stdout.write(json.dumps(item, default=_json_default) + "\n")
                    received += 1
                    if received == args.count:
                        break
            sys.stdout.flush()
    except (RsnetError, ValueError) as error:
        sys.stdout.flush()
        print(f"rsnet sub: {error}", file=sys.stderr)
        return 1
    return 0


async def _pub(args: argparse.Namespace) -> int:
    from .broker.client import publish

    records = []
    for number, line in enumerate(sys.stdin, 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                print(f"rsnet pub: line {number} is not JSON: {error}", file=sys.stderr)
                return 1
    try:
        async with connect(args.url, token=args.token) as conn:
            count = await publish(conn, args.topic, records, producer=args.producer, first_sequence=args.sequence)
    except (RsnetError, ValueError) as error:
        print(f"rsnet pub: not every record was acknowledged: {error}", file=sys.stderr)
        return 1
    print(f"rsnet pub: {count} records stored in {args.topic}", file=sys.stderr)
    return 0


async def _topics(args: argparse.Namespace) -> int:
    try:
        async with connect(args.url, token=args.token) as conn:
            topics = [topic async for topic in conn.subscribe("$topics")]
    except (RsnetError, ValueError) as error:
        print(f"rsnet topics: {error}", file=sys.stderr)
        return 1
    print(f"{'topic':<32} {'first':>10} {'next':>10} {'policy':>12} {'subs':>5} {'max lag':>8} {'dropped':>8}")
    for topic in topics:
        lags = [s["lag"] for s in topic["subscribers"]]
        print(
            f"{topic['topic']:<32} {topic['first_offset']:>10} {topic['next_offset']:>10} {topic['policy']:>12} "
            f"{len(lags):>5} {max(lags, default=0):>8} {topic['dropped']:>8}"
        )
        for damage in topic.get("damaged", []):  # records found damaged on disk (BROKER.md, OFFSET_DAMAGED)
            print(f"  damaged: offsets {damage['first']} to {damage['end'] - 1}: {damage['problem']}")
    return 0


def _hash_token(generate: bool) -> int:
    from .broker.auth import generate_token, hash_token

    if generate:
        token = generate_token()
        print(f"token: {token}\nhash:  {hash_token(token)}")
        return 0
    token = sys.stdin.readline().strip()
    try:
        print(hash_token(token))
    except ValueError as error:
        print(f"rsnet broker hash-token: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rsnet", description="Reactive Streams across the network.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run the live demo")
    demo.add_argument("--seconds", type=float, default=6.0, help="how long to run")

    serve = commands.add_parser("serve", help="host publishers over TCP and WebSocket")
    serve.add_argument("--tcp", type=_address, help="HOST:PORT for TCP (default 127.0.0.1:7600)")
    serve.add_argument("--ws", type=_address, help="HOST:PORT for WebSocket")
    serve.add_argument("--demo", action="store_true", help="host the demo publishers range, ticks, fail")
    serve.add_argument("--token", help="require this auth token from clients")
    serve.add_argument("--grace", type=float, default=5.0, help="seconds to drain streams on shutdown")
    serve.add_argument("publishers", nargs="*", metavar="module:attr")

    sub = commands.add_parser("sub", help="subscribe and print items as JSON lines")
    sub.add_argument("url", help="tcp://H:P, tls://H:P, ws://H:P/path or wss://H:P/path")
    sub.add_argument("name", help="the publisher's name")
    sub.add_argument(
        "-p", "--param", type=_param, action="append", default=[], help="key=value (value as JSON if it parses)"
    )
    sub.add_argument("--count", type=int, default=None, help="stop after N items")
    sub.add_argument("--prefetch", type=int, default=256, help="items in flight at most")
    sub.add_argument(
        "--from",
        dest="start",
        type=_position,
        default=None,
        help="broker topics: earliest, latest (default) or an offset",
    )
    sub.add_argument("--token", help="auth token")

    pub = commands.add_parser("pub", help="publish JSON lines from stdin to a broker topic")
    pub.add_argument("url")
    pub.add_argument("topic")
    pub.add_argument("--producer", help="producer id: republishing with the same id and sequences is idempotent")
    pub.add_argument("--sequence", type=int, default=0, help="sequence number of the first line")
    pub.add_argument("--token", help="auth token")

    topics = commands.add_parser("topics", help="list a broker's topics with offsets and lag")
    topics.add_argument("url")
    topics.add_argument("--token", help="auth token")

    broker = commands.add_parser("broker", help="run the stream broker")
    broker.add_argument("--config", help="TOML configuration file")
    broker.add_argument("--data-dir", help="directory for durable topics (default: in memory)")
    broker.add_argument("--tcp", type=_address, help="HOST:PORT for TCP")
    broker.add_argument("--ws", type=_address, help="HOST:PORT for WebSocket")
    broker.add_argument("--fsync", choices=["always", "interval", "never"], help="fsync policy of durable topics")
    broker.add_argument("--grace", type=float, default=5.0, help="seconds to drain streams on shutdown")
    broker.add_argument(
        "action",
        nargs="?",
        choices=["hash-token"],
        help="hash-token: print the hash of a token read from stdin (for [[auth.tokens]])",
    )
    broker.add_argument("--generate", action="store_true", help="with hash-token: make a new random token")

    args = parser.parse_args(argv)
    if args.command != "broker":  # the broker configures logging from its config
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from .demo.live import run_demo

        trio.run(run_demo, args.seconds)
        return 0
    if args.command == "serve":
        trio.run(_serve, args)
        return 0
    if args.command == "broker" and args.action == "hash-token":
        return _hash_token(args.generate)
    if args.command == "broker":
        from .broker.daemon import run_broker

        return trio.run(run_broker, args)
    return trio.run({"sub": _sub, "pub": _pub, "topics": _topics}[args.command], args)


if __name__ == "__main__":
    sys.exit(main())
