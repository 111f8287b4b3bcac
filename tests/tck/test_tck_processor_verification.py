"""Tests of rsnet.tck.IdentityProcessorVerification.

A simple correct multicast identity processor must pass every required test; broken variants
must be caught.
"""

from __future__ import annotations

import collections

import pytest

from rsnet.streams.interfaces import Processor, Publisher, Subscriber, Subscription
from rsnet.streams.rules import MAX_DEMAND
from rsnet.tck import IdentityProcessorVerification
from rsnet.tck.report import summarize_directly


class MulticastProcessor(Processor[int, int]):
    """Passes every element to all current subscribers, each with its own bounded queue.

    It requests one element upstream at a time, while some subscriber wants more than it has
    queued and no queue is full; errors go to everyone at once (rule 4.2), completion after
    each queue drains. When its last subscriber cancels, it cancels upstream. Single-threaded:
    all signals come from the trio thread.
    """

    def __init__(self, buffer_size: int) -> None:
        self._buffer_size = buffer_size
        self._upstream: Subscription | None = None
        self._requested = False  # one upstream request outstanding
        self._inners: list[Inner] = []
        self._done = False
        self._error: BaseException | None = None
        self._draining = False
        self._again = False

    # -- subscriber side ----------------------------------------------------------------------

    def on_subscribe(self, subscription: Subscription) -> None:
        if subscription is None:
            raise TypeError("on_subscribe(None)")
        if self._upstream is not None or self._done:
            subscription.cancel()  # rule 2.5
            return
        self._upstream = subscription
        self.drain()

    def on_next(self, element: int) -> None:
        if element is None:
            raise TypeError("on_next(None)")
        if self._done:
            return  # after cancel (rule 2.8)
        self._requested = False
        for inner in self._inners:
            inner.queue.append(element)
        self.drain()

    def on_error(self, error: BaseException) -> None:
        if error is None:
            raise TypeError("on_error(None)")
        self._terminate(error)

    def on_complete(self) -> None:
        self._terminate(None)

    def _terminate(self, error: BaseException | None) -> None:
        if not self._done:
            self._done, self._error, self._upstream = True, error, None
            self.drain()

    # -- publisher side -----------------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        if subscriber is None:
            raise TypeError("subscribe(None)")
        inner = Inner(self, subscriber)
        self._inners.append(inner)
        subscriber.on_subscribe(inner)
        self.drain()

    def remove(self, inner: Inner) -> None:
        if inner in self._inners:
            self._inners.remove(inner)
            if not self._inners and self._upstream is not None:
                upstream, self._upstream = self._upstream, None
                self._done, self._error = True, RuntimeError("cancelled by all its subscribers")
                upstream.cancel()

    # -- the one place that signals -----------------------------------------------------------

    def drain(self) -> None:
        if self._draining:
            self._again = True  # re-entered from a signal: the loop below goes round again
            return
        self._draining = True
        try:
            self._again = True
            while self._again:
                self._again = False
                for inner in list(self._inners):
                    inner.deliver()
                self._request_upstream()
        finally:
            self._draining = False

    def _request_upstream(self) -> None:
        inners = self._inners
        if (
            self._upstream is not None
            and not self._requested
            and any(inner.demand > len(inner.queue) for inner in inners)
            and all(len(inner.queue) < self._buffer_size for inner in inners)
        ):
            self._requested = True
            self._upstream.request(1)


class Inner(Subscription):
    def __init__(self, processor: MulticastProcessor, subscriber: Subscriber[int]) -> None:
        self.processor = processor
        self.subscriber: Subscriber[int] | None = subscriber
        self.queue: collections.deque[int] = collections.deque()
        self.demand = 0
        self.invalid: ValueError | None = None

    def request(self, n: int) -> None:
        if self.subscriber is None:
            return
        if n <= 0:
            self.invalid = ValueError(f"rule 3.9: non-positive subscription request: request({n})")
        else:
            self.demand = min(self.demand + n, MAX_DEMAND)
        self.processor.drain()

    def cancel(self) -> None:
        self.subscriber = None
        self.queue.clear()
        self.processor.remove(self)

    def deliver(self) -> None:
        processor = self.processor
        while (subscriber := self.subscriber) is not None:
            if self.invalid is not None or (processor._error is not None and processor._done):
                error = self.invalid or processor._error
                self.cancel()
                subscriber.on_error(error)  # type: ignore[arg-type]
            elif self.queue and self.demand > 0:
                if self.demand != MAX_DEMAND:
                    self.demand -= 1
                subscriber.on_next(self.queue.popleft())
            elif processor._done and not self.queue:
                self.cancel()
                subscriber.on_complete()
            else:
                return


