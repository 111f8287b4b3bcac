"""Tests of rsnet.tck.PublisherVerification itself.

Two obviously-correct reference publishers (synchronous and asynchronous) must pass every
required test; deliberately broken publishers must each be caught by the test that targets the
rule they break.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

from rsnet.streams.interfaces import Publisher, Subscriber, Subscription
from rsnet.streams.rules import MAX_DEMAND
from rsnet.tck import PublisherVerification
from rsnet.tck.report import run_directly

# -- reference publishers ----------------------------------------------------------------------


def _invalid_request(n: int) -> ValueError:
    return ValueError(f"rule 3.9: non-positive subscription request: request({n})")


class RangeSubscription(Subscription):
    def __init__(self, subscriber: Subscriber[int], count: int) -> None:
        self.subscriber: Subscriber[int] | None = subscriber  # None once cancelled or terminated
        self.index = 0
        self.count = count
        self.demand = 0
        self.invalid: ValueError | None = None
        self.draining = False

    def request(self, n: int) -> None:
        if self.subscriber is None:
            return  # rule 3.6
        if n <= 0:
            self.invalid = _invalid_request(n)  # signalled, never raised (rule 3.9)
        else:
            self.demand = min(self.demand + n, MAX_DEMAND)  # saturates (rule 3.17)
        self.drain()

    def cancel(self) -> None:
        self.subscriber = None  # no further signals (3.12), no reference kept (3.13)

    def fail(self, error: BaseException) -> None:
        subscriber, self.subscriber = self.subscriber, None
        if subscriber is not None:
            subscriber.on_error(error)

    def drain(self) -> None:
        if self.draining:
            return  # called from a signal below: the running loop sees the new state (rule 3.3)
        self.draining = True
        try:
            while (subscriber := self.subscriber) is not None:
                if self.invalid is not None:
                    self.fail(self.invalid)
                elif self.index == self.count:
                    self.subscriber = None
                    subscriber.on_complete()
                elif self.demand == 0:
                    return
                else:
                    if self.demand != MAX_DEMAND:
                        self.demand -= 1
                    self.index += 1
                    subscriber.on_next(self.index - 1)
        finally:
            self.draining = False


class RangePublisher(Publisher[int]):
    """Synchronous: signals 0..count-1 on the caller's stack, from subscribe() and request()."""

    subscription_type: type[RangeSubscription] = RangeSubscription  # broken variants swap it

    def __init__(self, count: int, error: BaseException | None = None) -> None:
        self._count = count
        self._error = error

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        if subscriber is None:
            raise TypeError("subscribe(None)")
        subscription = self.subscription_type(subscriber, self._count)
        subscriber.on_subscribe(subscription)
        if self._error is not None:
            subscription.fail(self._error)
        else:
            subscription.drain()  # an empty range completes without any demand (rule 1.5)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._count}>"




class AsyncRangePublisher(Publisher[int]):
    """Asynchronous: one producer task per subscriber, in the test's nursery."""

    def __init__(self, nursery: trio.Nursery, count: int, error: BaseException | None = None) -> None:
        self._nursery = nursery
        self._count = count
        self._error = error

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        if subscriber is None:
            raise TypeError("subscribe(None)")
        self._nursery.start_soon(AsyncRangeSubscription(subscriber, self._count, self._error).run)

    def __repr__(self) -> str:
        return f"<AsyncRangePublisher of {self._count}>"


class AsyncRangeSubscription(Subscription):
    def __init__(self, subscriber: Subscriber[int], count: int, error: BaseException | None) -> None:
        self._subscriber: Subscriber[int] | None = subscriber
        self._count = count
        self._error = error
        self._demand = 0
        self._changed = trio.Event()

    def request(self, n: int) -> None:
        if n <= 0:
            self._error = _invalid_request(n)
        else:
            self._demand = min(self._demand + n, MAX_DEMAND)
        self._changed.set()

    def cancel(self) -> None:
        self._subscriber = None
        self._changed.set()  # wake the task so that it ends and lets go of the subscriber

    async def run(self) -> None:
        subscriber = self._subscriber
        assert subscriber is not None
        subscriber.on_subscribe(self)
        index = 0
        while self._subscriber is not None:
            if self._error is not None:
                self._subscriber = None
                subscriber.on_error(self._error)
            elif index == self._count:
                self._subscriber = None
                subscriber.on_complete()
            elif self._demand == 0:
                await self._changed.wait()
                self._changed = trio.Event()
            else:
                if self._demand != MAX_DEMAND:
                    self._demand -= 1
                index += 1
                subscriber.on_next(index - 1)
                await trio.sleep(0)


