"""The test environment of the rsnet TCK: settings, recorded failures, test doubles, harness.

This is the trio port of ``org.reactivestreams.tck.TestEnvironment`` (Reactive Streams TCK
1.0.4) plus the harness every verification class shares (:class:`Verification`).

Timeouts
    Three settings, in milliseconds. Each verification class carries the defaults as class
    attributes; an environment variable, when set, overrides the attribute for the whole run:

    ========================  ===================================  =========================
    class attribute           environment variable                 used for
    ========================  ===================================  =========================
    ``timeout_ms`` (100)      ``RSNET_TCK_TIMEOUT_MS``             every wait for an expected
                                                                   signal
    ``no_signals_timeout_ms`` ``RSNET_TCK_NO_SIGNALS_TIMEOUT_MS``  how long the TCK watches for
    (None = timeout)                                               a signal that must not come
    ``gc_timeout_ms`` (300)   ``RSNET_TCK_GC_TIMEOUT_MS``          rule 3.13: how long after
                                                                   ``cancel`` the subscriber
                                                                   may still be referenced
    ========================  ===================================  =========================

Clock
    With ``virtual_time = True`` (the default) a test runs on
    ``trio.testing.MockClock(rate=1, autojump_threshold=0)``: whenever every task is blocked the
    clock jumps to the next deadline, so waiting out a timeout costs nothing and is
    deterministic; while some task stays busy the clock still advances with real time, so a
    runaway publisher cannot stall a wait forever. Virtual time is only sound when everything
    the code under test does happens in trio tasks; with threads, sockets or subprocesses the
    clock would jump while they work. Set ``virtual_time = False`` for those.

Asynchronous failures ("flops")
    A check that fails inside a signal method (``on_next`` called by the publisher under test)
    must not raise into the publisher. It is recorded with :meth:`TestEnvironment.flop`, and
    every test ends by raising the first recorded failure.

Threads
    Every TCK object is created on the trio thread of the test run and waited on there. The
    signal methods of the TCK's subscribers and the ``request``/``cancel`` of its subscriptions
    may be called from any thread: they wake waiting tasks through the run's trio token.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import (
    Any,
    ClassVar,
    Generic,
    NoReturn,
    TypeVar,
)

import pytest
import trio
import trio.testing

from rsnet.streams.interfaces import Publisher, Subscriber, Subscription
from rsnet.streams.rules import MAX_DEMAND

T = TypeVar("T")
V = TypeVar("V")
D = TypeVar("D", bound="float | None")

TEST_BUFFER_SIZE = 16
"""Elements an identity processor under test must be able to buffer (Java: TEST_BUFFER_SIZE)."""

RECEPTACLE_CAPACITY = 2 * TEST_BUFFER_SIZE
"""Undrained elements a :class:`ManualSubscriber` holds before it records an overflow."""

DEFAULT_TIMEOUT_MS = 100.0
DEFAULT_GC_TIMEOUT_MS = 300.0
TIMEOUT_ENV = "RSNET_TCK_TIMEOUT_MS"
NO_SIGNALS_TIMEOUT_ENV = "RSNET_TCK_NO_SIGNALS_TIMEOUT_MS"
GC_TIMEOUT_ENV = "RSNET_TCK_GC_TIMEOUT_MS"


def _env_ms(name: str, default: D) -> D | float:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        parsed = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of milliseconds") from None
    if parsed < 0:
        raise ValueError(f"{name}={value!r} must not be negative")
    return parsed


def _describe_caller() -> tuple[tuple[int, int | None], str]:
    """Identity and description of the thread and trio task running this code."""
    thread = threading.current_thread()
    try:
        task = trio.lowlevel.current_task()
    except RuntimeError:  # not on a trio thread
        return (thread.ident or 0, None), f"thread {thread.name!r}"
    return (thread.ident or 0, id(task)), f"task {task.name!r} on thread {thread.name!r}"


class _Notifier:
    """Wakes the tasks waiting for some state to change; ``notify`` is safe from any thread."""

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.get_ident()
        self._event = trio.Event()

    def notify(self) -> None:
        if threading.get_ident() == self._thread:
            self._wake()
        else:
            try:
                self._token.run_sync_soon(self._wake)
            except trio.RunFinishedError:
                pass  # the test run is over: nobody is waiting any more

    def _wake(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait_for(self, predicate: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``predicate()`` holds or the trio clock reaches ``deadline``."""
        while not predicate():
            if trio.current_time() >= deadline:
                return False
            event = self._event
            with trio.move_on_at(deadline):
                await event.wait()
        return True