class FailedPublisher(Publisher[int]):
    def subscribe(self, subscriber: Subscriber[int]) -> None:
        if subscriber is None:
            raise TypeError("subscribe(None)")
        subscriber.on_subscribe(NoopSubscription())
        subscriber.on_error(RuntimeError("failed publisher"))


class NoopSubscription(Subscription):
    def request(self, n: int) -> None:
        pass

    def cancel(self) -> None:
        pass


class TestMulticastProcessor(IdentityProcessorVerification[int]):
    def create_identity_processor(self, buffer_size: int) -> Processor[int, int]:
        return MulticastProcessor(buffer_size)

    def create_failed_publisher(self) -> Publisher[int]:
        return FailedPublisher()

    def create_element(self, element: int) -> int:
        return element


def test_multicast_processor_passes_every_required_test() -> None:
    summary = summarize_directly(TestMulticastProcessor)
    assert summary.required_not_passed == []
    assert summary.counts["required"] == {"passed": 39}
    assert summary.counts["optional"] == {"passed": 8}
    assert summary.counts["stochastic"] == {"passed": 1}
    assert summary.counts["untested"] == {"skipped": 20}


class UnicastVerification(TestMulticastProcessor):
    max_supported_subscribers = 1


@pytest.mark.parametrize(
    "test_name",
    [
        "test_required_spec104_must_call_on_error_on_all_its_subscribers_if_it_encounters_a_non_recoverable_error",
        "test_required_must_request_from_upstream_for_elements_that_have_been_requested_long_ago",
    ],
)
def test_multi_subscriber_tests_skip_for_a_unicast_processor(test_name: str) -> None:
    with pytest.raises(pytest.skip.Exception, match="only supports 1 subscriber"):
        getattr(UnicastVerification(), test_name)()


class ErrorWaitingForDemandProcessor(MulticastProcessor):
    """Rule 4.2: holds an upstream error back until the subscriber requests something."""

    def on_error(self, error: BaseException) -> None:
        if error is None:
            raise TypeError("on_error(None)")
        self._pending_error = error

    def subscribe(self, subscriber: Subscriber[int]) -> None:
        super().subscribe(subscriber)
        inner = self._inners[-1]
        original = inner.request

        def request(n: int) -> None:
            if getattr(self, "_pending_error", None) is not None:
                self._terminate(self._pending_error)
            original(n)

        inner.request = request  # type: ignore[method-assign]


class UpstreamKeepingProcessor(MulticastProcessor):
    """Rule 2.5: ignores a second upstream subscription instead of cancelling it."""

    def on_subscribe(self, subscription: Subscription) -> None:
        if subscription is None:
            raise TypeError("on_subscribe(None)")
        if self._upstream is None:
            super().on_subscribe(subscription)


def _verification_of(
    processor_type: type[MulticastProcessor],
) -> type[IdentityProcessorVerification[int]]:
    class BrokenProcessorVerification(TestMulticastProcessor):
        def create_identity_processor(self, buffer_size: int) -> Processor[int, int]:
            return processor_type(buffer_size)

    return BrokenProcessorVerification


@pytest.mark.parametrize(
    ("processor_type", "test_name", "explanation"),
    [
        pytest.param(
            ErrorWaitingForDemandProcessor,
            "test_required_must_immediately_pass_on_on_error_events_received_from_its_upstream_to_its_downstream",
            "Did not receive expected error on downstream",
            id="error-waits-for-demand",
        ),
        pytest.param(
            UpstreamKeepingProcessor,
            "test_required_spec205_must_call_subscription_cancel_if_it_already_has_an_subscription_and_receives_another_on_subscribe_signal",
            "Expected 2nd Subscription given to subscriber",
            id="keeps-second-upstream",
        ),
    ],
)
def test_broken_processor_is_caught(processor_type: type[MulticastProcessor], test_name: str, explanation: str) -> None:
    with pytest.raises(AssertionError) as caught:
        getattr(_verification_of(processor_type)(), test_name)()
    assert explanation in str(caught.value)