class TestRangePublisher(PublisherVerification[int]):
    def create_publisher(self, elements: int) -> Publisher[int]:
        return RangePublisher(elements)

    def create_failed_publisher(self) -> Publisher[int]:
        return RangePublisher(0, RuntimeError("failed range"))


class TestAsyncRangePublisher(PublisherVerification[int]):
    def create_publisher(self, elements: int) -> Publisher[int]:
        return AsyncRangePublisher(self.nursery, elements)

    def create_failed_publisher(self) -> Publisher[int]:
        return AsyncRangePublisher(self.nursery, 0, RuntimeError("failed range"))


class TestAsyncRangePublisherRealTime(TestAsyncRangePublisher):
    """The same on the real clock, as a networked publisher would run."""

    virtual_time = False


@pytest.mark.parametrize("verification", [TestRangePublisher, TestAsyncRangePublisher])
def test_reference_publishers_pass_every_required_test(verification: type[PublisherVerification[int]]) -> None:
    outcomes = run_directly(verification)
    required = {name: outcome for name, outcome in outcomes.items() if name.startswith("test_required_")}
    assert len(required) == 22
    assert all(outcome == "passed" for outcome in required.values()), required
    statuses = {outcome for name, outcome in outcomes.items() if not name.startswith("test_untested_")}
    assert statuses == {"passed"}  # the optional and stochastic ones too


# -- deliberately broken publishers ------------------------------------------------------------


class OverEmittingSubscription(RangeSubscription):
    """Rule 1.1: delivers one element more than requested."""

    def request(self, n: int) -> None:
        super().request(n + 1 if n > 0 else n)


class RaisingOnInvalidRequestSubscription(RangeSubscription):
    """Rule 3.9: raises for request(n <= 0) instead of signalling on_error."""

    def request(self, n: int) -> None:
        if n <= 0:
            raise _invalid_request(n)
        super().request(n)


class SignallingAndRaisingOnInvalidRequestSubscription(RangeSubscription):
    """Rules 3.9 and 3.16: signals on_error for request(n <= 0), then raises it anyway."""

    def request(self, n: int) -> None:
        super().request(n)
        if n <= 0:
            raise _invalid_request(n)


class WrongErrorOnInvalidRequestSubscription(RangeSubscription):
    """Rule 3.9: signals an error that is not a ValueError."""

    def request(self, n: int) -> None:
        if n <= 0:
            self.fail(RuntimeError(f"bad request({n})"))
        else:
            super().request(n)


class RecursingSubscription(RangeSubscription):
    """Rule 3.3: no drain loop, so request() from on_next nests on_next without bound."""

    def request(self, n: int) -> None:
        self.demand += n
        while (subscriber := self.subscriber) is not None and self.demand > 0 and self.index < self.count:
            self.demand -= 1
            self.index += 1
            subscriber.on_next(self.index - 1)


class IgnoringCancelSubscription(RangeSubscription):
    """Rules 3.6, 3.13: cancel() does nothing."""

    def cancel(self) -> None:
        pass


class WrappingDemandSubscription(RangeSubscription):
    """Rule 3.17: demand as a Java long without saturation, wrapping to negative on overflow."""

    def request(self, n: int) -> None:
        if self.subscriber is None:
            return
        if n <= 0:
            self.invalid = _invalid_request(n)
        else:
            self.demand = (self.demand + n + 2**63) % 2**64 - 2**63
        if self.demand >= 0:
            self.drain()


