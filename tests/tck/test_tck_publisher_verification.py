"""Tests of rsnet.tck.PublisherVerification itself.

Two obviously-correct reference publishers (synchronous and asynchronous) must pass every
required test; deliberately broken publishers must each be caught by the test that targets the
rule they break.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from rsnet.streams.interfaces import Publisher, Subscriber, Subscription
from rsnet.streams.rules import MAX_DEMAND
from rsnet.tck import PublisherVerification
from rsnet.tck.report import summarize_directly

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


class ThreadedRangePublisher(Publisher[int]):
    """Signals from a thread of its own per subscriber, serially (rule 1.3), never from trio."""

    def __init__(self, count: int, error: BaseException | None = None) -> None:
        self._count = count
        self._error = error

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        if subscriber is None:
            raise TypeError("subscribe(None)")
        subscription = ThreadedRangeSubscription(subscriber, self._count, self._error)
        # A daemon: a test that ends with a subscription still open must not hang the process.
        threading.Thread(target=subscription.run, daemon=True).start()

    def __repr__(self) -> str:
        return f"<ThreadedRangePublisher of {self._count}>"


class ThreadedRangeSubscription(Subscription):
    def __init__(self, subscriber: Subscriber[int], count: int, error: BaseException | None) -> None:
        self._subscriber: Subscriber[int] | None = subscriber
        self._count = count
        self._error = error
        self._demand = 0
        self._changed = threading.Condition()

    def request(self, n: int) -> None:
        with self._changed:
            if n <= 0:
                self._error = _invalid_request(n)
            else:
                self._demand = min(self._demand + n, MAX_DEMAND)
            self._changed.notify()

    def cancel(self) -> None:
        with self._changed:
            self._subscriber = None
            self._changed.notify()

    def run(self) -> None:
        subscriber = self._subscriber
        assert subscriber is not None
        subscriber.on_subscribe(self)
        index = 0
        while True:
            with self._changed:
                while (
                    self._subscriber is not None and self._error is None and index < self._count and self._demand == 0
                ):
                    self._changed.wait()
                if self._subscriber is None:
                    return
                error = self._error
                if error is not None or index == self._count:
                    self._subscriber = None
                elif self._demand != MAX_DEMAND:
                    self._demand -= 1
            # Signal without holding the lock: the subscriber may call request() right back.
            if error is not None:
                subscriber.on_error(error)
            elif index == self._count:
                subscriber.on_complete()
            else:
                index += 1
                subscriber.on_next(index - 1)


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


class TestThreadedRangePublisher(PublisherVerification[int]):
    """Signals arrive from foreign threads: virtual time would jump while they run."""

    virtual_time = False

    def create_publisher(self, elements: int) -> Publisher[int]:
        return ThreadedRangePublisher(elements)

    def create_failed_publisher(self) -> Publisher[int]:
        return ThreadedRangePublisher(0, RuntimeError("failed range"))


@pytest.mark.parametrize("verification", [TestRangePublisher, TestAsyncRangePublisher])
def test_reference_publishers_pass_every_required_test(
    verification: type[PublisherVerification[int]],
) -> None:
    summary = summarize_directly(verification)
    assert summary.required_not_passed == []
    assert summary.counts["required"] == {"passed": 22}
    # The optional and stochastic tests pass too; the untested ones are always skipped.
    assert summary.counts["optional"] == {"passed": 8}
    assert summary.counts["stochastic"] == {"passed": 1}
    assert summary.counts["untested"] == {"skipped": 7}


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
    """Rule 3.3: no reentrancy guard, so request() from on_next nests on_next without bound."""

    def drain(self) -> None:
        self.draining = False
        super().drain()


class IgnoringCancelSubscription(RangeSubscription):
    """Rules 3.6, 3.13: cancel() does nothing."""

    def cancel(self) -> None:
        pass


class WrappingDemandSubscription(RangeSubscription):
    """Rule 3.17: demand kept like a Java long without saturation: it wraps, and then a
    negative value means no demand, so the stream stalls."""

    def request(self, n: int) -> None:
        if self.subscriber is not None and n > 0:
            self.demand = max(0, (self.demand + n + 2**63) % 2**64 - 2**63)
            self.drain()
        else:
            super().request(n)


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
    return type(
        f"RangePublisherWith{subscription_type.__name__}",
        (RangePublisher,),
        {"subscription_type": subscription_type},
    )


def _verification_of(publisher_type: type[RangePublisher]) -> type[PublisherVerification[int]]:
    class BrokenPublisherVerification(PublisherVerification[int]):
        def create_publisher(self, elements: int) -> Publisher[int]:
            return publisher_type(elements)

        def create_failed_publisher(self) -> Publisher[int]:
            return RangePublisher(0, RuntimeError("failed range"))

    return BrokenPublisherVerification


@pytest.mark.parametrize(
    ("publisher_type", "test_name", "explanation"),
    [
        pytest.param(
            _publisher_with(OverEmittingSubscription),
            "test_required_spec101_subscription_request_must_result_in_the_correct_number_of_produced_elements",
            "produced unrequested (rule 1.1): on_next(1)",
            id="over-emits",
        ),
        pytest.param(
            _publisher_with(RaisingOnInvalidRequestSubscription),
            "test_required_spec309_request_zero_must_signal_illegal_argument",
            "request(0) raised ValueError",
            id="raises-on-request-0",
        ),
        pytest.param(
            _publisher_with(RaisingOnInvalidRequestSubscription),
            "test_required_spec309_request_negative_number_must_signal_illegal_argument",
            "raised ValueError",
            id="raises-on-negative-request",
        ),
        pytest.param(
            _publisher_with(SignallingAndRaisingOnInvalidRequestSubscription),
            "test_required_spec309_request_zero_must_signal_illegal_argument",
            "rule 3.16 requires request to return normally",
            id="signals-and-raises-on-request-0",
        ),
        pytest.param(
            _publisher_with(WrongErrorOnInvalidRequestSubscription),
            "test_required_spec309_request_zero_must_signal_illegal_argument",
            "got on_error(RuntimeError('bad request(0)')), but expected an instance of ValueError",
            id="wrong-error-on-request-0",
        ),
        pytest.param(
            _publisher_with(RecursingSubscription),
            "test_required_spec303_must_not_allow_unbounded_recursion",
            "Got 2 nested on_next calls",
            id="recurses",
        ),
        pytest.param(
            _publisher_with(IgnoringCancelSubscription),
            "test_required_spec306_after_subscription_is_cancelled_request_must_be_nops",
            "signalled after cancel() and request() (rule 3.6): on_next(0)",
            id="ignores-cancel",
        ),
        pytest.param(
            _publisher_with(WrappingDemandSubscription),
            "test_required_spec317_must_not_signal_on_error_when_pending_above_long_max_value",
            "stopped signalling after 2 element(s)",
            id="wraps-demand",
        ),
        pytest.param(
            _publisher_with(ErroringOnDemandOverflowSubscription),
            "test_required_spec317_must_not_signal_on_error_when_pending_above_long_max_value",
            "Unexpected on_error(OverflowError('demand overflow'))",
            id="errors-on-demand-overflow",
        ),
        pytest.param(
            _publisher_with(EmittingAfterCompleteSubscription),
            "test_required_spec107_must_not_emit_further_signals_once_on_complete_has_been_signalled",
            "Unexpected additional terminal signal on_complete (rule 1.7)",
            id="emits-after-complete",
        ),
        pytest.param(
            NoOnSubscribePublisher,
            "test_required_spec109_must_issue_on_subscribe_for_non_null_subscriber",
            "Should have received on_subscribe (rule 1.9)",
            id="no-on-subscribe",
        ),
        pytest.param(
            DoubleOnSubscribePublisher,
            "test_required_spec109_must_issue_on_subscribe_for_non_null_subscriber",
            "Only one on_subscribe call expected",
            id="on-subscribe-twice",
        ),
        pytest.param(
            ReferenceKeepingPublisher,
            "test_required_spec313_cancel_must_make_the_publisher_eventually_drop_all_references_to_the_subscriber",
            "did not drop its reference to the test subscriber 300 ms after the subscription was cancelled (rule 3.13); "
            "it is still referenced by: list",
            id="keeps-subscriber-references",
        ),
        pytest.param(
            NoneAcceptingPublisher,
            "test_required_spec109_subscribe_throw_null_pointer_on_null_subscriber",
            "did not raise TypeError for subscribe(None) (rule 1.9)",
            id="accepts-subscribe-none",
        ),
        pytest.param(
            _publisher_with(ThreadedSignallingSubscription),
            "test_stochastic_spec103_must_signal_on_methods_sequentially",
            "Illegal concurrent access detected (rule 1.3)! thread",
            id="signals-concurrently",
        ),
    ],
)
def test_broken_publisher_is_caught(publisher_type: type[RangePublisher], test_name: str, explanation: str) -> None:
    verification = _verification_of(publisher_type)()
    with pytest.raises(AssertionError) as caught:
        getattr(verification, test_name)()
    assert explanation in str(caught.value)


# -- how the harness treats implementations ----------------------------------------------------


class RangeVerification(PublisherVerification[int]):
    """Not collected (no Test prefix): the base of the harness tests below."""

    def create_publisher(self, elements: int) -> Publisher[int]:
        return RangePublisher(elements)

    def create_failed_publisher(self) -> Publisher[int] | None:
        return RangePublisher(0, RuntimeError("failed range"))


SPEC101 = "test_required_spec101_subscription_request_must_result_in_the_correct_number_of_produced_elements"
SPEC102 = "test_required_spec102_may_signal_less_than_requested_and_terminate_subscription"
SPEC104 = "test_optional_spec104_must_signal_on_error_when_fails"
SPEC109_REJECT = "test_required_spec109_may_reject_calls_to_subscribe_if_publisher_is_unable_or_unwilling_to_serve_them_rejection_must_trigger_on_error_after_on_subscribe"
SPEC111 = "test_optional_spec111_may_support_multi_subscribe"
SPEC317_ABOVE = "test_required_spec317_must_not_signal_on_error_when_pending_above_long_max_value"


def test_required_test_skips_when_the_publisher_has_too_few_elements() -> None:
    class Short(RangeVerification):
        max_elements_from_publisher = 3

    with pytest.raises(pytest.skip.Exception, match="it needs 5 elements, but max_elements_from_publisher is 3"):
        Short().test_required_spec101_subscription_request_must_result_in_the_correct_number_of_produced_elements()
    with pytest.raises(pytest.skip.Exception, match="it needs 2147483647 elements"):
        getattr(Short(), SPEC317_ABOVE)()


def test_tests_needing_completion_skip_for_an_endless_publisher() -> None:
    class Endless(RangeVerification):
        max_elements_from_publisher = MAX_DEMAND

    with pytest.raises(pytest.skip.Exception, match="it needs on_complete"):
        getattr(Endless(), SPEC102)()
    getattr(Endless(), SPEC101)()  # needs no completion: runs


def test_failed_publisher_tests_skip_without_a_failed_publisher() -> None:
    class NoFailedPublisher(RangeVerification):
        def create_failed_publisher(self) -> None:
            return None

    for name in (SPEC104, SPEC109_REJECT):
        with pytest.raises(pytest.skip.Exception, match="no failed publisher was provided"):
            getattr(NoFailedPublisher(), name)()


class RaisingFailedPublisher(Publisher[int]):
    def subscribe(self, subscriber: Subscriber[int]) -> None:
        raise RuntimeError("cannot serve")


def test_optional_spec104_fails_when_the_failed_publisher_misbehaves() -> None:
    class Raising(RangeVerification):
        def create_failed_publisher(self) -> Publisher[int]:
            return RaisingFailedPublisher()

    with pytest.raises(
        AssertionError,
        match=r"raised RuntimeError\('cannot serve'\) from subscribe\(\) instead of signalling",
    ):
        getattr(Raising(), SPEC104)()


class SingleSubscriberPublisher(RangePublisher):
    """Rejects every subscriber after the first with on_subscribe + on_error (legal, rule 1.9)."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self._subscribed = False

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        if self._subscribed:
            RangePublisher(0, RuntimeError("only one subscriber")).subscribe(subscriber)
        else:
            self._subscribed = True
            super().subscribe(subscriber)


