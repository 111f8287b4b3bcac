"""``rsnet sub``: subscribe to a publisher or a broker topic and print what arrives.

    rsnet sub [URL] NAME [-p key=value ...] [--from POSITION] [--until-end] [--count N]
              [--format json|value|raw|TEMPLATE] [--prefetch N] [--quiet]

Exit 0 when the stream completes, ``--count`` items arrived, ``--until-end`` reached the end
of the topic, or the reader of stdout went away; 1 with one line on stderr when the stream
fails (the line names the error code).

Broker topics (``rsnet broker``) take ``--from``: ``earliest``, ``latest`` (the broker's
default), an offset, ``-N`` (the last N records), a duration (``10m``: records of the last
ten minutes; ``ms``, ``s``, ``m``, ``h``, ``d``, combinable as ``1h30m``), an ISO time
(``2026-11-22T10:00:00Z``; without a zone, local time) or ``{"timestamp": MS}`` as JSON.
Before subscribing to a topic, the broker's ``$topics`` is read once: to place ``-N`` and
``--until-end`` and to say so on stderr when the topic does not exist yet (with the closest
existing names), instead of waiting silently.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import difflib
import errno
import json
import os
import re
import select
import stat
import sys
import time
from collections.abc import Callable
from typing import Any

import trio

from ..broker.names import is_wildcard
from ..errors import StreamError
from ..net.client import Client, connect
from ..protocol import ErrorCode, text_keys
from ..streams import Subscriber, Subscription
from .common import (
    CommandError,
    add_connection_options,
    description,
    parse_duration,
    positive_int,
    say,
    split_url,
    token_from,
    url_from,
)
from .completion import COMPLETIONS
from .progress import Progress

USAGE = "rsnet sub [URL] NAME [options]"

FIELDS = ("topic", "offset", "timestamp", "time", "value")
"""The fields a ``--format`` template may name: a topic record's, and ``time``."""

FLUSH_INTERVAL = 0.05
"""Seconds printed lines may wait in stdout's buffer: output is written in blocks, yet a
reader (``| head``, a terminal) sees each line within this time."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    sub = commands.add_parser(
        "sub",
        help="subscribe and print items (JSON lines by default)",
        usage=USAGE,
        description=description(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.add_argument("target", nargs="+", metavar="[URL] NAME", help="server URL (optional) and publisher or topic")
    sub.add_argument(
        "-p", "--param", type=param, action="append", default=[], help="key=value (value as JSON if it parses)"
    )
    sub.add_argument(
        "--from",
        dest="start",
        type=position,
        default=None,
        metavar="POSITION",
        help="where a topic subscription starts (see above)",
    )
    sub.add_argument(
        "-e",
        "--until-end",
        action="store_true",
        help="exit at the end of the topic as it was when the command started (kcat -e)",
    )
    sub.add_argument("-c", "--count", type=positive_int, default=None, help="exit after N items (N >= 1)")
    formats = sub.add_argument(
        "-f",
        "--format",
        type=format_spec,
        default="json",
        help=f"json (default), value, raw, or a template like '{{offset}} {{value}}' (fields: {' '.join(FIELDS)})",
    )
    setattr(formats, COMPLETIONS, ["json", "value", "raw"])  # offered, templates taken too
    sub.add_argument(
        "--prefetch",
        type=positive_int,
        default=None,
        help="items in flight at most (default: adaptive, within a 4 MiB budget; see the README's Demand)",
    )
    sub.add_argument("-q", "--quiet", action="store_true", help="no progress line on a terminal, no notices")
    add_connection_options(sub)


def param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(value)  # numbers, booleans, lists... as JSON
    except json.JSONDecodeError:
        return key, value  # anything else is a string


class Before:
    """``--from -N``: the last N records of a topic (placed once its end is known)."""

    def __init__(self, count: int) -> None:
        self.count = count


def position(text: str) -> Any:
    """An argparse type for ``--from`` (see the module docstring)."""
    text = text.strip()
    if text in ("earliest", "latest"):
        return text
    if re.fullmatch(r"\d+", text):
        return int(text)
    if re.fullmatch(r"-\d+", text):
        return Before(int(text[1:]))
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {error}") from None
        if not isinstance(value, dict) or set(value) != {"timestamp"} or type(value["timestamp"]) is not int:
            raise argparse.ArgumentTypeError(f'expected {{"timestamp": MILLISECONDS}}, got {text}')
        return value
    seconds = parse_duration(text)
    if seconds is not None:
        return {"timestamp": int((time.time() - seconds) * 1000)}
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'{text!r}: expected earliest, latest, an offset, -N, a duration (10m), an ISO time or {{"timestamp": MS}}'
        ) from None
    return {"timestamp": int(moment.timestamp() * 1000)}  # a naive time is local time


# -- output ------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(value).decode()}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json(value: Any) -> str:
    try:
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    except TypeError:  # a map with a binary key (SPEC 3): its base64 text, as JSON keys are strings
        return json.dumps(text_keys(value), default=_json_default, ensure_ascii=False)


def _text(value: Any) -> str:
    """A value as plain text: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else _json(value)