class TestEnvironment:
    """Timeouts and recorded asynchronous failures of one test run.

    The verification classes create one per test (see :class:`Verification`); it is available
    as ``self.env`` while the test runs. Timeouts are in milliseconds; the ``*_s`` properties
    give seconds for trio.
    """

    __test__ = False  # a helper, not a pytest test class, despite its name

    def __init__(
        self,
        *,
        timeout_ms: float = DEFAULT_TIMEOUT_MS,
        no_signals_timeout_ms: float | None = None,
        gc_timeout_ms: float = DEFAULT_GC_TIMEOUT_MS,
    ) -> None:
        self.timeout_ms = timeout_ms
        self.no_signals_timeout_ms = timeout_ms if no_signals_timeout_ms is None else no_signals_timeout_ms
        self.gc_timeout_ms = gc_timeout_ms
        self.async_errors: list[AssertionError] = []

    @classmethod
    def from_environ(
        cls,
        *,
        timeout_ms: float = DEFAULT_TIMEOUT_MS,
        no_signals_timeout_ms: float | None = None,
        gc_timeout_ms: float = DEFAULT_GC_TIMEOUT_MS,
    ) -> TestEnvironment:
        """The given settings, each overridden by its environment variable when that is set.

        Raises ``ValueError`` for a variable that is not a non-negative number.
        """
        return cls(
            timeout_ms=_env_ms(TIMEOUT_ENV, timeout_ms),
            no_signals_timeout_ms=_env_ms(NO_SIGNALS_TIMEOUT_ENV, no_signals_timeout_ms),
            gc_timeout_ms=_env_ms(GC_TIMEOUT_ENV, gc_timeout_ms),
        )

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000

    @property
    def no_signals_timeout_s(self) -> float:
        return self.no_signals_timeout_ms / 1000

    @property
    def gc_timeout_s(self) -> float:
        return self.gc_timeout_ms / 1000

    def flop(self, message: str, cause: BaseException | None = None) -> AssertionError:
        """Record a failure found where raising is not allowed; return the recorded error.

        Used inside signal methods, which must return normally to the publisher under test
        (rule 2.13). The test fails when it ends, or earlier at a ``verify_no_async_errors*``.
        """
        error = AssertionError(message)
        error.__cause__ = cause
        self.async_errors.append(error)
        return error

    def verify_no_async_errors_no_delay(self) -> None:
        """Raise ``AssertionError`` for the first recorded failure, if any (mentioning the rest)."""
        if not self.async_errors:
            return
        first, *others = self.async_errors
        message = str(first)
        if others:
            listed = "\n".join(f"  - {error}" for error in others)
            message += f"\n(and {len(others)} more recorded failure(s):\n{listed})"
        raise AssertionError(message) from first.__cause__

    async def verify_no_async_errors(self, delay_ms: float | None = None) -> None:
        """Fail fast on recorded failures, wait ``delay_ms`` (default: no-signals timeout), check again."""
        self.verify_no_async_errors_no_delay()
        await trio.sleep((self.no_signals_timeout_ms if delay_ms is None else delay_ms) / 1000)
        self.verify_no_async_errors_no_delay()

    def deadline(self, timeout_ms: float | None = None) -> float:
        """The trio time ``timeout_ms`` (default: the signal timeout) from now."""
        return trio.current_time() + (self.timeout_ms if timeout_ms is None else timeout_ms) / 1000

    def ms(self, timeout_ms: float | None = None) -> str:
        """``timeout_ms`` (default: the signal timeout) for failure messages."""
        return f"{self.timeout_ms if timeout_ms is None else timeout_ms:g} ms"

    async def subscribe(
        self,
        publisher: Publisher[Any],
        subscriber: ManualSubscriber[Any],
        timeout_ms: float | None = None,
    ) -> None:
        """``publisher.subscribe(subscriber)`` and wait for ``on_subscribe`` (rule 1.9)."""
        publisher.subscribe(subscriber)
        await subscriber.subscription.expect_completion(
            f"Could not subscribe {subscriber!r} to Publisher {publisher!r}: on_subscribe was not called (rule 1.9)",
            timeout_ms,
        )
        self.verify_no_async_errors_no_delay()

    async def new_manual_subscriber(
        self, publisher: Publisher[T], timeout_ms: float | None = None
    ) -> ManualSubscriber[T]:
        """A :class:`ManualSubscriber` subscribed to ``publisher`` (no demand yet)."""
        subscriber: ManualSubscriber[T] = ManualSubscriber(self)
        await self.subscribe(publisher, subscriber, timeout_ms)
        return subscriber


