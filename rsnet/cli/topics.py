"""``rsnet topics``: a broker's topics with offsets, subscribers and lag.

    rsnet topics [URL] [--json]

A table for people; ``--json`` prints one JSON object per topic (the broker's ``$topics``
items, protocol/BROKER.md) for scripts.
"""

from __future__ import annotations

import argparse
import json

from ..net.client import connect
from .common import CommandError, add_connection_options, split_url, token_from, url_from
from .sub import broker_topics

USAGE = "rsnet topics [URL] [--json]"


def add_parser(commands: argparse._SubParsersAction) -> None:
    topics = commands.add_parser("topics", help="list a broker's topics with offsets and lag", usage=USAGE)
    topics.add_argument("target", nargs="*", metavar="URL", help="broker URL (optional)")
    topics.add_argument("--json", action="store_true", help="one JSON object per topic")
    add_connection_options(topics)


async def run(args: argparse.Namespace) -> int:
    split_url(args, args.target, (), USAGE)
    async with connect(url_from(args), token=token_from(args)) as conn:
        topics = await broker_topics(conn)
    if topics is None:
        raise CommandError(f"{conn.peer} is not a broker (it has no $topics)")
    if args.json:
        for info in topics.values():
            print(json.dumps(info))
        return 0
    print(f"{'topic':<32} {'first':>10} {'next':>10} {'policy':>12} {'subs':>5} {'max lag':>8} {'dropped':>8}")
    for info in topics.values():
        lags = [s["lag"] for s in info["subscribers"]]
        print(
            f"{info['topic']:<32} {info['first_offset']:>10} {info['next_offset']:>10} {info['policy']:>12} "
            f"{len(lags):>5} {max(lags, default=0):>8} {info['dropped']:>8}"
        )
    return 0