def format_spec(text: str) -> str:
    """An argparse type for ``--format``: ``json``, ``value``, ``raw``, or a template naming
    only :data:`FIELDS` (a misspelled field would print an empty line per item)."""
    if text in ("json", "value", "raw"):
        return text
    fields = re.findall(r"{(\w+)}", text)
    if not fields:
        raise argparse.ArgumentTypeError(f"{text!r}: expected json, value, raw or a template with {{fields}}")
    unknown = next((field for field in fields if field not in FIELDS), None)
    if unknown is not None:
        close = difflib.get_close_matches(unknown, FIELDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise argparse.ArgumentTypeError(
            f"{text!r}: unknown field {unknown!r}{hint}; the fields are {', '.join(FIELDS)}"
        )
    return text


def formatter(spec: str) -> Callable[[Any], bytes]:
    """How one item is printed, for a ``spec`` :func:`format_spec` accepted: ``json`` (the
    whole item), ``value`` (a topic record's value as JSON; other items whole), ``raw`` (the
    value as text, binary values as their bytes), or a template whose ``{field}``s are the
    record's fields as text (``time``: the timestamp as an ISO time in UTC)."""

    def value_of(item: Any) -> Any:
        return item["value"] if _is_record(item) else item

    if spec == "json":
        return lambda item: (_json(item) + "\n").encode()
    if spec == "value":
        return lambda item: (_json(value_of(item)) + "\n").encode()
    if spec == "raw":

        def raw(item: Any) -> bytes:
            value = value_of(item)
            return bytes(value) + b"\n" if isinstance(value, (bytes, bytearray)) else (_text(value) + "\n").encode()

        return raw
    fields = re.findall(r"{(\w+)}", spec)

    def template(item: Any) -> bytes:
        record = item if isinstance(item, dict) else {"value": item}
        values = {name: _text(record.get(name, "")) for name in fields}
        if "time" in fields and isinstance(record.get("timestamp"), int):
            moment = datetime.datetime.fromtimestamp(record["timestamp"] / 1000, datetime.UTC)
            values["time"] = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return (re.sub(r"{(\w+)}", lambda match: values[match[1]], spec) + "\n").encode()

    return template


def _is_record(item: Any) -> bool:
    return isinstance(item, dict) and "offset" in item and "value" in item and "topic" in item


async def _flush_often(out: Any) -> None:
    while True:
        await trio.sleep(FLUSH_INTERVAL)
        out.flush()


async def _watch_for_closed_pipe(fd: int) -> None:
    """Raise BrokenPipeError as soon as the reader of the pipe ``fd`` goes away (``| head -3``
    on a quiet topic must end now, not at the next record). The write end of a pipe never
    becomes readable; the kernel reports an error on it when the last reader closes, which
    wakes ``wait_readable``. Does nothing for a terminal or a file."""
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return
    poller = select.poll()
    poller.register(fd, select.POLLERR)
    while True:
        await trio.lowlevel.wait_readable(fd)
        if poller.poll(0):
            raise BrokenPipeError(errno.EPIPE, "the reader of stdout went away")
        await trio.sleep(FLUSH_INTERVAL)  # woken without an error: do not spin


# -- the broker's topics -----------------------------------------------------------------------


async def broker_topics(conn: Client, match: str | None = None) -> dict[str, dict[str, Any]] | None:
    """``$topics`` as ``{name: info}`` (only the topics ``match``, a name or pattern, names), or
    None when the server is not a broker. The broker refuses a ``match`` that is no valid name
    (REJECTED) or a topic the token may not read (UNAUTHORIZED)."""
    params = None if match is None else {"match": match}
    try:
        return {info["topic"]: info async for info in conn.subscribe("$topics", params)}
    except StreamError as error:
        if error.code == ErrorCode.UNKNOWN_PUBLISHER:
            return None
        raise


class Refusal(Subscriber[Any]):
    """A stream opened with no demand, only to hear whether the server refuses it: the refusal
    is an ERROR in place of ACCEPT (SPEC 7.2), which the server writes as it processes the
    SUBSCRIBE, and it processes a connection's frames in order (SPEC 7.5). So once a stream
    opened after this one has had its answer, the refusal, if any, has arrived: :meth:`check`
    then raises it, or cancels the stream (it had no demand, so no item was sent)."""

    def __init__(self) -> None:
        self.subscription: Subscription | None = None
        self.error: BaseException | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        self.subscription = subscription

    def on_next(self, item: Any) -> None:  # never called: nothing was requested
        pass

    def on_error(self, error: BaseException) -> None:
        self.error = error

    def on_complete(self) -> None:
        pass

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.subscription is not None:
            self.subscription.cancel()


async def _last_timestamp(conn: Client, topic: str, end: int) -> int:
    async with conn.subscribe(topic, {"from": end - 1}, prefetch=1) as records:
        async for record in records:
            return int(record["timestamp"])
    return 0


def _closest(name: str, topics: dict[str, dict[str, Any]]) -> str:
    """The existing topic names closest to ``name``, as ``" (did you mean 'a', 'b'?)"``; empty
    if none is close (or ``name`` is a pattern)."""
    if is_wildcard(name):
        return ""
    close = difflib.get_close_matches(name, list(topics), n=3)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


async def _plan(
    conn: Client, args: argparse.Namespace, matching: dict[str, dict[str, Any]]
) -> tuple[Any, dict[str, int] | None]:
    """The ``from`` to subscribe with and, for ``--until-end``, the end offset of each topic
    that has something to read, from the ``matching`` topics' listing; also tells the user
    about a topic that does not exist."""
    name, start = args.name, args.start
    if not matching and not args.quiet:
        closest = "" if is_wildcard(name) else _closest(name, await broker_topics(conn) or {})
        if args.until_end:
            nothing = f"no topic matches {name!r}" if is_wildcard(name) else f"topic {name!r} does not exist"
            say("sub", f"{nothing}: nothing to read{closest}")
        elif is_wildcard(name):
            say("sub", f"no topic matches {name!r} yet: waiting for one to be created")
        else:
            # Not "waiting": a broker configured with subscribe_missing = "fail" refuses instead
            # (UNKNOWN_PUBLISHER, said on the next line), and only the broker knows which.
            say("sub", f"topic {name!r} does not exist yet{closest}")
    if isinstance(start, Before):
        if is_wildcard(name):
            raise CommandError(f"--from -{start.count} needs one topic, not the pattern {name!r}")
        info = matching.get(name)
        start = "earliest" if info is None else max(info["first_offset"], info["next_offset"] - start.count)
    if not args.until_end:
        return start, None
    ends: dict[str, int] = {}
    for topic, info in matching.items():
        first, end = info["first_offset"], info["next_offset"]
        if isinstance(start, int) and start < first:
            ends[topic] = end  # removed (retention, a purge), even from an empty topic: the broker says so
            continue
        if start in (None, "latest") or first >= end:
            continue
        if isinstance(start, int) and start >= end:
            continue
        if isinstance(start, dict) and await _last_timestamp(conn, topic, end) < start["timestamp"]:
            continue
        ends[topic] = end
    return start, ends


# -- the command -------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> int:
    split_url(args, args.target, ("name",))
    params = dict(args.param)
    write = formatter(args.format)
    progress = Progress("sub", quiet=args.quiet)
    out = sys.stdout.buffer
    received = 0
    async with connect(url_from(args), token=token_from(args)) as conn:
        ends: dict[str, int] | None = None
        # Only the topics the name or pattern covers; a name the broker refuses (not valid, or
        # not readable with this token) fails here, with its code, as the subscription would.
        # A pattern is listed whatever the token's grants (as the topics the token may read),
        # and --until-end may find nothing to read and never subscribe: a probe opened before
        # the listing hears the broker's refusal of the subscription (UNAUTHORIZED) by its end.
        probe = None
        if args.until_end and is_wildcard(args.name):
            probe = Refusal()
            given = {} if args.start is None or isinstance(args.start, Before) else {"from": args.start}
            conn.publisher(args.name, {**params, **given}).subscribe(probe)
        topics = None if args.name.startswith("$") else await broker_topics(conn, match=args.name)
        if probe is not None and topics is not None:  # (not a broker: --until-end is refused below)
            probe.check()
        start = args.start
        if topics is not None:
            start, ends = await _plan(conn, args, topics)
            if ends is not None and not ends:
                return 0  # --until-end and nothing to read
        elif start is not None or args.until_end:
            raise CommandError(f"--from and --until-end are for broker topics; {conn.peer} is not a broker")
        if start is not None:
            params["from"] = start
        remaining = dict(ends) if ends is not None else None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_flush_often, out)
            nursery.start_soon(_watch_for_closed_pipe, out.fileno())
            if progress.enabled:
                nursery.start_soon(progress.run)
            async with conn.subscribe(args.name, params, prefetch=args.prefetch) as items:
                async for item in items:
                    if remaining is not None and ends is not None:
                        topic, offset = item["topic"], item["offset"]
                        end = ends.get(topic, 0)
                        if offset >= end - 1:  # (a record after a skip may be past it)
                            remaining.pop(topic, None)
                        if offset >= end:  # past the end this command reads to
                            if not remaining:
                                break
                            continue
                    out.write(write(item))
                    received += 1
                    progress.count = received
                    if received == args.count or remaining == {}:
                        break
            out.flush()
            nursery.cancel_scope.cancel()
    if progress.enabled:
        progress.summary("received")
    return 0