class Latch:
    """A one-shot flag a test waits for, like Java's ``TestEnvironment.Latch``."""

    def __init__(self, env: TestEnvironment) -> None:
        self._env = env
        self._closed = False
        self._notifier = _Notifier()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._notifier.notify()

    def assert_open(self, message: str) -> None:
        """Record ``message`` as a failure if the latch is already closed (for signal methods)."""
        if self._closed:
            self._env.flop(message)

    def assert_closed(self, message: str) -> None:
        """Record ``message`` as a failure if the latch is still open (for signal methods)."""
        if not self._closed:
            self._env.flop(message)

    async def expect_close(self, message: str, timeout_ms: float | None = None) -> None:
        """Wait for :meth:`close`; raise ``AssertionError(message ...)`` on timeout."""
        if not await self._notifier.wait_for(lambda: self._closed, self._env.deadline(timeout_ms)):
            raise AssertionError(f"{message} within {self._env.ms(timeout_ms)}")


class Promise(Generic[V]):
    """A single value that arrives later, like Java's ``TestEnvironment.Promise``."""

    def __init__(self, env: TestEnvironment) -> None:
        self._env = env
        self._value: V | None = None
        self._completed = False
        self._notifier = _Notifier()

    @property
    def is_completed(self) -> bool:
        return self._completed

    @property
    def value(self) -> V:
        """The value; raises ``AssertionError`` before :meth:`complete`."""
        if not self._completed:
            raise AssertionError("Cannot access the value of a promise before its completion")
        return self._value  # type: ignore[return-value]  # _completed: complete() stored a V

    def complete(self, value: V) -> None:
        """Set the value; a second completion is recorded as a failure and ignored."""
        if self._completed:
            self._env.flop(
                f"Cannot complete a promise more than once! Present value: {self._value!r}, attempted to set: {value!r}"
            )
            return
        self._value = value
        self._completed = True
        self._notifier.notify()

    async def expect_completion(self, message: str, timeout_ms: float | None = None) -> V:
        """Wait for the value; raise ``AssertionError(message ...)`` on timeout."""
        if not await self._notifier.wait_for(lambda: self._completed, self._env.deadline(timeout_ms)):
            raise AssertionError(f"{message} within {self._env.ms(timeout_ms)}")
        return self.value


_END = object()
"""Marks ``on_complete`` in a :class:`Receptacle`."""


class _ErrorSignal:
    """Marks ``on_error`` in a :class:`Receptacle`, with the failure recorded for it."""

    __slots__ = ("error", "flop")

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.flop: AssertionError | None = None


def _describe(entry: object) -> str:
    if entry is _END:
        return "on_complete"
    if isinstance(entry, _ErrorSignal):
        return f"on_error({entry.error!r})"
    return f"on_next({entry!r})"


