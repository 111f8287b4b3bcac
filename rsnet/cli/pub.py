"""``rsnet pub``: publish lines from stdin to a broker topic, as they arrive.

    rsnet pub [URL] TOPIC [--raw] [--value-field F] [--producer ID] [--sequence N] [--quiet]

Each non-blank line is one record: a JSON value (any but ``null``), or with ``--raw`` the
line itself as a string. Lines are read and published as they arrive (``tail -f app.log |
rsnet pub ...`` works): the broker's demand is the only brake, so a line is read from stdin
only when the broker asked for another record. The command exits when stdin ends and every
record is acknowledged (stored under the topic's fsync policy): exit 0. Otherwise exit 1
(130 after Ctrl-C) with one line that says exactly which lines were stored and how to send
the rest again without duplicates (the same ``--producer`` and ``--sequence``: the broker
drops sequences it already has).

Ctrl-C stops reading, waits for the acknowledgements of what was already sent, reports, and
exits 130; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import trio

from ..errors import HandshakeError, RsnetError, StreamError
from ..net.client import Client, connect
from ..protocol import DEFAULT_MAX_FRAME_SIZE, ErrorCode
from ..streams import from_async_iterable
from .common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    add_connection_options,
    describe,
    description,
    say,
    split_url,
    token_from,
    url_from,
)
from .progress import Progress
from .sub import broker_topics

USAGE = "rsnet pub [URL] TOPIC [options] < lines"

READ_SIZE = 65536
"""Bytes asked of stdin per read: a read returns what is there, so a slow writer's line is
published at once and a fast one's arrive in blocks."""

MAX_LINE = DEFAULT_MAX_FRAME_SIZE - 1024
"""Bytes a line may have (a record must fit in one frame); the memory bound of the reader."""


def not_a_broker(refusal: StreamError) -> bool:
    """Whether a refusal of the offer or of its ``$acks`` (whichever came first) came from a
    server that is no broker: rsnet.Server's (or a bare session's) words for a name it has no
    sink or publisher for; a broker has ``$acks``, and creates the topic or refuses it in its
    own words (``tests/cli`` holds them to it)."""
    return refusal.message.startswith(("no sink named", "nothing accepts offers named", "no publisher named '$acks'"))


REFUSED_FOR_GOOD = (ErrorCode.UNAUTHORIZED, ErrorCode.UNKNOWN_PUBLISHER, ErrorCode.REJECTED)
"""Refusals a resend meets again (a token without the grant, a topic the broker will not
create): the closing line then does not offer one."""

_INT_RANGE = (-(2**63), 2**64 - 1)  # what msgpack (and so the wire protocol) can carry


