"""``SubscriberBlackboxVerification``: the Subscriber rules checkable without cooperation.

Port of ``org.reactivestreams.tck.SubscriberBlackboxVerification`` (TCK 1.0.4): all 26 tests,
named like the Java ones (see :mod:`rsnet.tck.publisher` for the naming). It verifies far fewer
rules than :class:`~rsnet.tck.SubscriberWhiteboxVerification`; prefer that one where you can.

Factories are methods, settings are class attributes:

``create_subscriber() -> Subscriber``
    The subscriber under test. It is expected to request by itself.
``create_element(element: int) -> T``
    The element the TCK sends as number ``element``; never ``None``.
``trigger_request(subscriber)`` (optional)
    Called when a test wants the subscriber to request, for subscribers that need a nudge
    from outside first; does nothing by default.
``create_helper_publisher(elements) -> Publisher`` (optional)
    Where the elements come from; the default is the TCK's asynchronous helper publisher.

Plus the settings of :class:`rsnet.tck.environment.Verification`. All factories are called
inside the test's ``trio.run``, where ``self.nursery`` is available.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

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
from rsnet.tck.subscriber_whitebox import TestException

T = TypeVar("T")

BLACKBOX_MAX_ELEMENTS = 512
"""Rule 2.1 test: the most elements sent in answer to the subscriber's first request."""


class _BlackboxSubscriberProxy(SubscriberProbe[T], Subscriber[T]):
    """Sits in front of the subscriber under test and registers what passes through."""

    def __init__(self, env: TestEnvironment, subscriber: Subscriber[T]) -> None:
        promise: Promise[Subscriber[Any]] = Promise(env)
        promise.complete(subscriber)
        super().__init__(env, promise)
        self.sub = subscriber

    def on_subscribe(self, subscription: Subscription) -> None:
        self.sub.on_subscribe(subscription)

    def on_next(self, element: T) -> None:
        self.register_on_next(element)
        self.sub.on_next(element)

    def on_error(self, error: BaseException) -> None:
        self.register_on_error(error)
        self.sub.on_error(error)

    def on_complete(self) -> None:
        self.register_on_complete()
        self.sub.on_complete()


class _BlackboxStage(ManualPublisher[T]):
    """Drives the subscriber under test (behind a proxy) with elements from ``tees``."""

    tees: ManualSubscriber[T]
    proxy: _BlackboxSubscriberProxy[T]

    async def signal_next(self) -> T:
        element = await self.tees.request_next_element()
        self.send_next(element)
        return element


StageBody = Callable[[_BlackboxStage[Any]], Awaitable[None]]