class Receptacle(Generic[T]):
    """Signals received and not yet consumed by the test: elements, then at most one terminal.

    Holds at most ``capacity`` undrained elements: more than that means the publisher emitted
    more than the test asked for (rule 1.1), which is recorded as a failure (the element is
    dropped, keeping memory bounded). ``capacity=None`` means unbounded. An ``on_error`` is also
    recorded as an unexpected failure until :meth:`expect_error` consumes it.
    """

    def __init__(self, env: TestEnvironment, capacity: int | None = RECEPTACLE_CAPACITY) -> None:
        self._env = env
        self._capacity = capacity
        self._entries: collections.deque[object] = collections.deque()
        self._elements = 0
        self._terminated = False
        self._overflowed = False
        self._lock = threading.Lock()  # the publisher under test may signal from another thread
        self._notifier = _Notifier()

    def add(self, element: T) -> None:
        with self._lock:
            if self._terminated:
                self._env.flop(f"Unexpected element {element!r} received after the stream terminated (rule 1.7)")
                return
            if self._capacity is not None and self._elements >= self._capacity:
                if not self._overflowed:  # once: a runaway publisher must not fill memory with these
                    self._overflowed = True
                    self._env.flop(
                        f"Received more than {self._capacity} undrained on_next signals (dropped {element!r} and "
                        "any further ones): the Publisher probably emitted more elements than requested (rule 1.1)"
                    )
                return
            self._elements += 1
            self._entries.append(element)
        self._notifier.notify()

    def _terminate(self, entry: object, description: str, cause: BaseException | None = None) -> None:
        with self._lock:
            if self._terminated:
                self._env.flop(f"Unexpected additional terminal signal {description} (rule 1.7)", cause)
                return
            self._terminated = True
            if isinstance(entry, _ErrorSignal):
                # Recorded before anyone can see the entry, so that expect_error always finds it.
                entry.flop = self._env.flop(f"Unexpected {description}", cause)
            self._entries.append(entry)
        self._notifier.notify()

    def complete(self) -> None:
        self._terminate(_END, "on_complete")

    def error(self, error: BaseException) -> None:
        self._terminate(_ErrorSignal(error), f"on_error({error!r})", error)

    def _pop(self) -> object:
        with self._lock:
            entry = self._entries.popleft()
            if entry is not _END and not isinstance(entry, _ErrorSignal):
                self._elements -= 1
            return entry

    def _consume_error(self, signal: _ErrorSignal) -> None:
        if signal.flop in self._env.async_errors:
            self._env.async_errors.remove(signal.flop)

    async def _next_entry(self, message: str, deadline: float, timeout_ms: float | None) -> object:
        if not await self._notifier.wait_for(lambda: bool(self._entries), deadline):
            raise AssertionError(f"{message} within {self._env.ms(timeout_ms)}")
        return self._pop()

    async def next(self, message: str, timeout_ms: float | None = None, deadline: float | None = None) -> T:
        """The next element; raises if a terminal signal or nothing comes first."""
        if deadline is None:
            deadline = self._env.deadline(timeout_ms)
        entry = await self._next_entry(message, deadline, timeout_ms)
        if entry is _END or isinstance(entry, _ErrorSignal):
            cause = entry.error if isinstance(entry, _ErrorSignal) else None
            raise AssertionError(f"{message}: expected an element but got {_describe(entry)}") from cause
        return entry  # type: ignore[return-value]  # neither _END nor an error signal: an element

    async def next_n(self, n: int, message: str, timeout_ms: float | None = None) -> list[T]:
        """The next ``n`` elements, all within one timeout."""
        deadline = self._env.deadline(timeout_ms)
        return [await self.next(f"{message} (got {i} of {n})", timeout_ms, deadline) for i in range(n)]

    async def next_or_end_of_stream(self, message: str, timeout_ms: float | None = None) -> T | None:
        """The next element, or ``None`` for ``on_complete`` (elements are never ``None``)."""
        entry = await self._next_entry(message, self._env.deadline(timeout_ms), timeout_ms)
        if entry is _END:
            return None
        if isinstance(entry, _ErrorSignal):
            raise AssertionError(
                f"{message}: expected an element or on_complete but got {_describe(entry)}"
            ) from entry.error
        return entry  # type: ignore[return-value]  # neither _END nor an error signal: an element

    async def expect_completion(self, message: str, timeout_ms: float | None = None) -> None:
        entry = await self._next_entry(message, self._env.deadline(timeout_ms), timeout_ms)
        if entry is not _END:
            cause = entry.error if isinstance(entry, _ErrorSignal) else None
            raise AssertionError(f"{message}: expected on_complete but got {_describe(entry)}") from cause

    async def expect_error(
        self, expected: type[BaseException], message: str, timeout_ms: float | None = None
    ) -> BaseException:
        """Wait for ``on_error`` of the ``expected`` type, skipping elements; consume its failure."""
        deadline = self._env.deadline(timeout_ms)
        while True:
            entry = await self._next_entry(message, deadline, timeout_ms)
            if entry is _END:
                raise AssertionError(f"{message}: got on_complete instead")
            if isinstance(entry, _ErrorSignal):
                if not isinstance(entry.error, expected):
                    raise AssertionError(
                        f"{message}: got {_describe(entry)}, but expected an instance of {expected.__name__}"
                    ) from entry.error
                self._consume_error(entry)
                return entry.error

    async def expect_none(self, message: str, timeout_ms: float | None = None) -> None:
        """Watch for ``timeout_ms`` (default: the no-signals timeout); raise if anything arrived."""
        await trio.sleep((self._env.no_signals_timeout_ms if timeout_ms is None else timeout_ms) / 1000)
        if self._entries:
            entry = self._pop()
            cause = entry.error if isinstance(entry, _ErrorSignal) else None
            raise AssertionError(f"{message} {_describe(entry)}") from cause

    def drain(self) -> list[object]:
        """Remove and return everything received so far, consuming recorded ``on_error`` failures."""
        entries = []
        while self._entries:
            entry = self._pop()
            if isinstance(entry, _ErrorSignal):
                self._consume_error(entry)
            entries.append(entry)
        return entries

    @staticmethod
    def is_element(entry: object) -> bool:
        """Whether an entry returned by :meth:`drain` is an element (not a terminal signal)."""
        return entry is not _END and not isinstance(entry, _ErrorSignal)