def test_an_optional_requirement_not_met_is_a_skip() -> None:
    class Unicast(RangeVerification):
        def create_publisher(self, elements: int) -> Publisher[int]:
            return SingleSubscriberPublisher(elements)

    with pytest.raises(
        pytest.skip.Exception,
        match=r"does not implement OPTIONAL requirement rule 1\.11: .*only one subscriber",
    ):
        getattr(Unicast(), SPEC111)()


def test_skip_stochastic_tests() -> None:
    class NoStochastic(RangeVerification):
        skip_stochastic_tests = True

    with pytest.raises(pytest.skip.Exception, match="skip_stochastic_tests is True"):
        NoStochastic().test_stochastic_spec103_must_signal_on_methods_sequentially()


def test_untested_tests_skip_naming_their_rule() -> None:
    with pytest.raises(pytest.skip.Exception, match=r"untested: not verified by this TCK \(rule 3\.4\)"):
        RangeVerification().test_untested_spec304_request_should_not_perform_heavy_computations()


def test_virtual_time_makes_waiting_for_silence_free() -> None:
    class Patient(RangeVerification):
        timeout_ms = 60_000  # SPEC101 watches for silence twice, a minute each

    started = time.monotonic()
    getattr(Patient(), SPEC101)()
    assert time.monotonic() - started < 5


