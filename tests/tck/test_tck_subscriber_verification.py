"""Tests of rsnet.tck.SubscriberWhiteboxVerification and SubscriberBlackboxVerification.

Correct reference subscribers must pass every required test; deliberately broken subscribers
must each be caught by the test that targets the rule they break.
"""

from __future__ import annotations

from typing import Any

import pytest

from rsnet.streams.interfaces import Subscriber, Subscription
from rsnet.tck import SubscriberBlackboxVerification, SubscriberWhiteboxVerification
from rsnet.tck.report import summarize_directly
from rsnet.tck.subscriber_whitebox import WhiteboxSubscriberProbe

# -- reference subscribers ---------------------------------------------------------------------


class DemandingSubscriber(Subscriber[int]):
    """Requests one element up front and one more per element; a correct blackbox subject."""

    def __init__(self) -> None:
        self.subscription: Subscription | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        if subscription is None:
            raise TypeError("on_subscribe(None)")
        if self.subscription is not None:
            subscription.cancel()  # rule 2.5
            return
        self.subscription = subscription
        self.on_subscribed()

    def on_subscribed(self) -> None:
        assert self.subscription is not None
        self.subscription.request(1)

    def on_next(self, element: int) -> None:
        if element is None:
            raise TypeError("on_next(None)")
        if self.subscription is not None:
            self.subscription.request(1)

    def on_error(self, error: BaseException) -> None:
        if error is None:
            raise TypeError("on_error(None)")
        self.subscription = None  # rules 2.3, 2.4: the subscription is over, no calls on it

    def on_complete(self) -> None:
        self.subscription = None


class ProbedSubscriber(DemandingSubscriber):
    """Requests only when the test says so, and reports everything to the whitebox probe."""

    def __init__(self, probe: WhiteboxSubscriberProbe[int]) -> None:
        super().__init__()
        self.probe = probe

    def on_subscribed(self) -> None:
        self.probe.register_on_subscribe(Puppet(self))

    def on_next(self, element: int) -> None:
        if element is None:
            raise TypeError("on_next(None)")
        self.probe.register_on_next(element)

    def on_error(self, error: BaseException) -> None:
        super().on_error(error)
        self.probe.register_on_error(error)

    def on_complete(self) -> None:
        super().on_complete()
        self.probe.register_on_complete()


class Puppet:
    def __init__(self, subscriber: DemandingSubscriber) -> None:
        self._subscriber = subscriber

    def trigger_request(self, elements: int) -> None:
        if self._subscriber.subscription is not None:
            self._subscriber.subscription.request(elements)

    def signal_cancel(self) -> None:
        if self._subscriber.subscription is not None:
            self._subscriber.subscription.cancel()


class TestProbedSubscriber(SubscriberWhiteboxVerification[int]):
    def create_subscriber(self, probe: WhiteboxSubscriberProbe[int]) -> Subscriber[int]:
        return ProbedSubscriber(probe)

    def create_element(self, element: int) -> int:
        return element


class TestDemandingSubscriber(SubscriberBlackboxVerification[int]):
    def create_subscriber(self) -> Subscriber[int]:
        return DemandingSubscriber()

    def create_element(self, element: int) -> int:
        return element


class TestBulkDemandingSubscriber(TestDemandingSubscriber):
    """Asks for everything at once: rule 2.1's test then sends its cap of 512 elements."""

    def create_subscriber(self) -> Subscriber[int]:
        subscriber = DemandingSubscriber()
        subscriber.on_subscribed = lambda: subscriber.subscription.request(2**63 - 1)  # type: ignore[method-assign, union-attr]
        return subscriber


@pytest.mark.parametrize(
    ("verification", "required"),
    [(TestProbedSubscriber, 14), (TestDemandingSubscriber, 11), (TestBulkDemandingSubscriber, 11)],
)
def test_reference_subscribers_pass_every_required_test(verification: type, required: int) -> None:
    summary = summarize_directly(verification)
    assert summary.required_not_passed == []
    assert summary.counts["required"] == {"passed": required}
    assert summary.counts["untested"] == {"skipped": 27 - 14 if required == 14 else 26 - 11}


# -- deliberately broken subscribers -----------------------------------------------------------