class ManualSubscriber(Subscriber[T]):
    """A subscriber the test steers: it records what it receives; the test requests and expects.

    Its signal methods never raise (rule 2.13): violations by the publisher (a signal before
    ``on_subscribe``, a second ``on_subscribe``, ``None`` elements, signals after the terminal one,
    more undrained elements than :data:`RECEPTACLE_CAPACITY`, an unexpected ``on_error``) are
    recorded with :meth:`TestEnvironment.flop`. The ``expect*``/``next*`` methods raise
    ``AssertionError`` when the expectation is not met within the timeout.
    """

    _numbers = itertools.count(1)

    def __init__(self, env: TestEnvironment) -> None:
        self.env = env
        self.subscription: Promise[Subscription] = Promise(env)
        self.received: Receptacle[T] = Receptacle(env)
        self._number = next(self._numbers)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} #{self._number}>"

    # -- signals ------------------------------------------------------------------------------

    def on_subscribe(self, subscription: Subscription) -> None:
        if subscription is None:
            self.env.flop(f"{self!r}.on_subscribe(None) was signalled (rule 2.13)")
        elif self.subscription.is_completed:
            self.env.flop(f"on_subscribe was called on an already-subscribed subscriber {self!r} (rules 1.9, 2.12)")
        else:
            self.subscription.complete(subscription)

    def _check_subscribed(self, signal: str, cause: BaseException | None = None) -> bool:
        if self.subscription.is_completed:
            return True
        self.env.flop(f"{self!r}.{signal} was called before on_subscribe (rule 1.9)", cause)
        return False

    def on_next(self, element: T) -> None:
        if not self._check_subscribed(f"on_next({element!r})"):
            return
        if element is None:
            self.env.flop(f"{self!r}.on_next(None) was signalled (rule 2.13)")
            return
        self.received.add(element)

    def on_error(self, error: BaseException) -> None:
        if self._check_subscribed(f"on_error({error!r})", error):
            self.received.error(error)

    def on_complete(self) -> None:
        if self._check_subscribed("on_complete()"):
            self.received.complete()

    # -- steering -----------------------------------------------------------------------------

    def request(self, n: int) -> None:
        self.subscription.value.request(n)

    def cancel(self) -> None:
        """Cancel the subscription, if there is one yet (tests cancel in ``finally`` blocks)."""
        if self.subscription.is_completed:
            self.subscription.value.cancel()

    # -- expectations -------------------------------------------------------------------------

    async def next_element(
        self, message: str = "Did not receive expected element", timeout_ms: float | None = None
    ) -> T:
        return await self.received.next(message, timeout_ms)

    async def next_elements(
        self,
        n: int,
        message: str = "Did not receive expected element or completion",
        timeout_ms: float | None = None,
    ) -> list[T]:
        return await self.received.next_n(n, message, timeout_ms)

    async def next_element_or_end_of_stream(
        self,
        message: str = "Did not receive expected stream completion",
        timeout_ms: float | None = None,
    ) -> T | None:
        """The next element, or ``None`` if the stream completed instead."""
        return await self.received.next_or_end_of_stream(message, timeout_ms)

    async def request_next_element(self, message: str = "Did not receive expected element") -> T:
        self.request(1)
        return await self.next_element(message)

    async def request_next_element_or_end_of_stream(
        self, message: str = "Did not receive expected stream completion"
    ) -> T | None:
        self.request(1)
        return await self.next_element_or_end_of_stream(message)

    async def request_end_of_stream(self, message: str = "Did not receive expected stream completion") -> None:
        self.request(1)
        await self.expect_completion(message)

    async def expect_next(self, expected: T, timeout_ms: float | None = None) -> None:
        element = await self.next_element("Did not receive expected element on downstream", timeout_ms)
        if element != expected:
            raise AssertionError(f"Expected element {expected!r} on downstream but received {element!r}")

    async def expect_completion(
        self,
        message: str = "Did not receive expected stream completion",
        timeout_ms: float | None = None,
    ) -> None:
        await self.received.expect_completion(message, timeout_ms)

    async def expect_error(
        self,
        expected: type[BaseException],
        message: str | None = None,
        timeout_ms: float | None = None,
    ) -> BaseException:
        return await self.received.expect_error(
            expected, message or f"Expected on_error({expected.__name__})", timeout_ms
        )

    async def expect_error_with_message(
        self, expected: type[BaseException], parts: list[str], message: str | None = None
    ) -> BaseException:
        """Like :meth:`expect_error`; the error's message must contain one of ``parts``."""
        error = await self.expect_error(expected, message)
        if not any(part in str(error) for part in parts):
            raise AssertionError(
                f"Got expected exception {type(error).__name__} but its message lacks any of {parts!r}, was: {error}"
            )
        return error

    async def expect_none(
        self, message: str = "Did not expect a signal but got", timeout_ms: float | None = None
    ) -> None:
        await self.received.expect_none(message, timeout_ms)


class BlackholeSubscriber(ManualSubscriber[T]):
    """A :class:`ManualSubscriber` that checks but discards elements, to drain a publisher."""

    def on_next(self, element: T) -> None:
        self._check_subscribed(f"on_next({element!r})")


