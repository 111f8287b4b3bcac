"""``rsnet topics``: a broker's topics with offsets, subscribers, lag and settings; topic administration.

    rsnet topics [URL] [--json]
    rsnet topics create [URL] TOPIC [--storage S] [--policy P] [--max-lag N] [--retention LIMITS]
    rsnet topics alter  [URL] TOPIC [--policy P] [--max-lag N] [--retention LIMITS] [--reset NAME]
    rsnet topics delete|purge [URL] TOPIC --yes

A table for people, with each topic's effective settings and where each comes from (set on the
topic, a ``[[topics]]`` rule of the broker's config, ``[topic_defaults]``, built in);
``--json`` prints one JSON object per topic (the broker's ``$topics`` items,
protocol/BROKER.md) for scripts.

``create``, ``alter``, ``delete`` and ``purge`` go through the broker's ``$admin``
(:mod:`rsnet.broker.admin`: a token needs an ``admin`` grant covering the topic). Settings
given to ``create`` win over the broker's configuration for that topic, each on its own, and
are stored with it (they survive restarts); ``create`` on an existing topic succeeds if it
already has those settings and is refused if not: ``alter`` changes them, at once, and
``--reset NAME`` makes one follow the configuration again. ``--retention`` takes
``records=N``, ``bytes=SIZE`` (``500MB``, ``1GiB``) and ``age=DURATION`` (``90s``, ``12h``,
``7d``), comma-separated or repeated; ``none`` means no limit of that kind. ``delete`` and
``purge`` remove records for good, so they ask for ``--yes``; ``purge`` keeps the topic, its
settings and its offsets.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

from ..net.client import connect
from .common import (
    CommandError,
    add_connection_options,
    description,
    fail_usage,
    parse_duration,
    positive_int,
    split_url,
    token_from,
    url_from,
    url_hint,
)
from .completion import COMPLETIONS
from .sub import broker_topics

USAGE = (
    "rsnet topics [URL] [--json] | rsnet topics create|alter [URL] TOPIC [--storage S] [--policy P] "
    "[--max-lag N] [--retention records=N,bytes=SIZE,age=DURATION] | rsnet topics delete|purge [URL] TOPIC --yes"
)
ACTIONS = ("create", "alter", "delete", "purge")
POLICIES = ("backpressure", "drop", "disconnect")

RETENTION = {"records": "max_records", "bytes": "max_bytes", "age": "max_age_s"}
"""``--retention`` names -> the broker's retention keys."""
RESETTABLE = {
    "storage": ["storage"],
    "policy": ["slow_subscriber.policy"],
    "max-lag": ["slow_subscriber.max_lag"],
    "records": ["retention.max_records"],
    "bytes": ["retention.max_bytes"],
    "age": ["retention.max_age_s"],
    "retention": ["retention.max_records", "retention.max_bytes", "retention.max_age_s"],
}
RESETTABLE["all"] = [key for keys in RESETTABLE.values() for key in keys if key != "storage"]
"""``--reset`` names -> the broker's keys (storage is fixed at creation: reset only if it changes nothing)."""

OPTION_OF = {
    "storage": "--storage",
    "slow_subscriber.policy": "--policy",
    "slow_subscriber.max_lag": "--max-lag",
    "retention.max_records": "--retention records",
    "retention.max_bytes": "--retention bytes",
    "retention.max_age_s": "--retention age",
}
"""The broker's keys -> the option that sets each (for messages)."""

_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(i?)B?", re.IGNORECASE)