def test_real_time_waits_for_real() -> None:
    class RealTime(RangeVerification):
        virtual_time = False
        timeout_ms = 40

    started = time.monotonic()
    getattr(RealTime(), SPEC101)()
    assert time.monotonic() - started >= 2 * 0.04


def test_environment_hook_wraps_the_test_and_its_nursery() -> None:
    events: list[str] = []

    class Hooked(TestAsyncRangePublisher):
        @asynccontextmanager
        async def environment(self) -> AsyncIterator[None]:
            events.append("enter")
            yield
            events.append("exit")

        def create_publisher(self, elements: int) -> Publisher[int]:
            events.append("create_publisher")

            async def watch() -> None:
                try:
                    await trio.sleep_forever()
                finally:
                    events.append("nursery cancelled")

            self.nursery.start_soon(watch)
            return super().create_publisher(elements)

    getattr(Hooked(), SPEC101)()
    assert events == ["enter", "create_publisher", "nursery cancelled", "exit"]


class CrashingPublisher(Publisher[int]):
    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        async def produce() -> None:
            raise RuntimeError("producer crashed")

        self._nursery.start_soon(produce)


def test_a_crashing_task_of_the_publisher_fails_the_test() -> None:
    class Crashing(RangeVerification):
        def create_publisher(self, elements: int) -> Publisher[int]:
            return CrashingPublisher(self.nursery)

    with pytest.raises(
        AssertionError, match="RuntimeError was raised while running the test: producer crashed"
    ) as caught:
        getattr(Crashing(), SPEC101)()
    assert isinstance(caught.value.__cause__, RuntimeError)


class FloodingSubscription(RangeSubscription):
    """Rule 1.1: answers request(1) with 40 elements, however short the stream should be."""

    def __init__(self, subscriber: Subscriber[int], count: int) -> None:
        super().__init__(subscriber, MAX_DEMAND)

    def request(self, n: int) -> None:
        super().request(n + 39)


def test_more_than_32_undrained_elements_are_an_overflow() -> None:
    with pytest.raises(
        AssertionError,
        match=r"Received more than 32 undrained on_next signals \(dropped 32 and any further ones\)",
    ):
        getattr(_verification_of(_publisher_with(FloodingSubscription))(), SPEC101)()