class SubscriberProbe(Generic[T]):
    """Records what the subscriber under test reports receiving, for the test to expect.

    The subscriber under test calls the ``register_*`` methods (whitebox), or a TCK proxy in
    front of it does (blackbox).
    """

    def __init__(self, env: TestEnvironment, subscriber: Promise[Subscriber[Any]]) -> None:
        self.env = env
        self._subscriber = subscriber
        self.elements: Receptacle[T] = Receptacle(env)
        self.error: Promise[BaseException] = Promise(env)

    def _sub(self) -> object:
        return self._subscriber.value if self._subscriber.is_completed else "<subscriber>"

    def register_on_next(self, element: T) -> None:
        """The subscriber under test received ``on_next(element)``."""
        self.elements.add(element)

    def register_on_complete(self) -> None:
        """The subscriber under test received ``on_complete()``."""
        self.elements.complete()

    def register_on_error(self, error: BaseException) -> None:
        """The subscriber under test received ``on_error(error)``."""
        if self.error.is_completed:
            self.env.flop(
                f"{self._sub()!r} received on_error a second time, which is illegal (rule 1.7)",
                error,
            )
        else:
            self.error.complete(error)

    async def expect_next(self, expected: T) -> None:
        element = await self.elements.next(f"Subscriber {self._sub()!r} did not call register_on_next({expected!r})")
        if element != expected:
            raise AssertionError(
                f"Subscriber {self._sub()!r} called register_on_next({element!r}) rather than register_on_next({expected!r})"
            )

    async def expect_completion(self) -> None:
        await self.elements.expect_completion(f"Subscriber {self._sub()!r} did not call register_on_complete()")

    async def expect_error(self, expected: BaseException | type[BaseException] = BaseException) -> BaseException:
        """Wait for ``register_on_error``: the very ``expected`` error, or any instance of a type."""
        error = await self.error.expect_completion(f"Subscriber {self._sub()!r} did not call register_on_error")
        if isinstance(expected, BaseException) and error is not expected:
            raise AssertionError(
                f"Subscriber {self._sub()!r} called register_on_error({error!r}) rather than register_on_error({expected!r})"
            )
        if isinstance(expected, type) and not isinstance(error, expected):
            raise AssertionError(
                f"Subscriber {self._sub()!r} called register_on_error({error!r}), expected a {expected.__name__}"
            )
        return error

    async def expect_none(self) -> None:
        await self.elements.expect_none("Expected no further signal but got")


class ManualPublisher(Publisher[T]):
    """A publisher the test steers, for verifying subscribers (Java: ``ManualPublisher``).

    It accepts one subscriber, records its ``request`` calls and ``cancel``, and sends what the
    test tells it to. While it is calling ``on_complete``/``on_error`` it records any
    ``request``/``cancel`` of the subscriber as a failure (rule 2.3).
    """

    def __init__(self, env: TestEnvironment) -> None:
        self.env = env
        self.subscriber: Promise[Subscriber[T]] = Promise(env)
        self.requests: Receptacle[int] = Receptacle(env, capacity=None)
        self.cancelled = Latch(env)
        self._terminal_signal: str | None = None

    def subscribe(self, subscriber: Subscriber[T]) -> None:
        if subscriber is None:
            raise TypeError("rule 1.9: subscribe() requires a Subscriber, got None")
        if self.subscriber.is_completed:
            self.env.flop("ManualPublisher doesn't support more than one Subscriber")
            return
        self.subscriber.complete(subscriber)
        subscriber.on_subscribe(_ManualSubscription(self))

    def _check_not_in_terminal_signal(self, call: str) -> None:
        if self._terminal_signal is not None:
            self.env.flop(
                f"Subscription.{call} MUST NOT be called from Subscriber.{self._terminal_signal} (rule 2.3)! "
                f"(Subscriber: {self.subscriber.value!r})"
            )

    @property
    def sub(self) -> Subscriber[T]:
        return self.subscriber.value

    def send_next(self, element: T) -> None:
        self.sub.on_next(element)

    def send_completion(self) -> None:
        self._terminal_signal = "on_complete"
        try:
            self.sub.on_complete()
        finally:
            self._terminal_signal = None

    def send_error(self, error: BaseException) -> None:
        self._terminal_signal = "on_error"
        try:
            self.sub.on_error(error)
        finally:
            self._terminal_signal = None

    async def expect_request(
        self,
        message: str = "Did not receive expected `request` call",
        timeout_ms: float | None = None,
    ) -> int:
        """The next ``request(n)``; ``n <= 0`` is a failure of the subscriber (rule 3.9 is for them)."""
        n = await self.requests.next(message, timeout_ms)
        if n <= 0:
            raise AssertionError(f"Requests cannot be zero or negative but received request({n}) (rule 3.9)")
        return n

    async def expect_cancelling(self, timeout_ms: float | None = None) -> None:
        await self.cancelled.expect_close("Did not receive expected cancelling of upstream subscription", timeout_ms)

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_closed


class _ManualSubscription(Subscription):
    def __init__(self, publisher: ManualPublisher[Any]) -> None:
        self._publisher = publisher

    def request(self, n: int) -> None:
        self._publisher._check_not_in_terminal_signal(f"request({n})")
        self._publisher.requests.add(n)

    def cancel(self) -> None:
        self._publisher._check_not_in_terminal_signal("cancel()")
        self._publisher.cancelled.close()

    def __repr__(self) -> str:
        return f"<ManualSubscription of {self._publisher!r}>"