def add_parser(commands: argparse._SubParsersAction) -> None:
    topics = commands.add_parser(
        "topics",
        help="list a broker's topics (offsets, lag, settings); create, alter, delete, purge one",
        usage=USAGE,
        description=description(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = topics.add_argument(
        "target", nargs="*", metavar="[ACTION] [URL] [TOPIC]", help="create, alter, delete or purge TOPIC; none: list"
    )
    setattr(target, COMPLETIONS, ACTIONS)  # offered by shell completion
    topics.add_argument("--json", action="store_true", help="one JSON object per topic (or the broker's answer)")
    topics.add_argument("--yes", action="store_true", help="delete or purge: yes, remove its records for good")
    settings = topics.add_argument_group("settings (create, alter)")
    settings.add_argument("--storage", choices=("memory", "durable"), help="create: keep it in memory or on disk")
    settings.add_argument("--policy", choices=POLICIES, help="what a subscriber more than --max-lag behind gets")
    settings.add_argument("--max-lag", type=positive_int, metavar="N", help="records a subscriber may lag behind")
    settings.add_argument(
        "--retention",
        type=retention,
        action="append",
        metavar="LIMITS",
        help="records=N,bytes=SIZE,age=DURATION (none: no limit); keys left out follow the broker's config",
    )
    settings.add_argument(
        "--reset",
        action="append",
        choices=sorted(RESETTABLE),
        metavar="NAME",
        help=f"alter: follow the broker's config again for NAME ({', '.join(sorted(RESETTABLE))})",
    )
    add_connection_options(topics)


def size(text: str) -> int:
    """Bytes: ``1048576``, ``500MB`` (powers of 1000), ``1GiB`` (powers of 1024)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"expected a size such as 1048576, 500MB or 1GiB, got {text!r}")
    amount, unit, binary = int(match[1]), match[2].upper(), match[3]
    return amount * (1024 if binary else 1000) ** " KMGT".index(unit or " ")


def retention(text: str) -> dict[str, Any]:
    """An argparse type for ``--retention``: ``records=N,bytes=SIZE,age=DURATION``, ``none`` = no limit."""
    limits: dict[str, Any] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name not in RETENTION:
            raise argparse.ArgumentTypeError(f"expected records=N, bytes=SIZE or age=DURATION, got {part.strip()!r}")
        value = value.strip()
        if value.lower() == "none":
            limits[RETENTION[name]] = None
            continue
        number: float
        try:
            if name == "records":
                number = int(value)
            elif name == "bytes":
                number = size(value)
            else:  # a duration, or a number of seconds
                seconds = parse_duration(value)
                if seconds is None and not re.fullmatch(r"\d+(\.\d+)?", value):
                    raise ValueError(f"expected a duration such as 90s, 12h or 7d, got {value!r}")
                number = float(value) if seconds is None else seconds
        except ValueError as error:
            message = f"expected a whole number, got {value!r}" if name == "records" else str(error)
            raise argparse.ArgumentTypeError(f"{name}: {message}") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"{name}: must be above 0 (none: no limit), got {value!r}")
        limits[RETENTION[name]] = number
    return limits


def asked_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the options give, nested as the broker's ``$admin`` takes them."""
    settings: dict[str, Any] = {}
    if args.storage is not None:
        settings["storage"] = args.storage
    slow = {key: value for key, value in (("policy", args.policy), ("max_lag", args.max_lag)) if value is not None}
    if slow:
        settings["slow_subscriber"] = slow
    limits: dict[str, Any] = {}
    for given in args.retention or []:
        limits.update(given)
    if limits:
        settings["retention"] = limits
    return settings


def setting_keys(settings: dict[str, Any]) -> set[str]:
    """The broker's keys (``slow_subscriber.policy``) of settings nested as :func:`asked_settings` gives them."""
    keys: set[str] = set()
    for top, value in settings.items():
        if isinstance(value, dict):
            keys.update(f"{top}.{inner}" for inner in value)
        else:
            keys.add(top)
    return keys


async def run(args: argparse.Namespace) -> int:
    if args.target and args.target[0] in ACTIONS:
        return await administer(args)
    misplaced = next((word for word in args.target if word in ACTIONS), None)
    if misplaced is not None:
        fail_usage(args, f"the action comes first: rsnet topics {misplaced} [URL] TOPIC")
    if args.target and "://" not in args.target[0]:
        fail_usage(
            args,
            f"unknown action {args.target[0]!r}: create, alter, delete or purge (or a URL, to list)"
            + url_hint(args.target[0]),
        )
    split_url(args, args.target, ())
    if asked_settings(args) or args.reset:
        fail_usage(args, "settings are for create and alter: rsnet topics create|alter TOPIC --policy ...")
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
        lags = [s["lag"] for s in info["subscribers"]]  # the furthest behind (BROKER.md)
        subscribers = info.get("subscriber_count", len(lags))
        print(
            f"{info['topic']:<32} {info['first_offset']:>10} {info['next_offset']:>10} {info['policy']:>12} "
            f"{subscribers:>5} {max(lags, default=0):>8} {info['dropped']:>8}"
        )
        if info.get("unavailable"):  # its stored log cannot be opened: refused (BROKER.md, $topics)
            print(f"  unavailable: {info['unavailable']}")
        print_settings(info)
        for cursor, offset in sorted(info.get("cursors", {}).items()):  # e.g. a Spark query's progress
            print(f"  cursor {cursor}: {offset} (lag {max(info['next_offset'] - offset, 0)})")
        for damage in info.get("damaged", []):  # records found damaged on disk (BROKER.md, OFFSET_DAMAGED)
            print(f"  damaged: offsets {damage['first']} to {damage['end'] - 1}: {damage['problem']}")
    return 0


async def administer(args: argparse.Namespace) -> int:
    action = args.target[0]
    command = f"topics {action}"
    split_url(args, args.target[1:], ("topic",), command)
    settings = asked_settings(args)
    params: dict[str, Any] = {"action": action, "topic": args.topic}
    if action in ("delete", "purge"):
        if settings or args.reset:
            fail_usage(args, f"{action} takes no settings (purge keeps the topic's)", command)
        if not args.yes:
            fail_usage(args, f"{action} removes every record of {args.topic!r} for good: add --yes", command)
    if action == "create" and args.reset:
        fail_usage(
            args, "--reset is for alter (a new topic follows the broker's config for what is not given)", command
        )
    if action == "alter":
        if not settings and not args.reset:
            fail_usage(
                args, "alter needs a setting to change (--policy, --max-lag, --retention) or --reset NAME", command
            )
        if args.reset:
            params["reset"] = sorted({key for name in args.reset for key in RESETTABLE[name]})
            # Both would reach the broker, and one would silently win over the other.
            given = setting_keys(settings)
            for name in args.reset:
                both = next((key for key in RESETTABLE[name] if key in given), None)
                if both is not None:
                    fail_usage(
                        args,
                        f"{OPTION_OF[both]} and --reset {name} name the same setting: set it or reset it, not both",
                        command,
                    )
    if settings:
        params["settings"] = settings
    async with connect(url_from(args), token=token_from(args)) as conn:
        answers = [a async for a in conn.subscribe("$admin", params)]
    answer = answers[0]
    if args.json:
        print(json.dumps(answer))
    elif action == "create":
        print(f"{args.topic}: {'created' if answer['created'] else 'exists already'}")
        print_settings(answer)
    elif action == "alter":
        changed = [key.rsplit(".", 1)[-1] for key in answer["changed"]]
        print(f"{args.topic}: {'altered (' + ', '.join(changed) + ')' if changed else 'unchanged'}")
        print_settings(answer)
    else:
        removed = answer["removed"]
        records = f"{removed} record{'s' if removed != 1 else ''} removed"
        if action == "delete":  # its offsets are kept too: a topic created under its name goes on
            print(
                f"{args.topic}: deleted ({records}; a topic created under its name starts at offset "
                f"{answer['next_offset']})"
            )
        else:
            print(f"{args.topic}: purged ({records}; the next record is offset {answer['next_offset']})")
    return 0


# -- showing settings ----------------------------------------------------------------------------


def show_size(value: int) -> str:
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if value % 1024**power == 0:
            return f"{value // 1024**power} {unit}"
    return f"{value} B"


def show_duration(seconds: float) -> str:
    if seconds != int(seconds) or seconds < 60:
        return f"{seconds:g}s"
    whole = int(seconds)
    parts = []
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= length:
            parts.append(f"{whole // length}{unit}")
            whole %= length
    return "".join(parts)


_SHOWN: dict[str, tuple[str, Callable[[Any], str]]] = {
    "storage": ("storage", str),
    "slow_subscriber.policy": ("policy", str),
    "slow_subscriber.max_lag": ("max_lag", str),
    "retention.max_records": ("max_records", str),
    "retention.max_bytes": ("max_bytes", show_size),
    "retention.max_age_s": ("max_age", show_duration),
}
"""How each key of the broker's settings is shown, in this order."""


def _label(source: str) -> str:
    return "set on the topic" if source == "topic" else source


def settings_line(info: dict[str, Any]) -> str | None:
    """``settings: policy drop, max_lag 5 (set on the topic); storage durable, ... (built-in)``:
    the effective settings of a ``$topics`` item (or an ``$admin`` answer), grouped by where
    they come from; None for a broker that does not report them."""
    settings, sources = info.get("settings"), info.get("settings_from")
    if not isinstance(settings, dict) or not isinstance(sources, dict):
        return None
    groups: dict[str, list[str]] = {}
    for key, (name, show) in _SHOWN.items():
        top, _, inner = key.partition(".")
        value = settings.get(top, {}).get(inner) if inner else settings.get(top)
        groups.setdefault(sources.get(key, "?"), []).append(f"{name} {'none' if value is None else show(value)}")
    order = sorted(groups, key=lambda source: source != "topic")  # what was set on the topic first
    return "settings: " + "; ".join(f"{', '.join(groups[source])} ({_label(source)})" for source in order)


def print_settings(info: dict[str, Any]) -> None:
    line = settings_line(info)
    if line is not None:
        print(f"  {line}")
    if info.get("settings_error"):
        print(f"  settings error: {info['settings_error']}")
