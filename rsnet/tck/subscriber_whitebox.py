"""``SubscriberWhiteboxVerification``: the Subscriber rules, with the subscriber's cooperation.

Port of ``org.reactivestreams.tck.SubscriberWhiteboxVerification`` (TCK 1.0.4): all 27 tests,
named like the Java ones (see :mod:`rsnet.tck.publisher` for the naming).

The subscriber under test is driven by a :class:`~rsnet.tck.environment.ManualPublisher`, and
it reports to a :class:`WhiteboxSubscriberProbe` what happens to it::

    class TestMySubscriber(SubscriberWhiteboxVerification):
        def create_subscriber(self, probe):
            return MySubscriber(on_subscribe=lambda s: probe.register_on_subscribe(Puppet(s)),
                                on_next=probe.register_on_next, ...)

        def create_element(self, element):
            return element

Factories are methods, settings are class attributes:

``create_subscriber(probe) -> Subscriber``
    The subscriber under test. In ``on_subscribe`` it must call
    ``probe.register_on_subscribe(puppet)``, where ``puppet`` is a :class:`SubscriberPuppet`
    through which the test makes the subscriber ``request(n)`` (``trigger_request``) and
    ``cancel()`` (``signal_cancel``); and it must call ``probe.register_on_next(element)``,
    ``probe.register_on_complete()`` and ``probe.register_on_error(error)`` as those arrive.
``create_element(element: int) -> T``
    The element the TCK sends as number ``element``; never ``None``.
``create_helper_publisher(elements) -> Publisher`` (optional)
    Where those elements come from; the default is the TCK's asynchronous helper publisher.

Plus the settings of :class:`rsnet.tck.environment.Verification`. All factories are called
inside the test's ``trio.run``, where ``self.nursery`` is available.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from rsnet.streams.interfaces import Subscriber, Subscription
from rsnet.streams.rules import MAX_DEMAND
from rsnet.tck.environment import (
    Latch,
    ManualPublisher,
    ManualSubscriber,
    Promise,
    SubscriberProbe,
    TestEnvironment,
    Verification,
    _WithHelperPublisher,
    skip_untested,
)

T = TypeVar("T")


class SubscriberPuppet(Protocol):
    """How the test steers the subscriber under test; implemented by the test's author."""

    def trigger_request(self, elements: int) -> None:
        """Make the subscriber call ``request(elements)`` on its subscription."""

    def signal_cancel(self) -> None:
        """Make the subscriber call ``cancel()`` on its subscription."""


class WhiteboxSubscriberProbe(SubscriberProbe[T]):
    """What the subscriber under test reports: its puppet, and the signals it received."""

    def __init__(self, env: TestEnvironment, subscriber: Promise[Subscriber[Any]]) -> None:
        super().__init__(env, subscriber)
        self.puppet: Promise[SubscriberPuppet] = Promise(env)

    def register_on_subscribe(self, puppet: SubscriberPuppet) -> None:
        """The subscriber under test accepted a subscription; ``puppet`` steers it."""
        if not self.puppet.is_completed:
            self.puppet.complete(puppet)


class TestException(Exception):
    """The error the TCK sends to subscribers under test."""

    __test__ = False  # not a pytest test class, despite its name


class _WhiteboxStage(ManualPublisher[T]):
    """Drives the subscriber under test: the probe, a source of elements (``tees``), signals."""

    probe: WhiteboxSubscriberProbe[T]
    tees: ManualSubscriber[T]
    last: T | None = None

    @property
    def puppet(self) -> SubscriberPuppet:
        return self.probe.puppet.value

    async def next_t(self) -> T:
        self.last = await self.tees.request_next_element()
        return self.last

    async def signal_next(self) -> T:
        element = await self.next_t()
        self.send_next(element)
        return element


StageBody = Callable[[_WhiteboxStage[Any]], Awaitable[None]]


