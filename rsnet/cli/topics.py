"""``rsnet topics``: a broker's topics with offsets, subscribers and lag; topic administration.

    rsnet topics [URL] [--json]
    rsnet topics create [URL] TOPIC
    rsnet topics delete|purge [URL] TOPIC --yes

A table for people; ``--json`` prints one JSON object per topic (the broker's ``$topics``
items, protocol/BROKER.md) for scripts. ``create``, ``delete`` and ``purge`` go through the
broker's ``$admin`` (:mod:`rsnet.broker.admin`: a token needs an ``admin`` grant covering the
topic); ``delete`` and ``purge`` remove records for good, so they ask for ``--yes``.
"""

from __future__ import annotations

import argparse
import json

from ..net.client import connect
from .common import CommandError, add_connection_options, fail_usage, split_url, token_from, url_from
from .sub import broker_topics

USAGE = "rsnet topics [URL] [--json] | rsnet topics create|delete|purge [URL] TOPIC [--yes]"
ACTIONS = ("create", "delete", "purge")


def add_parser(commands: argparse._SubParsersAction) -> None:
    topics = commands.add_parser("topics", help="list a broker's topics with offsets and lag", usage=USAGE)
    topics.add_argument(
        "target", nargs="*", metavar="[ACTION] [URL] [TOPIC]", help="create, delete or purge TOPIC; none: list"
    )
    topics.add_argument("--json", action="store_true", help="one JSON object per topic")
    topics.add_argument("--yes", action="store_true", help="delete or purge: yes, remove its records for good")
    add_connection_options(topics)


async def run(args: argparse.Namespace) -> int:
    if args.target and args.target[0] in ACTIONS:
        return await administer(args)
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
        for cursor, offset in sorted(info.get("cursors", {}).items()):  # e.g. a Spark query's progress
            print(f"  cursor {cursor}: {offset} (lag {max(info['next_offset'] - offset, 0)})")
        for damage in info.get("damaged", []):  # records found damaged on disk (BROKER.md, OFFSET_DAMAGED)
            print(f"  damaged: offsets {damage['first']} to {damage['end'] - 1}: {damage['problem']}")
    return 0


async def administer(args: argparse.Namespace) -> int:
    action = args.target[0]
    split_url(args, args.target[1:], ("topic",), USAGE)
    if action != "create" and not args.yes:
        fail_usage(f"{action} removes every record of {args.topic!r} for good: add --yes", USAGE)
    async with connect(url_from(args), token=token_from(args)) as conn:
        answers = [a async for a in conn.subscribe("$admin", {"action": action, "topic": args.topic})]
    answer = answers[0]
    if args.json:
        print(json.dumps(answer))
    elif action == "create":
        print(f"{args.topic}: {'created' if answer['created'] else 'exists already'}")
    else:
        removed = answer["removed"]
        done = "deleted" if action == "delete" else "purged"
        print(f"{args.topic}: {done} ({removed} record{'s' if removed != 1 else ''} removed)")
    return 0