class SubscriberBlackboxVerification(Verification, _WithHelperPublisher[T]):
    """The Subscriber rules (spec section 2) that hold for any subscriber, seen from outside."""

    def create_subscriber(self) -> Subscriber[T]:
        """The subscriber under test."""
        raise NotImplementedError(f"{type(self).__name__} must implement create_subscriber()")

    def trigger_request(self, subscriber: Subscriber[T]) -> None:
        """Make ``subscriber`` signal demand, if it needs a nudge to do so; by default nothing."""

    # -- harness ------------------------------------------------------------------------------

    def _blackbox_test(self, body: StageBody, *, setup: bool = True) -> None:
        """Run ``body(stage)``; with ``setup`` the subscriber under test is subscribed to the stage."""

        async def run() -> None:
            stage: _BlackboxStage[T] = _BlackboxStage(self.env)
            if setup:
                stage.tees = await self.env.new_manual_subscriber(self.create_helper_publisher(MAX_DEMAND))
                stage.proxy = _BlackboxSubscriberProxy(self.env, self.create_subscriber())
                stage.subscribe(stage.proxy)
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

    # -- spec rules, section 2 ----------------------------------------------------------------

    def test_required_spec201_blackbox_must_signal_demand_via_subscription_request(self) -> None:
        """Rule 2.1: the subscriber requests n > 0 by itself; it gets up to min(n, 512) elements."""

        async def body(stage: _BlackboxStage[T]) -> None:
            self.trigger_request(stage.proxy.sub)
            requested = await stage.expect_request(
                f"Subscriber {stage.proxy.sub!r} did not signal demand via request (rule 2.1)"
            )
            # It must cope with the elements it asked for (at most 512: some ask for MAX_DEMAND).
            # The Java TCK means to do the same, but a bug there sends none.
            for i in range(min(requested, BLACKBOX_MAX_ELEMENTS)):
                if i % 10 == 0 and stage.is_cancelled:  # some skid is fine: sample only
                    break
                await stage.proxy.expect_next(await stage.signal_next())
            # Completing before the demand is met is legal (rule 1.2).
            stage.send_completion()

        self._blackbox_test(body)

    def test_untested_spec202_blackbox_should_asynchronously_dispatch(self) -> None:
        skip_untested("2.2")

    def test_required_spec203_blackbox_must_not_call_methods_on_subscription_or_publisher_in_on_complete(
        self,
    ) -> None:
        """Rule 2.3: on_complete calls neither request nor cancel."""

        async def body(stage: _BlackboxStage[T]) -> None:
            stage.subscribe(self.create_subscriber())
            # The stage records request/cancel called while on_complete runs.
            stage.send_completion()
            self.env.verify_no_async_errors_no_delay()

        self._blackbox_test(body, setup=False)

    def test_required_spec203_blackbox_must_not_call_methods_on_subscription_or_publisher_in_on_error(
        self,
    ) -> None:
        """Rule 2.3: on_error calls neither request nor cancel."""

        async def body(stage: _BlackboxStage[T]) -> None:
            stage.subscribe(self.create_subscriber())
            # The stage records request/cancel called while on_error runs.
            stage.send_error(TestException())
            self.env.verify_no_async_errors_no_delay()

        self._blackbox_test(body, setup=False)

    def test_untested_spec204_blackbox_must_consider_the_subscription_as_cancelled_in_after_recieving_on_complete_or_on_error(
        self,
    ) -> None:
        skip_untested("2.4")

    def test_required_spec205_blackbox_must_call_subscription_cancel_if_it_already_has_an_subscription_and_receives_another_on_subscribe_signal(
        self,
    ) -> None:
        """Rule 2.5: a second on_subscribe(s2) makes the subscriber cancel s2, and not request on it."""

        async def body(stage: _BlackboxStage[T]) -> None:
            second_cancelled = Latch(self.env)
            stage.sub.on_subscribe(_SecondSubscription(self.env, stage.proxy.sub, second_cancelled))
            await second_cancelled.expect_close(
                f"Expected SecondSubscription given to subscriber {stage.proxy.sub!r} to be cancelled, "
                "but `Subscription.cancel()` was not called (rule 2.5)"
            )
            self.env.verify_no_async_errors_no_delay()
            stage.send_completion()  # done: complete the subscriber under test

        self._blackbox_test(body)

    def test_untested_spec206_blackbox_must_call_subscription_cancel_if_it_is_no_longer_valid(
        self,
    ) -> None:
        skip_untested("2.6")

    def test_untested_spec207_blackbox_must_ensure_all_calls_on_its_subscription_take_place_from_the_same_thread_or_take_care_of_synchronization(
        self,
    ) -> None:
        skip_untested("2.7")

    def test_untested_spec208_blackbox_must_be_prepared_to_receive_on_next_signals_after_having_called_subscription_cancel(
        self,
    ) -> None:
        skip_untested("2.8")

    def test_required_spec209_blackbox_must_be_prepared_to_receive_an_on_complete_signal_with_preceding_request_call(
        self,
    ) -> None:
        """Rule 2.9: on_complete after the subscriber's request is accepted."""

        async def body(stage: _BlackboxStage[T]) -> None:
            self.trigger_request(stage.proxy.sub)
            await stage.expect_request(f"Subscriber {stage.proxy.sub!r} did not signal demand via request (rule 2.1)")
            stage.send_completion()
            await stage.proxy.expect_completion()

        self._blackbox_test(body)

    def test_required_spec209_blackbox_must_be_prepared_to_receive_an_on_complete_signal_without_preceding_request_call(
        self,
    ) -> None:
        """Rule 2.9: on_complete right after on_subscribe is accepted."""

        async def body(stage: _BlackboxStage[T]) -> None:
            stage.send_completion()
            await stage.proxy.expect_completion()

        self._blackbox_test(body)

    def test_required_spec210_blackbox_must_be_prepared_to_receive_an_on_error_signal_with_preceding_request_call(
        self,
    ) -> None:
        """Rule 2.10: on_error after the subscriber's request is accepted."""

        async def body(stage: _BlackboxStage[T]) -> None:
            self.trigger_request(stage.proxy.sub)
            await stage.expect_request(f"Subscriber {stage.proxy.sub!r} did not signal demand via request (rule 2.1)")
            stage.send_error(TestException())
            await stage.proxy.expect_error(BaseException)

        self._blackbox_test(body)

    def test_required_spec210_blackbox_must_be_prepared_to_receive_an_on_error_signal_without_preceding_request_call(
        self,
    ) -> None:
        """Rule 2.10: on_error right after on_subscribe is accepted."""

        async def body(stage: _BlackboxStage[T]) -> None:
            stage.send_error(TestException())
            await stage.proxy.expect_error(BaseException)

        self._blackbox_test(body)

    def test_untested_spec211_blackbox_must_make_sure_that_all_calls_on_its_methods_happen_before_the_processing_of_the_respective_events(
        self,
    ) -> None:
        skip_untested("2.11")

    def test_untested_spec212_blackbox_must_not_call_on_subscribe_more_than_once_based_on_object_equality(
        self,
    ) -> None:
        skip_untested("2.12")

    def test_untested_spec213_blackbox_failing_on_signal_invocation(self) -> None:
        skip_untested("2.13")

    def test_required_spec213_blackbox_on_subscribe_must_throw_null_pointer_when_parameters_are_null(
        self,
    ) -> None:
        """Rule 2.13: on_subscribe(None) raises TypeError (Java: NullPointerException)."""

        async def body(stage: _BlackboxStage[T]) -> None:
            subscriber = self.create_subscriber()
            self._expect_null_argument_error("on_subscribe", lambda: subscriber.on_subscribe(None))  # type: ignore[arg-type]  # None on purpose: the rule 2.13 / 1.9 check
            self.env.verify_no_async_errors_no_delay()

        self._blackbox_test(body, setup=False)

    def test_required_spec213_blackbox_on_next_must_throw_null_pointer_when_parameters_are_null(
        self,
    ) -> None:
        """Rule 2.13: on_next(None) after a valid on_subscribe raises TypeError."""

        async def body(stage: _BlackboxStage[T]) -> None:
            subscriber = self.create_subscriber()
            subscriber.on_subscribe(_NoopSubscription())
            self._expect_null_argument_error("on_next", lambda: subscriber.on_next(None))  # type: ignore[arg-type]  # None on purpose: the rule 2.13 / 1.9 check
            self.env.verify_no_async_errors_no_delay()

        self._blackbox_test(body, setup=False)

    def test_required_spec213_blackbox_on_error_must_throw_null_pointer_when_parameters_are_null(
        self,
    ) -> None:
        """Rule 2.13: on_error(None) after a valid on_subscribe raises TypeError."""

        async def body(stage: _BlackboxStage[T]) -> None:
            subscriber = self.create_subscriber()
            subscriber.on_subscribe(_NoopSubscription())
            self._expect_null_argument_error("on_error", lambda: subscriber.on_error(None))  # type: ignore[arg-type]  # None on purpose: the rule 2.13 / 1.9 check
            self.env.verify_no_async_errors_no_delay()

        self._blackbox_test(body, setup=False)

    # -- spec rules, section 3 ----------------------------------------------------------------

    def test_untested_spec301_blackbox_must_not_be_called_outside_subscriber_context(self) -> None:
        skip_untested("3.1")

    def test_untested_spec308_blackbox_request_must_register_given_number_elements_to_be_produced(
        self,
    ) -> None:
        skip_untested("3.8")

    def test_untested_spec310_blackbox_request_may_synchronously_call_on_next_on_subscriber(
        self,
    ) -> None:
        skip_untested("3.10")

    def test_untested_spec311_blackbox_request_may_synchronously_call_on_complete_or_on_error(
        self,
    ) -> None:
        skip_untested("3.11")

    def test_untested_spec314_blackbox_cancel_may_cause_the_publisher_to_shutdown_if_no_other_subscription_exists(
        self,
    ) -> None:
        skip_untested("3.14")

    def test_untested_spec315_blackbox_cancel_must_not_throw_exception_and_must_signal_on_error(
        self,
    ) -> None:
        skip_untested("3.15")

    def test_untested_spec316_blackbox_request_must_not_throw_exception_and_must_on_error_the_subscriber(
        self,
    ) -> None:
        skip_untested("3.16")


class _SecondSubscription(Subscription):
    """Rule 2.5: must be cancelled, and must not see a request."""

    def __init__(self, env: TestEnvironment, subscriber: Subscriber[Any], cancelled: Latch) -> None:
        self._env = env
        self._subscriber = subscriber
        self._cancelled = cancelled

    def request(self, n: int) -> None:
        self._env.flop(
            f"Subscriber {self._subscriber!r} illegally called `subscription.request({n})` on a second subscription (rule 2.5)"
        )

    def cancel(self) -> None:
        self._cancelled.close()

    def __repr__(self) -> str:
        return "SecondSubscription(should get cancelled)"


class _NoopSubscription(Subscription):
    def request(self, n: int) -> None:
        pass

    def cancel(self) -> None:
        pass