def add_parser(commands: argparse._SubParsersAction) -> None:
    pub = commands.add_parser(
        "pub",
        help="publish lines from stdin to a broker topic (JSON, or --raw text)",
        usage=USAGE,
        description=description(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pub.add_argument("target", nargs="+", metavar="[URL] TOPIC", help="broker URL (optional) and topic")
    pub.add_argument("--raw", action="store_true", help="each line is a string record, not JSON")
    pub.add_argument("--value-field", metavar="F", help="publish field F of each JSON object line, not the whole line")
    pub.add_argument("--producer", help="producer id: republishing with the same id and sequences is idempotent")
    pub.add_argument("--sequence", type=int, default=0, help="sequence number of the first record (default 0)")
    pub.add_argument("-q", "--quiet", action="store_true", help="no progress line, no summary")
    add_connection_options(pub)


class InvalidLine(Exception):
    def __init__(self, number: int, message: str) -> None:
        super().__init__(f"line {number}: {message}")
        self.number = number


def _check_value(value: Any, where: str = "") -> None:
    """Refuse what the wire cannot carry, before anything of it is sent."""
    if value is None:
        raise ValueError(f"null{where} is not a record (a record is any JSON value except null)")
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        raise ValueError(f"the integer{where} does not fit in 64 bits")
    if isinstance(value, list):
        for index, inner in enumerate(value):
            if inner is not None:
                _check_value(inner, f" at [{index}]")
    elif isinstance(value, dict):
        for key, inner in value.items():
            if inner is not None:
                _check_value(inner, f" at {key!r}")


def parse_line(text: bytes, number: int, args: argparse.Namespace) -> Any:
    """The record a line stands for; InvalidLine says why not."""
    try:
        line = text.decode()
    except UnicodeDecodeError as error:
        raise InvalidLine(number, f"not UTF-8 ({error.reason} at byte {error.start})") from None
    if args.raw:
        return line.removesuffix("\r")
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        raise InvalidLine(number, f"not JSON (--raw publishes each line as a string): {error}") from None
    if args.value_field is not None:
        if not isinstance(value, dict) or args.value_field not in value:
            raise InvalidLine(number, f"no field {args.value_field!r} in this line")
        value = value[args.value_field]
    try:
        _check_value(value)
    except ValueError as error:
        raise InvalidLine(number, str(error)) from None
    return value


class StopReading:
    """Ends :func:`read_lines` from another task (Ctrl-C), even in the middle of a read."""

    def __init__(self) -> None:
        self.stopped = False
        self._scope: trio.CancelScope | None = None

    def stop(self) -> None:
        self.stopped = True
        if self._scope is not None:
            self._scope.cancel()


async def read_lines(fd: int, stop: StopReading) -> AsyncIterator[tuple[int, bytes]]:
    """``(number, line)`` for each non-blank line of ``fd``, as soon as it is complete (the
    last one also without its newline). Each read runs in a worker thread, so a terminal, a
    pipe and a regular file all work; ``stop`` ends the reading (Ctrl-C)."""
    pending = b""
    number = 0
    while not stop.stopped:
        chunk = b""
        with trio.CancelScope() as stop._scope:
            chunk = await trio.to_thread.run_sync(os.read, fd, READ_SIZE, abandon_on_cancel=True)
        stop._scope = None
        if not chunk:
            break
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            number += 1
            if line.strip():
                yield number, line
        if len(pending) > MAX_LINE:
            raise InvalidLine(number + 1, f"longer than {MAX_LINE} bytes (a record must fit in one frame)")
    if pending.strip() and not stop.stopped:  # a last line without its newline (not one cut by Ctrl-C)
        yield number + 1, pending


class Ledger:
    """What was sent and what the broker acknowledged, by sequence and input line.

    Holds the line numbers of records sent and not yet acknowledged only: at most what the
    broker has requested and not yet stored, so its size is bounded by the broker's demand."""

    def __init__(self, first_sequence: int) -> None:
        self.first_sequence = first_sequence
        self.next_sequence = first_sequence
        self.acked = first_sequence - 1  # the highest sequence acknowledged
        self.first_line: int | None = None
        self.last_read_line = 0  # the line of the last record read (sent or about to be)
        self.last_acked_line: int | None = None
        self.unacked: collections.deque[tuple[int, int]] = collections.deque()  # (sequence, line)
        self.changed = trio.Event()

    @property
    def sent(self) -> int:
        return self.next_sequence - self.first_sequence

    @property
    def stored(self) -> int:
        return self.acked - self.first_sequence + 1

    def record_sent(self, line: int) -> None:
        if self.first_line is None:
            self.first_line = line
        self.last_read_line = line
        self.unacked.append((self.next_sequence, line))
        self.next_sequence += 1

    def acknowledge(self, sequence: int) -> None:
        self.acked = max(self.acked, sequence)
        while self.unacked and self.unacked[0][0] <= self.acked:
            self.last_acked_line = self.unacked.popleft()[1]
        self.changed.set()
        self.changed = trio.Event()

    def account(self, topic: str, producer: str, rest_unread: bool = False, resend: bool = True) -> str:
        """Which lines were stored, and how to resend the rest, for the closing line;
        ``rest_unread``: stdin did not end, so the lines after the last one sent are to send too;
        not ``resend``: the broker refused for good (a resend would be refused the same way)."""
        if self.stored <= 0:
            text = f"nothing was stored in {topic}"
        else:
            lines = (
                f"line {self.first_line}"
                if self.first_line == self.last_acked_line
                else f"lines {self.first_line}-{self.last_acked_line}"
            )
            text = f"{self.stored} record{'s' if self.stored != 1 else ''} stored in {topic} ({lines})"
        if not resend:
            return text
        if self.unacked:
            line = self.unacked[0][1]
            text += (
                f"; from line {line} on not confirmed: resend from line {line} with "
                f"--producer {producer} --sequence {self.acked + 1} (no duplicates)"
            )
        elif rest_unread:
            line = self.last_read_line + 1
            text += (
                f"; lines from {line} on were not sent: send them with "
                f"--producer {producer} --sequence {self.acked + 1} (no duplicates)"
            )
        return text


async def run(args: argparse.Namespace) -> int:
    split_url(args, args.target, ("topic",))
    producer = args.producer or f"rsnet-pub-{uuid.uuid4().hex[:12]}"
    ledger = Ledger(args.sequence)
    progress = Progress("pub", quiet=args.quiet)
    progress.extra = lambda: f"{len(ledger.unacked):,} awaiting acknowledgement"
    invalid: list[InvalidLine] = []
    stop_reading = StopReading()
    interrupted = stdin_ended = False

    async def records() -> AsyncIterator[Any]:
        nonlocal stdin_ended
        try:
            async for number, line in read_lines(sys.stdin.fileno(), stop_reading):
                record = parse_line(line, number, args)
                ledger.record_sent(number)
                progress.count = ledger.sent
                yield record
            stdin_ended = not stop_reading.stopped
        except InvalidLine as error:
            invalid.append(error)  # stop here: what was read before it is still published

    async def watch_acks(acks: Any, task_status: trio.TaskStatus[None]) -> None:
        async with acks:
            task_status.started()
            async for ack in acks:
                ledger.acknowledge(ack["sequence"])

    async def on_ctrl_c() -> None:
        nonlocal interrupted
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                if interrupted:
                    raise KeyboardInterrupt  # the second Ctrl-C: leave at once
                interrupted = True
                progress.clear()
                say(
                    "pub", "interrupted: stopped reading; waiting for what was sent to be stored (Ctrl-C again to quit)"
                )
                stop_reading.stop()

    failure: BaseException | None = None
    growth: int | None = None  # how far the topic's next offset moved while we published
    try:
        async with connect(url_from(args), token=token_from(args)) as conn:
            before = await next_offset(conn, args.topic)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(on_ctrl_c)
                if progress.enabled:
                    nursery.start_soon(progress.run)
                acks = conn.subscribe("$acks", {"producer": producer, "topic": args.topic}, prefetch=16)
                await nursery.start(watch_acks, acks)
                source = from_async_iterable(records, nursery=nursery)
                await conn.offer(args.topic, source, {"producer": producer, "sequence": args.sequence})
                while ledger.acked < ledger.next_sequence - 1:
                    await ledger.changed.wait()
                nursery.cancel_scope.cancel()
            after = await next_offset(conn, args.topic)
            if before is not None and after is not None:
                growth = after - before
    except* (RsnetError, OSError) as group:
        failure = group.exceptions[0]
        while isinstance(failure, BaseExceptionGroup):
            failure = failure.exceptions[0]
    progress.clear()
    refused = isinstance(failure, StreamError | HandshakeError) and failure.code in REFUSED_FOR_GOOD
    # An invalid line stops the reading too: it and the lines after it are the rest to send.
    rest_unread = bool(invalid) or (failure is not None and not stdin_ended)
    account = ledger.account(args.topic, producer, rest_unread=rest_unread, resend=not refused)
    if isinstance(failure, StreamError) and failure.code == ErrorCode.UNKNOWN_PUBLISHER and not_a_broker(failure):
        say("pub", f"{url_from(args)} is not a broker ({failure.message}); nothing was stored")
        return EXIT_FAILED
    if failure is not None:
        say("pub", f"not every record was acknowledged: {describe(failure)}; {account}")
        return EXIT_FAILED
    if invalid:
        say("pub", f"{invalid[0]}; stopped there: {account}")
        return EXIT_FAILED
    if interrupted:
        say("pub", f"interrupted: {account}")
        return EXIT_INTERRUPTED
    acknowledged = min(ledger.stored, ledger.sent)  # (an earlier run may have stored more)
    if growth is not None and growth < acknowledged:
        # Fewer new offsets than records acknowledged: the broker had some of them already
        # under this producer and these sequences, and stores each (producer, sequence) once.
        # (With other producers publishing meanwhile the topic can grow as much anyway: this
        # says so only where it is certain.)
        say(
            "pub",
            f"{acknowledged} record{'s' if acknowledged != 1 else ''} acknowledged, but the topic "
            f"{args.topic} grew by only {growth}: the broker had records of producer {producer} with "
            "these sequences already and stores each once (new data: another --producer, or "
            "--sequence after the last one stored)",
        )
        return 0
    if not args.quiet:
        progress.summary(f"stored in {args.topic}")
    return 0


async def next_offset(conn: Client, topic: str) -> int | None:
    """``topic``'s next offset as ``$topics`` says it (0 for a topic that does not exist yet),
    or None where it will not say (no broker, no grant to read the topic)."""
    try:
        topics = await broker_topics(conn, topic)
    except StreamError:
        return None
    if topics is None:
        return None
    info = topics.get(topic)
    return 0 if info is None else int(info["next_offset"])