class ErroringOnDemandOverflowSubscription(RangeSubscription):
    """Rule 3.17: signals an error instead of saturating when demand exceeds MAX_DEMAND."""

    def request(self, n: int) -> None:
        if self.subscriber is not None and self.demand != MAX_DEMAND and self.demand + n > MAX_DEMAND:
            self.fail(OverflowError("demand overflow"))
        else:
            super().request(n)


class EmittingAfterCompleteSubscription(RangeSubscription):
    """Rule 1.7: keeps its subscriber after on_complete and completes again on request."""

    def drain(self) -> None:
        subscriber = self.subscriber
        super().drain()
        if self.index == self.count and self.subscriber is None:
            self.subscriber = subscriber


class NoOnSubscribePublisher(RangePublisher):
    """Rule 1.9: never calls on_subscribe."""

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        if subscriber is None:
            raise TypeError("subscribe(None)")


class DoubleOnSubscribePublisher(RangePublisher):
    """Rules 1.9, 2.12: calls on_subscribe twice."""

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        super().subscribe(subscriber)
        subscriber.on_subscribe(RangeSubscription(subscriber, 0))


class ReferenceKeepingPublisher(RangePublisher):
    """Rule 3.13: remembers every subscriber forever."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.subscribers: list[Subscriber[int]] = []

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        self.subscribers.append(subscriber)
        super().subscribe(subscriber)


class NoneAcceptingPublisher(RangePublisher):
    """Rule 1.9: subscribe(None) returns normally."""

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        if subscriber is not None:
            super().subscribe(subscriber)


class ThreadedSignallingSubscription(RangeSubscription):
    """Rule 1.3: request() signals on_next from a new thread and waits for it.

    So a request() made inside on_next runs the next on_next on another thread while the first
    one is still running: overlapping signals, deterministically.
    """

    def request(self, n: int) -> None:
        if self.subscriber is None or self.index == self.count:
            return
        self.demand += n
        worker = threading.Thread(target=self._emit)
        worker.start()
        worker.join()

    def _emit(self) -> None:
        subscriber = self.subscriber
        if subscriber is None or self.demand == 0:
            return
        self.demand -= 1
        self.index += 1
        subscriber.on_next(self.index - 1)
        if self.index == self.count:
            self.subscriber = None
            subscriber.on_complete()


def _publisher_with(subscription_type: type[RangeSubscription]) -> type[RangePublisher]:
    return type(f"RangePublisherWith{subscription_type.__name__}", (RangePublisher,), {"subscription_type": subscription_type})


def _verification(publisher_type: type[RangePublisher]) -> type[PublisherVerification[int]]:
    class BrokenVerification(PublisherVerification[int]):
        def create_publisher(self, elements: int) -> Publisher[int]:
            return publisher_type(elements)

        def create_failed_publisher(self) -> Publisher[int]:
            return RangePublisher(0, RuntimeError("failed range"))

    return BrokenVerification


BROKEN_PUBLISHERS = {
    "over-emits": _publisher_with(OverEmittingSubscription),
    "raises on request(0)": _publisher_with(RaisingOnInvalidRequestSubscription),
    "signals and raises on request(0)": _publisher_with(SignallingAndRaisingOnInvalidRequestSubscription),
    "wrong error type on request(0)": _publisher_with(WrongErrorOnInvalidRequestSubscription),
    "recurses": _publisher_with(RecursingSubscription),
    "ignores cancel": _publisher_with(IgnoringCancelSubscription),
    "wraps demand": _publisher_with(WrappingDemandSubscription),
    "errors on demand overflow": _publisher_with(ErroringOnDemandOverflowSubscription),
    "emits after complete": _publisher_with(EmittingAfterCompleteSubscription),
    "no on_subscribe": NoOnSubscribePublisher,
    "on_subscribe twice": DoubleOnSubscribePublisher,
    "keeps subscriber references": ReferenceKeepingPublisher,
    "subscribe(None) accepted": NoneAcceptingPublisher,
    "signals concurrently": _publisher_with(ThreadedSignallingSubscription),
}
