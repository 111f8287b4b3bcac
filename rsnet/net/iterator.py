"""What ``conn.subscribe(...)`` returns: an async iterator over a remote publisher's items whose
demand follows a policy of :mod:`rsnet.client_rules` (adaptive within a byte budget by
default, a fixed ``prefetch`` on request), the same policy the blocking client drives.

It is the Reactive Streams subscriber of the stream and the consumer's iterator in one:

- the session's reader hands it each received batch with the bytes it took on the wire
  (``on_next_sized``), which the policy sizes its window by; the protocol has already refused
  anything beyond the demand granted (FLOW_CONTROL, rule 1.1) or ``None`` (rule 2.13), so
  nothing here can hold more items than were requested;
- the consumer takes buffered items without yielding to the scheduler; every
  ``CANCEL_CHECK_INTERVAL`` items at most, and whenever the buffer is empty, it reaches a
  *tick*: the items taken since the last tick go to the policy (one call per run of items,
  never per item), what it asks for is requested, and the iterator checks for cancellation
  (and yields once per request, so a fast stream cannot starve the rest of the program).
  Ticks land exactly where the policy's next top-up is due (:meth:`until_due`), so demand
  on the wire is the same as if every item were counted one by one;
- an empty buffer while the stream is open is a wait: the policy hears of it (``starved``).
  Where the session lends it the socket (:meth:`rsnet.net.session.Session.lend_socket`), the
  waiting task reads the connection itself until its stream's next signal, so an answer
  reaches it without a hand-over from the reader task;
- closed from another task (``aclose``), the stream is cancelled and the task waiting for
  its next item stops waiting: its loop ends.

``limit``: the policy never requests more than ``limit`` items, so once that many were taken
the stream is done: the iterator cancels it and stops.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import trio

from ..client_rules import Demand
from ..protocol import MAX_INT
from ..streams import Publisher, Subscriber, Subscription
from ..streams.rules import check_signal_argument, validate_subscription
from .session import Session

CANCEL_CHECK_INTERVAL = 64
"""Buffered items handed out between two ticks (cancellation checks) at most."""


class StreamIterator(Subscriber[Any]):
    """``async for item in conn.subscribe(...)``: a remote error is raised from the loop;
    leaving early (or ``async with`` around it) cancels the stream. Subscribes on first use."""

    def __init__(self, publisher: Publisher[Any], demand: Demand, limit: int | None = None) -> None:
        self._publisher: Publisher[Any] | None = publisher
        self._demand = demand
        self._left = MAX_INT if limit is None else limit  # items the limit still allows
        self._queue: deque[Any] = deque()
        self._subscription: Subscription | None = None
        self._terminal = False  # completed, failed, or cancelled by us
        self._error: BaseException | None = None
        self._waiting: trio.lowlevel.Task | None = None  # the consumer, while it waits
        # The session whose streams this one is one of, if it is (where the consumer may read
        # in the reader's place while it waits: Session.lend_socket), and whether it does.
        self._session: Session | None = None
        self._reading = False
        # Items that may be handed out before the next tick; ``_run`` is what the countdown
        # started from, so ``_run - _countdown`` were handed out since the last tick.
        self._run = self._countdown = 1
        if limit == 0:
            self._publisher = None
            self._terminal = True  # nothing to take: the stream is never opened

    # -- the subscriber side, called by the session's reader ---------------------------------------

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self._subscription, subscription, wanted=not self._terminal):
            return  # rule 2.5, or we were closed before the stream opened
        self._subscription = subscription
        session = getattr(subscription, "session", None)
        self._session = session if isinstance(session, Session) else None
        if self._demand.initial:
            subscription.request(self._demand.initial)

    @property
    def buffered(self) -> int:
        """Items received and not yet taken: the next as many ``__anext__`` return without
        waiting for the network."""
        return len(self._queue)

    @property
    def consumer_waiting(self) -> bool:
        """Whether a task waits in ``__anext__`` for the next signal (the session's reader
        lets it run before reading on)."""
        return self._waiting is not None

    def on_next_sized(self, items: list[Any], nbytes: int) -> None:
        """A received batch, in order, and its wire bytes (``Items.nbytes``; 0: unknown)."""
        if self._terminal:
            return  # rule 2.8: in flight when we cancelled
        self._queue.extend(items)
        self._demand.received(len(items), nbytes)
        self._wake()

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        self.on_next_sized([item], 0)

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        self._terminate(error)

    def on_complete(self) -> None:
        self._terminate(None)

    def _terminate(self, error: BaseException | None) -> None:
        if not self._terminal:
            self._terminal = True
            self._error = error
            self._wake()

    def _wake(self) -> None:
        task = self._waiting
        if task is not None:
            self._waiting = None
            trio.lowlevel.reschedule(task)

    def _abort_wait(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        self._waiting = None  # cancelled while waiting: nothing is to wake it any more
        return trio.lowlevel.Abort.SUCCEEDED

    # -- the iterator side ------------------------------------------------------------------------

    def __aiter__(self) -> StreamIterator:
        return self

    async def __anext__(self) -> Any:
        queue = self._queue
        if queue:
            countdown = self._countdown - 1
            if countdown:
                # The fast path: a buffered item, no tick due.
                self._countdown = countdown
                return queue.popleft()
        return await self._next_slow()

    async def _next_slow(self) -> Any:
        if self._publisher is not None:
            publisher, self._publisher = self._publisher, None
            publisher.subscribe(self)
        # The tick: the items the fast path handed out since the last one (none, after a wait).
        handed_out = self._run - self._countdown
        requested = self._taken(handed_out) if handed_out else False
        self._run = self._countdown = 1
        queue = self._queue
        waited = False
        while not queue:
            if self._left == 0:
                self._cancel()  # every item the limit allows was taken
            if self._terminal:
                if self._error is not None:
                    # A consumer whose scope was cancelled hears of that, not of the stream's
                    # end, which the cancel may have caused (its connection closing under it).
                    await trio.lowlevel.checkpoint_if_cancelled()
                    raise self._error
                raise StopAsyncIteration
            self._demand.starved()
            if self._waiting is not None or self._reading:
                raise trio.BusyResourceError("another task is already waiting for this stream's next item")
            session = self._session
            if session is not None and session.lend_socket():
                # This task reads the connection until the stream's next signal: no hand-over
                # from the reader on the way (Session.lend_socket).
                self._reading = True
                try:
                    await session.read_in_place(self._signalled)
                finally:
                    self._reading = False
            else:
                # Parked by hand rather than on a trio.Event: making, waiting on and setting an
                # Event (and its ParkingLot) for every wait cost 0.8 us more per hand-over from
                # the reader, on the path of every first item (9.0 against 8.3 us, hot, two tasks).
                self._waiting = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(self._abort_wait)
            waited = True
        if not waited:
            await trio.lowlevel.checkpoint_if_cancelled()
        item = queue.popleft()
        # Once the stream's end has come (with its last items, as a request-response's answer
        # does), no demand is left to account for: the policy is not asked (0.8 us of such an
        # answer's latency), and the rest of the buffer goes with a cancellation check every
        # CANCEL_CHECK_INTERVAL items, as ever.
        if not self._terminal and self._taken(1):
            requested = True
        if requested:
            await trio.lowlevel.cancel_shielded_checkpoint()  # once per request: let others run
        self._run = self._countdown = (
            CANCEL_CHECK_INTERVAL if self._terminal else max(1, min(CANCEL_CHECK_INTERVAL, self._demand.until_due()))
        )
        return item

    def _signalled(self) -> bool:
        """An item is buffered, or the stream ended."""
        return bool(self._queue) or self._terminal

    def _taken(self, count: int) -> bool:
        """``count`` (> 0) items were handed out: tell the policy, request what it asks for."""
        self._left -= count
        wanted = self._demand.consumed(count)
        if wanted and not self._terminal:
            self._subscription.request(wanted)  # type: ignore[union-attr]  # on_subscribe ran: items came
            return True
        return False

    async def aclose(self) -> None:
        """Cancel the stream unless it already ended. Idempotent."""
        self._cancel()
        await trio.lowlevel.checkpoint()

    def _cancel(self) -> None:
        self._publisher = None
        if not self._terminal:
            self._terminal = True
            self._queue.clear()
            if self._subscription is not None:
                self._subscription.cancel()
            # Closed from another task: the one waiting for the next item stops waiting (the
            # loop ends), at once if parked, and if it reads in the reader's place, at the
            # next bytes that arrive, which a PING asks the peer for.
            self._wake()
            if self._reading and self._session is not None:
                self._session.ask_for_bytes()

    async def __aenter__(self) -> StreamIterator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # Abandoned mid-stream by a plain ``async for ... break``: cancel, so the server stops
        # sending and the stream's slot is freed.
        self._cancel()