def requests_from_on_complete(subscriber: DemandingSubscriber) -> None:
    """Rule 2.3: requests more from inside on_complete."""
    original = subscriber.on_complete

    def on_complete() -> None:
        if subscriber.subscription is not None:
            subscriber.subscription.request(1)
        original()

    subscriber.on_complete = on_complete  # type: ignore[method-assign]


def cancels_from_on_error(subscriber: DemandingSubscriber) -> None:
    """Rule 2.3: cancels from inside on_error."""
    original = subscriber.on_error

    def on_error(error: BaseException) -> None:
        if subscriber.subscription is not None:
            subscriber.subscription.cancel()
        original(error)

    subscriber.on_error = on_error  # type: ignore[method-assign]


def keeps_second_subscription(subscriber: DemandingSubscriber) -> None:
    """Rule 2.5: silently drops a second subscription instead of cancelling it."""
    original = subscriber.on_subscribe

    def on_subscribe(subscription: Subscription) -> None:
        if subscriber.subscription is None:
            original(subscription)

    subscriber.on_subscribe = on_subscribe  # type: ignore[method-assign]


def requests_on_second_subscription(subscriber: DemandingSubscriber) -> None:
    """Rule 2.5: requests on a second subscription before cancelling it."""
    original = subscriber.on_subscribe

    def on_subscribe(subscription: Subscription) -> None:
        if subscriber.subscription is not None:
            subscription.request(1)
        original(subscription)

    subscriber.on_subscribe = on_subscribe  # type: ignore[method-assign]


def accepts_none(subscriber: DemandingSubscriber) -> None:
    """Rule 2.13: ignores None arguments instead of raising TypeError."""
    for name in ("on_subscribe", "on_next", "on_error"):
        original = getattr(subscriber, name)
        setattr(
            subscriber,
            name,
            lambda value, original=original: None if value is None else original(value),
        )


def never_requests(subscriber: DemandingSubscriber) -> None:
    """Rule 2.1: never signals demand (whitebox: its puppet ignores trigger_request)."""
    subscriber.on_subscribed = lambda: None  # type: ignore[method-assign]
    if isinstance(subscriber, ProbedSubscriber):
        probe = subscriber.probe
        subscriber.on_subscribed = lambda: probe.register_on_subscribe(IdlePuppet())  # type: ignore[method-assign]


class IdlePuppet:
    def trigger_request(self, elements: int) -> None:
        pass

    def signal_cancel(self) -> None:
        pass


def raises_from_on_next(subscriber: DemandingSubscriber) -> None:
    """Rule 2.13: raises from on_next instead of returning normally."""

    def on_next(element: int) -> None:
        raise RuntimeError("subscriber crashed")

    subscriber.on_next = on_next  # type: ignore[method-assign]


def _whitebox(breakage: Any) -> type[SubscriberWhiteboxVerification[int]]:
    class BrokenWhitebox(SubscriberWhiteboxVerification[int]):
        def create_subscriber(self, probe: WhiteboxSubscriberProbe[int]) -> Subscriber[int]:
            subscriber = ProbedSubscriber(probe)
            breakage(subscriber)
            return subscriber

        def create_element(self, element: int) -> int:
            return element

    return BrokenWhitebox


def _blackbox(breakage: Any) -> type[SubscriberBlackboxVerification[int]]:
    class BrokenBlackbox(SubscriberBlackboxVerification[int]):
        def create_subscriber(self) -> Subscriber[int]:
            subscriber = DemandingSubscriber()
            breakage(subscriber)
            return subscriber

        def create_element(self, element: int) -> int:
            return element

    return BrokenBlackbox