class _HelperPublisher(Publisher[T]):
    """The TCK's own source of elements, delivering asynchronously from a task per subscriber.

    Like the Java TCK's ``AsyncIterablePublisher``: ``create_element(i)`` for ``i`` in
    ``range(elements)`` (``MAX_DEMAND`` = endless), then ``on_complete``; demand saturates at
    ``MAX_DEMAND`` (rule 3.17); ``request(n <= 0)`` signals ``ValueError`` (rule 3.9); ``cancel``
    ends the task, which drops the subscriber (rule 3.13). Self-contained on purpose: the TCK
    must not depend on the code it verifies.
    """

    def __init__(self, nursery: trio.Nursery, elements: int, create_element: Callable[[int], T]) -> None:
        self._nursery = nursery
        self._elements = elements
        self._create_element = create_element

    def subscribe(self, subscriber: Subscriber[T]) -> None:
        if subscriber is None:
            raise TypeError("rule 1.9: subscribe() requires a Subscriber, got None")
        self._nursery.start_soon(_HelperSubscription(subscriber, self._elements, self._create_element).run)

    def __repr__(self) -> str:
        return f"<TCK helper publisher of {self._elements} elements>"


class _HelperSubscription(Subscription):
    def __init__(self, subscriber: Subscriber[T], elements: int, create_element: Callable[[int], T]) -> None:
        self._subscriber: Subscriber[T] | None = subscriber
        self._elements = elements
        self._create_element = create_element
        self._demand = 0
        self._invalid_request: ValueError | None = None
        self._notifier = _Notifier()

    def request(self, n: int) -> None:
        if n <= 0:
            self._invalid_request = ValueError(f"rule 3.9: non-positive subscription request: request({n})")
        else:
            self._demand = min(self._demand + n, MAX_DEMAND)
        self._notifier.notify()

    def cancel(self) -> None:
        self._subscriber = None
        self._notifier.notify()

    def _ready(self) -> bool:
        return self._subscriber is None or self._invalid_request is not None or self._demand > 0

    async def run(self) -> None:
        subscriber = self._subscriber
        assert subscriber is not None
        subscriber.on_subscribe(self)
        index = 0
        while self._subscriber is not None:
            if self._invalid_request is not None:
                self._subscriber = None
                subscriber.on_error(self._invalid_request)
            elif index == self._elements:
                self._subscriber = None
                subscriber.on_complete()
            elif self._demand == 0:
                await self._notifier.wait_for(self._ready, float("inf"))
            else:
                if self._demand != MAX_DEMAND:
                    self._demand -= 1
                subscriber.on_next(self._create_element(index))
                index += 1
                # One element per scheduling slice: asynchronous delivery, as a network would do.
                await trio.sleep(0)


def skip_untested(rule: str) -> NoReturn:
    """Skip a test the official TCK marks ``untested_`` (it has no check for that rule)."""
    pytest.skip(f"untested: not verified by this TCK (rule {rule})")


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