class SubscriberWhiteboxVerification(Verification, _WithHelperPublisher[T]):
    """The Subscriber rules (spec section 2, and 3.x where the subscriber calls the subscription)."""

    def create_subscriber(self, probe: WhiteboxSubscriberProbe[T]) -> Subscriber[T]:
        """The subscriber under test, reporting to ``probe`` (see the module docstring)."""
        raise NotImplementedError(f"{type(self).__name__} must implement create_subscriber(probe)")

    # -- harness ------------------------------------------------------------------------------

    def _subscriber_test(self, body: StageBody, *, setup: bool = True) -> None:
        """Run ``body(stage)``; with ``setup`` the subscriber under test is subscribed to the stage."""

        async def run() -> None:
            stage: _WhiteboxStage[T] = _WhiteboxStage(self.env)
            if setup:
                stage.tees = await self.env.new_manual_subscriber(self.create_helper_publisher(MAX_DEMAND))
                stage.probe = WhiteboxSubscriberProbe(self.env, stage.subscriber)
                stage.subscribe(self.create_subscriber(stage.probe))
                await stage.probe.puppet.expect_completion(
                    f"Subscriber {stage.sub!r} did not call probe.register_on_subscribe(puppet) in on_subscribe"
                )
            await body(stage)

        self.run_test(run)

    def _expect_null_argument_error(self, signal: str, call: Callable[[], None]) -> None:
        try:
            call()
        except TypeError:
            return
        except Exception as error:
            raise AssertionError(f"{signal}(None) raised {error!r}, but rule 2.13 requires TypeError") from error
        raise AssertionError(f"{signal}(None) did not raise TypeError (rule 2.13; Java: NullPointerException)")

    # -- test setup verification --------------------------------------------------------------

    def test_required_exercise_whitebox_happy_path(self) -> None:
        """Requests reach the publisher, elements reach the subscriber, cancel reaches the publisher."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            stage.puppet.trigger_request(1)
            stage.puppet.trigger_request(1)
            received_requests = await stage.expect_request()
            sent = await stage.signal_next()
            await stage.probe.expect_next(sent)
            stage.puppet.trigger_request(1)
            if received_requests == 1:
                await stage.expect_request()
            sent = await stage.signal_next()
            await stage.probe.expect_next(sent)
            stage.puppet.signal_cancel()
            await stage.expect_cancelling()
            await stage.env.verify_no_async_errors()

        self._subscriber_test(body)

    # -- spec rules, section 2 ----------------------------------------------------------------

    def test_required_spec201_must_signal_demand_via_subscription_request(self) -> None:
        """Rule 2.1: trigger_request(1) makes the subscriber call request(n > 0)."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            stage.puppet.trigger_request(1)
            await stage.expect_request(f"Subscriber {stage.sub!r} did not request after trigger_request(1) (rule 2.1)")
            await stage.signal_next()

        self._subscriber_test(body)

    def test_untested_spec202_should_asynchronously_dispatch(self) -> None:
        skip_untested("2.2")

    async def _terminal_signal_test(self, stage: _WhiteboxStage[T], send: Callable[[_WhiteboxStage[T]], None]) -> None:
        stage.probe = WhiteboxSubscriberProbe(self.env, stage.subscriber)
        stage.subscribe(self.create_subscriber(stage.probe))
        # The stage records request/cancel called while on_complete/on_error runs (rule 2.3).
        send(stage)
        self.env.verify_no_async_errors_no_delay()

    def test_required_spec203_must_not_call_methods_on_subscription_or_publisher_in_on_complete(
        self,
    ) -> None:
        """Rule 2.3: on_complete calls neither request nor cancel."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            await self._terminal_signal_test(stage, lambda stage: stage.send_completion())

        self._subscriber_test(body, setup=False)

    def test_required_spec203_must_not_call_methods_on_subscription_or_publisher_in_on_error(
        self,
    ) -> None:
        """Rule 2.3: on_error calls neither request nor cancel."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            await self._terminal_signal_test(stage, lambda stage: stage.send_error(TestException()))

        self._subscriber_test(body, setup=False)

    def test_untested_spec204_must_consider_the_subscription_as_cancelled_in_after_recieving_on_complete_or_on_error(
        self,
    ) -> None:
        skip_untested("2.4")

    def test_required_spec205_must_call_subscription_cancel_if_it_already_has_an_subscription_and_receives_another_on_subscribe_signal(
        self,
    ) -> None:
        """Rule 2.5: a second on_subscribe(s2) makes the subscriber call s2.cancel()."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            second_cancelled = Latch(self.env)
            stage.sub.on_subscribe(_SecondSubscription(second_cancelled))
            await second_cancelled.expect_close(
                f"Expected 2nd Subscription given to subscriber {stage.sub!r} to be cancelled, "
                "but `Subscription.cancel()` was not called (rule 2.5)"
            )
            await self.env.verify_no_async_errors()

        self._subscriber_test(body)

    def test_untested_spec206_must_call_subscription_cancel_if_it_is_no_longer_valid(self) -> None:
        skip_untested("2.6")

    def test_untested_spec207_must_ensure_all_calls_on_its_subscription_take_place_from_the_same_thread_or_take_care_of_synchronization(
        self,
    ) -> None:
        skip_untested("2.7")

    def test_required_spec208_must_be_prepared_to_receive_on_next_signals_after_having_called_subscription_cancel(
        self,
    ) -> None:
        """Rule 2.8: an on_next after cancel is harmless, and so are later trigger_request calls."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            stage.puppet.trigger_request(1)
            stage.puppet.signal_cancel()
            await stage.signal_next()
            stage.puppet.trigger_request(1)
            stage.puppet.trigger_request(1)
            await self.env.verify_no_async_errors()

        self._subscriber_test(body)

    def test_required_spec209_must_be_prepared_to_receive_an_on_complete_signal_with_preceding_request_call(
        self,
    ) -> None:
        """Rule 2.9: on_complete after a request is accepted and registered."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            stage.puppet.trigger_request(1)
            stage.send_completion()
            await stage.probe.expect_completion()
            await self.env.verify_no_async_errors()

        self._subscriber_test(body)

    def test_required_spec209_must_be_prepared_to_receive_an_on_complete_signal_without_preceding_request_call(
        self,
    ) -> None:
        """Rule 2.9: on_complete without any request is accepted and registered."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            stage.send_completion()
            await stage.probe.expect_completion()
            await self.env.verify_no_async_errors()

        self._subscriber_test(body)

    def test_required_spec210_must_be_prepared_to_receive_an_on_error_signal_with_preceding_request_call(
        self,
    ) -> None:
        """Rule 2.10: on_error after a request is accepted; the very error is registered."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            stage.puppet.trigger_request(1)
            stage.puppet.trigger_request(1)
            error = TestException()
            stage.send_error(error)
            await stage.probe.expect_error(error)
            self.env.verify_no_async_errors_no_delay()

        self._subscriber_test(body)

    def test_required_spec210_must_be_prepared_to_receive_an_on_error_signal_without_preceding_request_call(
        self,
    ) -> None:
        """Rule 2.10: on_error without any request is accepted; the very error is registered."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            error = TestException()
            stage.send_error(error)
            await stage.probe.expect_error(error)
            self.env.verify_no_async_errors_no_delay()

        self._subscriber_test(body)

    def test_untested_spec211_must_make_sure_that_all_calls_on_its_methods_happen_before_the_processing_of_the_respective_events(
        self,
    ) -> None:
        skip_untested("2.11")

    def test_untested_spec212_must_not_call_on_subscribe_more_than_once_based_on_object_equality_spec_violation(
        self,
    ) -> None:
        skip_untested("2.12")

    def test_untested_spec213_failing_on_signal_invocation(self) -> None:
        skip_untested("2.13")

    def test_required_spec213_on_subscribe_must_throw_null_pointer_when_parameters_are_null(
        self,
    ) -> None:
        """Rule 2.13: on_subscribe(None) raises TypeError (Java: NullPointerException)."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            self._expect_null_argument_error("on_subscribe", lambda: stage.sub.on_subscribe(None))  # type: ignore[arg-type]  # None on purpose: the rule 2.13 / 1.9 check
            self.env.verify_no_async_errors_no_delay()

        self._subscriber_test(body)

    def test_required_spec213_on_next_must_throw_null_pointer_when_parameters_are_null(
        self,
    ) -> None:
        """Rule 2.13: on_next(None) raises TypeError (Java: NullPointerException)."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            self._expect_null_argument_error("on_next", lambda: stage.sub.on_next(None))  # type: ignore[arg-type]  # None on purpose: the rule 2.13 / 1.9 check
            self.env.verify_no_async_errors_no_delay()

        self._subscriber_test(body)

    def test_required_spec213_on_error_must_throw_null_pointer_when_parameters_are_null(
        self,
    ) -> None:
        """Rule 2.13: on_error(None) raises TypeError (Java: NullPointerException)."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            self._expect_null_argument_error("on_error", lambda: stage.sub.on_error(None))  # type: ignore[arg-type]  # None on purpose: the rule 2.13 / 1.9 check
            self.env.verify_no_async_errors_no_delay()

        self._subscriber_test(body)

    # -- spec rules, section 3 ----------------------------------------------------------------

    def test_untested_spec301_must_not_be_called_outside_subscriber_context(self) -> None:
        skip_untested("3.1")

    def test_required_spec308_request_must_register_given_number_elements_to_be_produced(
        self,
    ) -> None:
        """Rule 3.8: after trigger_request(2), two elements are accepted; then silence."""

        async def body(stage: _WhiteboxStage[T]) -> None:
            stage.puppet.trigger_request(2)
            await stage.probe.expect_next(await stage.signal_next())
            await stage.probe.expect_next(await stage.signal_next())
            await stage.probe.expect_none()
            stage.puppet.trigger_request(3)
            await self.env.verify_no_async_errors()

        self._subscriber_test(body)

    def test_untested_spec310_request_may_synchronously_call_on_next_on_subscriber(self) -> None:
        skip_untested("3.10")

    def test_untested_spec311_request_may_synchronously_call_on_complete_or_on_error(self) -> None:
        skip_untested("3.11")

    def test_untested_spec314_cancel_may_cause_the_publisher_to_shutdown_if_no_other_subscription_exists(
        self,
    ) -> None:
        skip_untested("3.14")

    def test_untested_spec315_cancel_must_not_throw_exception_and_must_signal_on_error(
        self,
    ) -> None:
        skip_untested("3.15")

    def test_untested_spec316_request_must_not_throw_exception_and_must_on_error_the_subscriber(
        self,
    ) -> None:
        skip_untested("3.16")


class _SecondSubscription(Subscription):
    """Rule 2.5: the subscription a subscriber must cancel because it already has one."""

    def __init__(self, cancelled: Latch) -> None:
        self._cancelled = cancelled

    def request(self, n: int) -> None:
        pass  # whitebox 2.5 tolerates it; the blackbox variant does not

    def cancel(self) -> None:
        self._cancelled.close()

    def __repr__(self) -> str:
        return "SecondSubscription(should get cancelled)"