@pytest.mark.parametrize(
    ("verification", "test_name", "explanation"),
    [
        pytest.param(
            _whitebox(requests_from_on_complete),
            "test_required_spec203_must_not_call_methods_on_subscription_or_publisher_in_on_complete",
            "Subscription.request(1) MUST NOT be called from Subscriber.on_complete (rule 2.3)",
            id="whitebox-requests-from-on-complete",
        ),
        pytest.param(
            _blackbox(requests_from_on_complete),
            "test_required_spec203_blackbox_must_not_call_methods_on_subscription_or_publisher_in_on_complete",
            "Subscription.request(1) MUST NOT be called from Subscriber.on_complete (rule 2.3)",
            id="blackbox-requests-from-on-complete",
        ),
        pytest.param(
            _whitebox(cancels_from_on_error),
            "test_required_spec203_must_not_call_methods_on_subscription_or_publisher_in_on_error",
            "Subscription.cancel() MUST NOT be called from Subscriber.on_error (rule 2.3)",
            id="whitebox-cancels-from-on-error",
        ),
        pytest.param(
            _blackbox(cancels_from_on_error),
            "test_required_spec203_blackbox_must_not_call_methods_on_subscription_or_publisher_in_on_error",
            "Subscription.cancel() MUST NOT be called from Subscriber.on_error (rule 2.3)",
            id="blackbox-cancels-from-on-error",
        ),
        pytest.param(
            _whitebox(keeps_second_subscription),
            "test_required_spec205_must_call_subscription_cancel_if_it_already_has_an_subscription_and_receives_another_on_subscribe_signal",
            "Expected 2nd Subscription given to subscriber",
            id="whitebox-keeps-second-subscription",
        ),
        pytest.param(
            _blackbox(keeps_second_subscription),
            "test_required_spec205_blackbox_must_call_subscription_cancel_if_it_already_has_an_subscription_and_receives_another_on_subscribe_signal",
            "Expected SecondSubscription given to subscriber",
            id="blackbox-keeps-second-subscription",
        ),
        pytest.param(
            _blackbox(requests_on_second_subscription),
            "test_required_spec205_blackbox_must_call_subscription_cancel_if_it_already_has_an_subscription_and_receives_another_on_subscribe_signal",
            "illegally called `subscription.request(1)` on a second subscription (rule 2.5)",
            id="blackbox-requests-on-second-subscription",
        ),
        pytest.param(
            _whitebox(accepts_none),
            "test_required_spec213_on_next_must_throw_null_pointer_when_parameters_are_null",
            "on_next(None) did not raise TypeError (rule 2.13",
            id="whitebox-accepts-none-on-next",
        ),
        pytest.param(
            _whitebox(accepts_none),
            "test_required_spec213_on_subscribe_must_throw_null_pointer_when_parameters_are_null",
            "on_subscribe(None) did not raise TypeError (rule 2.13",
            id="whitebox-accepts-none-on-subscribe",
        ),
        pytest.param(
            _blackbox(accepts_none),
            "test_required_spec213_blackbox_on_error_must_throw_null_pointer_when_parameters_are_null",
            "on_error(None) did not raise TypeError (rule 2.13",
            id="blackbox-accepts-none-on-error",
        ),
        pytest.param(
            _whitebox(never_requests),
            "test_required_spec201_must_signal_demand_via_subscription_request",
            "did not request after trigger_request(1) (rule 2.1)",
            id="whitebox-never-requests",
        ),
        pytest.param(
            _blackbox(never_requests),
            "test_required_spec201_blackbox_must_signal_demand_via_subscription_request",
            "did not signal demand via request (rule 2.1)",
            id="blackbox-never-requests",
        ),
        pytest.param(
            _whitebox(raises_from_on_next),
            "test_required_exercise_whitebox_happy_path",
            "RuntimeError was raised while running the test: subscriber crashed",
            id="whitebox-raises-from-on-next",
        ),
    ],
)
def test_broken_subscriber_is_caught(verification: type, test_name: str, explanation: str) -> None:
    with pytest.raises(AssertionError) as caught:
        getattr(verification(), test_name)()
    assert explanation in str(caught.value)


def test_whitebox_subscriber_that_does_not_register_with_the_probe_fails_setup() -> None:
    class Unregistered(SubscriberWhiteboxVerification[int]):
        def create_subscriber(self, probe: WhiteboxSubscriberProbe[int]) -> Subscriber[int]:
            return DemandingSubscriber()

        def create_element(self, element: int) -> int:
            return element

    with pytest.raises(AssertionError, match=r"did not call probe\.register_on_subscribe"):
        Unregistered().test_required_spec201_must_signal_demand_via_subscription_request()