class Verification:
    """The harness every verification class shares: settings, clock, nursery, environment hook.

    A test method is a plain synchronous method that calls :meth:`run_test`, which runs an
    async body inside its own ``trio.run``. So pytest-trio is not involved, and a test can be
    called directly: ``MyVerification().test_required_spec309_...()`` returns normally, raises
    ``AssertionError`` on a violation, or raises pytest's skip exception.

    While a test runs, ``self.env`` is its :class:`TestEnvironment` and ``self.nursery`` a
    nursery for the tasks of the code under test (a producer task of a publisher, say); the
    nursery is cancelled when the test body ends. The factories (``create_publisher`` ...) are
    called inside the run, so they can use both.

    Subclasses are pytest test classes: they must not define ``__init__``; configure them with
    class attributes (settings) and methods (factories, :meth:`environment`).
    """

    virtual_time: ClassVar[bool] = True
    """Run on a trio MockClock that skips idle waits (see the module docstring)."""

    timeout_ms: ClassVar[float] = DEFAULT_TIMEOUT_MS
    """Wait for an expected signal this long; ``RSNET_TCK_TIMEOUT_MS`` overrides."""

    no_signals_timeout_ms: ClassVar[float | None] = None
    """Watch this long for a signal that must not come (None: ``timeout_ms``);
    ``RSNET_TCK_NO_SIGNALS_TIMEOUT_MS`` overrides."""

    gc_timeout_ms: ClassVar[float] = DEFAULT_GC_TIMEOUT_MS
    """Rule 3.13: a cancelled subscriber must be unreferenced after this long;
    ``RSNET_TCK_GC_TIMEOUT_MS`` overrides."""

    env: TestEnvironment
    nursery: trio.Nursery

    @asynccontextmanager
    async def environment(self) -> AsyncIterator[None]:
        """Entered inside ``trio.run`` before each test's nursery opens, exited after it is cancelled.

        Override to set up what the code under test needs for a test, e.g. start a server in
        a nursery of your own and connect a client that ``create_publisher`` then uses.
        """
        yield

    def run_test(self, body: Callable[[], Awaitable[None]], *, optional_rule: str | None = None) -> None:
        """Run ``body()`` in a fresh ``trio.run`` with :attr:`env` and :attr:`nursery` set.

        After the body, recorded asynchronous failures fail the test. Any exception other than
        ``AssertionError`` or a skip (say, a publisher raising from ``request``, or a task of the
        code under test crashing) becomes an ``AssertionError`` naming it. With
        ``optional_rule``, a failure becomes a skip: the implementation does not implement that
        OPTIONAL rule.
        """
        self.env = TestEnvironment.from_environ(
            timeout_ms=self.timeout_ms,
            no_signals_timeout_ms=self.no_signals_timeout_ms,
            gc_timeout_ms=self.gc_timeout_ms,
        )

        recorded_before_teardown = 0

        async def main() -> None:
            nonlocal recorded_before_teardown
            async with self.environment():
                async with trio.open_nursery() as nursery:
                    self.nursery = nursery
                    try:
                        await body()
                        self.env.verify_no_async_errors_no_delay()
                    finally:
                        # Cancelling the nursery may make producers signal on_error: not a verdict.
                        recorded_before_teardown = len(self.env.async_errors)
                        nursery.cancel_scope.cancel()

        clock = trio.testing.MockClock(rate=1.0, autojump_threshold=0) if self.virtual_time else None
        outcome: BaseException | None = None
        try:
            trio.run(main, clock=clock)
        except BaseException as error:
            outcome = error
        finally:
            self.__dict__.pop("nursery", None)  # closed now; fail loudly if used after the run
        if outcome is None:
            return
        failure = self._failure(outcome, self.env.async_errors[:recorded_before_teardown])
        if optional_rule is not None and isinstance(failure, AssertionError):
            pytest.skip(f"does not implement OPTIONAL requirement rule {optional_rule}: {failure}")
        raise failure

    def _failure(self, outcome: BaseException, recorded: list[AssertionError]) -> BaseException:
        """The one exception to raise for what ``trio.run`` raised, given the recorded failures."""
        leaves = list(_leaves(outcome))
        for leaf in leaves:
            if not isinstance(leaf, Exception) and not isinstance(leaf, pytest.skip.Exception):
                return leaf  # KeyboardInterrupt, a pytest-timeout failure ...: not ours to judge
        failures = [leaf for leaf in leaves if isinstance(leaf, Exception)]
        if not failures:
            return leaves[0]  # a skip
        primary = next((f for f in failures if isinstance(f, AssertionError)), failures[0])
        if isinstance(primary, NotImplementedError):
            return primary  # a factory of the verification is missing: a setup error, not a verdict
        if not isinstance(primary, AssertionError):
            wrapped = AssertionError(
                f"{type(primary).__name__} was raised while running the test: {primary} "
                "(code under test must not raise from subscribe, signal or subscription methods, "
                "but signal failures with on_error: rules 1.9, 2.13, 3.15, 3.16)"
            )
            wrapped.__cause__ = primary
            primary = wrapped
        for other in failures:
            if other is not primary and other is not primary.__cause__:
                primary.add_note(f"also raised during the test: {other!r}")
        recorded = [error for error in recorded if str(error) not in str(primary)]
        if not recorded:
            return primary
        # What was recorded on a signal path (an unexpected on_error, a signal before
        # on_subscribe ...) usually happened first and explains a later timeout: lead with it.
        message = f"{recorded[0]}\n(then the test failed: {primary})"
        if len(recorded) > 1:
            message += "\n(more failures recorded:\n" + "\n".join(f"  - {e}" for e in recorded[1:]) + ")"
        combined = AssertionError(message)
        combined.__cause__ = primary
        return combined


class _WithHelperPublisher(Generic[T]):
    """The element factory and helper publisher of the subscriber and processor verifications."""

    nursery: trio.Nursery

    def create_element(self, element: int) -> T:
        """The element the TCK sends as number ``element`` (0, 1, ...); never ``None`` (rule 2.13)."""
        raise NotImplementedError(f"{type(self).__name__} must implement create_element(element)")

    def create_helper_publisher(self, elements: int) -> Publisher[T]:
        """The source of the elements sent to the subscriber under test.

        ``elements == MAX_DEMAND`` means endless. The default delivers ``create_element(i)``
        asynchronously from a task in ``self.nursery``; override to use another source.
        """
        return _HelperPublisher(self.nursery, elements, self.create_element)
