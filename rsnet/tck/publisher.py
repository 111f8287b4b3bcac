"""``PublisherVerification``: the Publisher rules of the Reactive Streams TCK, as pytest tests.

Port of ``org.reactivestreams.tck.PublisherVerification`` (TCK 1.0.4): all 38 tests, named
after the Java ones in snake_case with the status prefix and the rule id kept, e.g.
``test_required_spec309_request_zero_must_signal_illegal_argument`` (Java's
IllegalArgumentException is ``ValueError`` here, NullPointerException is ``TypeError``).

Subclass it in a test module (the name must start with ``Test``; no ``__init__``)::

    class TestRange(PublisherVerification):
        def create_publisher(self, elements):
            return range_publisher(elements)          # exactly `elements` items, then on_complete

        def create_failed_publisher(self):
            return failing_publisher(RuntimeError())  # on_subscribe, then on_error

Factories are methods, settings are class attributes:

``create_publisher(elements) -> Publisher``
    A stream of exactly ``elements`` items followed by ``on_complete``; ``MAX_DEMAND`` means an
    endless stream. Called inside the test's ``trio.run``: ``self.nursery`` is there for any
    producer task.
``create_failed_publisher() -> Publisher | None``
    A publisher that signals ``on_subscribe`` then ``on_error``; ``None`` skips the tests that
    need it (and then they do not count as passed).
``max_elements_from_publisher`` (``MAX_DEMAND - 1``)
    The most elements the publisher can produce. Tests needing more are skipped; ``MAX_DEMAND``
    declares a publisher that never completes, which skips every test that needs ``on_complete``.
``bounded_depth_of_on_next_and_request_recursion`` (1)
    Rule 3.3: how deeply ``request`` from ``on_next`` may recurse into ``on_next``.
``skip_stochastic_tests`` (False)
    Skip the stochastic test of rule 1.3.

Plus the settings of :class:`rsnet.tck.environment.Verification` (``virtual_time``,
``timeout_ms``, ``no_signals_timeout_ms``, ``gc_timeout_ms``, the ``environment()`` hook).

Outcomes follow the Java TCK: ``required`` tests fail on a violation and are skipped only when
the publisher cannot serve them (too few elements, no completion, no failed publisher);
``optional`` tests turn a failure into a skip ("does not implement OPTIONAL requirement"),
except optional 1.4, which fails if a failed publisher is given and misbehaves; the
``stochastic`` test runs 100 times; ``untested`` tests always skip.
"""

from __future__ import annotations

import gc
import random
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic, TypeVar

import pytest
import trio

from rsnet.streams.interfaces import Publisher, Subscriber, Subscription
from rsnet.streams.rules import MAX_DEMAND
from rsnet.tck.environment import (
    BlackholeSubscriber,
    Latch,
    ManualSubscriber,
    TestEnvironment,
    Verification,
    _describe_caller,
    skip_untested,
)

T = TypeVar("T")

PublisherTestBody = Callable[[Publisher[Any]], Awaitable[None]]


class PublisherVerification(Verification, Generic[T]):
    """The Publisher rules (spec section 1 and the Subscription rules of section 3)."""

    max_elements_from_publisher: ClassVar[int] = MAX_DEMAND - 1
    bounded_depth_of_on_next_and_request_recursion: ClassVar[int] = 1
    skip_stochastic_tests: ClassVar[bool] = False

    def create_publisher(self, elements: int) -> Publisher[T]:
        """A publisher of exactly ``elements`` items then ``on_complete`` (``MAX_DEMAND``: endless)."""
        raise NotImplementedError(f"{type(self).__name__} must implement create_publisher(elements)")

    def create_failed_publisher(self) -> Publisher[T] | None:
        """A publisher that signals ``on_subscribe`` then ``on_error``, or ``None`` to skip those tests."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement create_failed_publisher() (return None to skip its tests)"
        )

    # -- harness ------------------------------------------------------------------------------

    def _check_can_run(self, elements: int, needs_completion: bool) -> None:
        if elements > self.max_elements_from_publisher:
            pytest.skip(
                f"Unable to run this test: it needs {elements} elements, "
                f"but max_elements_from_publisher is {self.max_elements_from_publisher}"
            )
        if needs_completion and self.max_elements_from_publisher == MAX_DEMAND:
            pytest.skip(
                "Unable to run this test: it needs on_complete, which this publisher never signals "
                "(max_elements_from_publisher == MAX_DEMAND)"
            )

    def _active_publisher_test(
        self,
        elements: int,
        needs_completion: bool,
        body: PublisherTestBody,
        *,
        optional_rule: str | None = None,
    ) -> None:
        """Run ``body(create_publisher(elements))``; skip if the publisher cannot serve it."""
        self._check_can_run(elements, needs_completion)

        async def run() -> None:
            await body(self.create_publisher(elements))

        self.run_test(run, optional_rule=optional_rule)

    def _failed_publisher_test(self, body: PublisherTestBody) -> None:
        """Run ``body(create_failed_publisher())``; skip if there is none."""

        async def run() -> None:
            publisher = self.create_failed_publisher()
            if publisher is None:
                pytest.skip(
                    "Skipping because no failed publisher was provided, and the test requires it: "
                    "implement create_failed_publisher() to run it"
                )
            await body(publisher)

        self.run_test(run)

    # -- test setup verification --------------------------------------------------------------

    def test_required_create_publisher_1_must_produce_a_stream_of_exactly_1_element(self) -> None:
        """create_publisher(1): one element on request(1), on_complete on the next request(1)."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            element = await sub.request_next_element_or_end_of_stream(
                f"Timeout while waiting for next element from Publisher {pub!r}"
            )
            assert element is not None, f"Publisher {pub!r} produced no elements"
            await sub.request_end_of_stream(f"Publisher {pub!r} did not complete after its 1 element")

        self._active_publisher_test(1, True, body)

    def test_required_create_publisher_3_must_produce_a_stream_of_exactly_3_elements(self) -> None:
        """create_publisher(3): three elements one request(1) at a time, then on_complete."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            for produced in range(3):
                element = await sub.request_next_element_or_end_of_stream(
                    f"Timeout while waiting for next element from Publisher {pub!r}"
                )
                assert element is not None, f"Publisher {pub!r} produced only {produced} element(s), expected 3"
            await sub.request_end_of_stream(f"Publisher {pub!r} did not complete after its 3 elements")

        self._active_publisher_test(3, True, body)

    def test_required_validate_max_elements_from_publisher(self) -> None:
        """The max_elements_from_publisher setting is >= 0."""
        assert self.max_elements_from_publisher >= 0, "max_elements_from_publisher MUST be a number >= 0"

    def test_required_validate_bounded_depth_of_on_next_and_request_recursion(self) -> None:
        """The bounded_depth_of_on_next_and_request_recursion setting is >= 1."""
        assert self.bounded_depth_of_on_next_and_request_recursion >= 1, (
            "bounded_depth_of_on_next_and_request_recursion MUST be a number >= 1"
        )

    # -- spec rules, section 1 ----------------------------------------------------------------

    def test_required_spec101_subscription_request_must_result_in_the_correct_number_of_produced_elements(
        self,
    ) -> None:
        """Rule 1.1: nothing before request; request(1) gives 1, request(1)+request(2) give 3 more."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            try:
                await sub.expect_none(f"Publisher {pub!r} produced a signal before the first `request` (rule 1.1):")
                sub.request(1)
                await sub.next_element(f"Publisher {pub!r} produced no element after first `request`")
                await sub.expect_none(f"Publisher {pub!r} produced unrequested (rule 1.1):")
                sub.request(1)
                sub.request(2)
                await sub.next_elements(
                    3,
                    f"Publisher {pub!r} produced less than 3 elements after two respective `request` calls",
                )
                await sub.expect_none(f"Publisher {pub!r} produced unrequested (rule 1.1):")
            finally:
                sub.cancel()

        self._active_publisher_test(5, False, body)

    def test_required_spec102_may_signal_less_than_requested_and_terminate_subscription(
        self,
    ) -> None:
        """Rule 1.2: pub(3) with request(10) signals 3 elements, then on_complete."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            sub.request(10)
            await sub.next_elements(3)
            await sub.expect_completion(f"Publisher {pub!r} did not complete after its 3 elements (rule 1.2)")

        self._active_publisher_test(3, True, body)

    def test_stochastic_spec103_must_signal_on_methods_sequentially(self) -> None:
        """Rule 1.3: 100 runs of pub(10); no signal may start while another one runs elsewhere.

        Nesting on one stack (a synchronous publisher signalling from ``request``) is allowed;
        a signal entered from another thread or trio task while one is running is not.
        """
        if self.skip_stochastic_tests:
            pytest.skip("Skipping stochastic test because skip_stochastic_tests is True (rule 1.3)")
        iterations, elements = 100, 10
        self._check_can_run(elements, True)

        async def run() -> None:
            for iteration in range(1, iterations + 1):
                await self._spec103_iteration(self.create_publisher(elements), iteration, iterations, elements)
                self.env.verify_no_async_errors_no_delay()

        self.run_test(run)

    async def _spec103_iteration(self, pub: Publisher[T], iteration: int, iterations: int, elements: int) -> None:
        subscriber = _SequentialSignalsSubscriber(self.env, elements)
        pub.subscribe(subscriber)
        await subscriber.completion.expect_close(
            f"Failed in iteration {iteration} of {iterations}. Expected completion signal after signalling "
            f"{elements} elements (signalled {subscriber.received}, last error: {subscriber.error!r}), "
            "yet did not receive it",
            elements * self.env.timeout_ms,
        )

    def test_optional_spec104_must_signal_on_error_when_fails(self) -> None:
        """Rule 1.4: the failed publisher signals on_subscribe once, then on_error once, unrequested.

        Skipped only without a failed publisher: one that misbehaves fails this test.
        """

        async def body(pub: Publisher[T]) -> None:
            env = self.env
            on_error_latch = Latch(env)
            on_subscribe_latch = Latch(env)
            subscriber = _SignalFloppingSubscriber(env, on_subscribe_latch, on_error_latch, pub)
            try:
                pub.subscribe(subscriber)
            except Exception as error:
                raise AssertionError(
                    f"Publisher {pub!r} raised {error!r} from subscribe() instead of signalling the error "
                    "via on_error (rules 1.4, 1.9)"
                ) from error
            await on_subscribe_latch.expect_close("Should have received on_subscribe (rule 1.9)")
            await on_error_latch.expect_close(
                f"Error-state Publisher {pub!r} did not call `on_error` on new Subscriber (rule 1.4)"
            )
            await env.verify_no_async_errors()

        self._failed_publisher_test(body)

    def test_required_spec105_must_signal_on_complete_when_finite_stream_terminates(self) -> None:
        """Rule 1.5: pub(3) read one by one, then request(1) gives on_complete, then silence."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            for _ in range(3):
                await sub.request_next_element()
            await sub.request_end_of_stream(
                f"Publisher {pub!r} did not signal on_complete after its 3 elements (rule 1.5)"
            )
            await sub.expect_none(f"Publisher {pub!r} signalled after on_complete (rule 1.7):")

        self._active_publisher_test(3, True, body)

    def test_optional_spec105_empty_stream_must_terminate_by_signalling_on_complete(self) -> None:
        """Rule 1.5: pub(0) with request(1) signals on_complete, then silence."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            sub.request(1)
            await sub.expect_completion(f"Empty Publisher {pub!r} did not signal on_complete")
            await sub.expect_none(f"Publisher {pub!r} signalled after on_complete:")

        self._active_publisher_test(0, True, body, optional_rule="1.5")

    def test_untested_spec106_must_consider_subscription_cancelled_after_on_error_or_on_complete_has_been_called(
        self,
    ) -> None:
        skip_untested("1.6")

    def test_required_spec107_must_not_emit_further_signals_once_on_complete_has_been_signalled(
        self,
    ) -> None:
        """Rule 1.7: pub(1) gives 1 element and on_complete for request(10); a later request(10) nothing."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            sub.request(10)
            await sub.next_element()
            await sub.expect_completion(f"Publisher {pub!r} did not complete after its only element")
            sub.request(10)
            await sub.expect_none(f"Publisher {pub!r} signalled after on_complete (rule 1.7):")

        self._active_publisher_test(1, True, body)

    def test_untested_spec107_must_not_emit_further_signals_once_on_error_has_been_signalled(
        self,
    ) -> None:
        skip_untested("1.7")

    def test_untested_spec108_possibly_canceled_subscription_should_not_receive_on_error_or_on_complete_signals(
        self,
    ) -> None:
        skip_untested("1.8")

    def test_untested_spec109_subscribe_should_not_throw_non_fatal_throwable(self) -> None:
        skip_untested("1.9")

    def test_required_spec109_subscribe_throw_null_pointer_on_null_subscriber(self) -> None:
        """Rule 1.9: subscribe(None) raises TypeError synchronously (Java: NullPointerException)."""

        async def body(pub: Publisher[T]) -> None:
            try:
                pub.subscribe(None)  # type: ignore[arg-type]  # None on purpose: the rule 2.13 / 1.9 check
            except TypeError:
                pass
            except Exception as error:
                raise AssertionError(
                    f"Publisher {pub!r} raised {error!r} for subscribe(None), but rule 1.9 requires TypeError"
                ) from error
            else:
                raise AssertionError(f"Publisher {pub!r} did not raise TypeError for subscribe(None) (rule 1.9)")

        self._active_publisher_test(0, False, body)

    def test_required_spec109_must_issue_on_subscribe_for_non_null_subscriber(self) -> None:
        """Rule 1.9: pub(0) without any request signals on_subscribe exactly once, before anything else."""

        async def body(pub: Publisher[T]) -> None:
            env = self.env
            subscriber = _OnSubscribeFirstSubscriber(env)
            try:
                pub.subscribe(subscriber)
                await subscriber.on_subscribe_latch.expect_close("Should have received on_subscribe (rule 1.9)")
                env.verify_no_async_errors_no_delay()
            finally:
                if subscriber.subscription is not None:
                    subscriber.subscription.cancel()

        self._active_publisher_test(0, False, body)

    def test_required_spec109_may_reject_calls_to_subscribe_if_publisher_is_unable_or_unwilling_to_serve_them_rejection_must_trigger_on_error_after_on_subscribe(
        self,
    ) -> None:
        """Rule 1.9: the failed publisher signals on_subscribe once, then on_error once."""

        async def body(pub: Publisher[T]) -> None:
            env = self.env
            sub = _RejectionSubscriber(env)
            pub.subscribe(sub)
            await sub.on_subscribe_latch.expect_close("Should have received on_subscribe (rule 1.9)")
            await sub.on_error_latch.expect_close("Should have received on_error (rule 1.9)")
            env.verify_no_async_errors_no_delay()

        self._failed_publisher_test(body)

    def test_untested_spec110_reject_a_subscription_request_if_the_same_subscriber_subscribes_twice(
        self,
    ) -> None:
        skip_untested("1.10")

    def test_optional_spec111_may_support_multi_subscribe(self) -> None:
        """Rule 1.11: two subscribers may subscribe to pub(1) without an error."""

        async def body(pub: Publisher[T]) -> None:
            sub1 = await self.env.new_manual_subscriber(pub)
            sub2 = await self.env.new_manual_subscriber(pub)
            try:
                await self.env.verify_no_async_errors()
            finally:
                sub1.cancel()
                sub2.cancel()

        self._active_publisher_test(1, False, body, optional_rule="1.11")

    def test_optional_spec111_registered_subscribers_must_receive_on_next_or_on_complete_signals(
        self,
    ) -> None:
        """Rule 1.11: two subscribers of pub(1) each get on_next or on_complete for request(1)."""

        async def body(pub: Publisher[T]) -> None:
            sub1 = await self.env.new_manual_subscriber(pub)
            sub2 = await self.env.new_manual_subscriber(pub)
            # Unicast or multicast is the publisher's choice, so either signal will do.
            await sub1.request_next_element_or_end_of_stream()
            await sub2.request_next_element_or_end_of_stream()
            try:
                await self.env.verify_no_async_errors()
            finally:
                sub1.cancel()
                sub2.cancel()

        self._active_publisher_test(1, False, body, optional_rule="1.11")

    def test_optional_spec111_multicast_must_produce_the_same_elements_in_the_same_sequence_to_all_of_its_subscribers_when_requesting_one_by_one(
        self,
    ) -> None:
        """Rule 1.11: three subscribers of pub(5) requesting in different steps see one sequence."""

        async def body(pub: Publisher[T]) -> None:
            env = self.env
            sub1 = await env.new_manual_subscriber(pub)
            sub2 = await env.new_manual_subscriber(pub)
            sub3 = await env.new_manual_subscriber(pub)

            def missing(n: int, which: str) -> str:
                return f"Publisher {pub!r} did not produce the requested {n} element(s) on {which} subscriber"

            def incomplete(which: str) -> str:
                return f"Publisher {pub!r} did not complete the stream as expected on {which} subscriber"

            sub1.request(1)
            x1 = await sub1.next_element(missing(1, "1st"))
            sub2.request(2)
            y1 = await sub2.next_elements(2, missing(2, "2nd"))
            sub1.request(1)
            x2 = await sub1.next_element(missing(1, "1st"))
            sub3.request(3)
            z1 = await sub3.next_elements(3, missing(3, "3rd"))
            sub3.request(1)
            z2 = await sub3.next_element(missing(1, "3rd"))
            sub3.request(1)
            z3 = await sub3.next_element(missing(1, "3rd"))
            await sub3.request_end_of_stream(incomplete("3rd"))
            sub2.request(3)
            y2 = await sub2.next_elements(3, missing(3, "2nd"))
            await sub2.request_end_of_stream(incomplete("2nd"))
            sub1.request(2)
            x3 = await sub1.next_elements(2, missing(2, "1st"))
            sub1.request(1)
            x4 = await sub1.next_element(missing(1, "1st"))
            await sub1.request_end_of_stream(incomplete("1st"))

            _expect_same_sequence(pub, {1: [x1, x2, *x3, x4], 2: [*y1, *y2], 3: [*z1, z2, z3]})

        self._active_publisher_test(5, True, body, optional_rule="1.11")

    async def _three_subscribers_request_many_upfront(self, pub: Publisher[T], expect_completion: bool) -> None:
        env = self.env
        subs = [await env.new_manual_subscriber(pub) for _ in range(3)]
        # A publisher may need to touch its source to notice it is drained, so ask for one more.
        for sub in subs:
            sub.request(4)
        received = [await sub.next_elements(3) for sub in subs]
        if expect_completion:
            for sub in subs:
                await sub.expect_completion()
        _expect_same_sequence(pub, dict(enumerate(received, start=1)))

    def test_optional_spec111_multicast_must_produce_the_same_elements_in_the_same_sequence_to_all_of_its_subscribers_when_requesting_many_upfront(
        self,
    ) -> None:
        """Rule 1.11: three subscribers of pub(3) each requesting 4 get the same 3 elements."""

        async def body(pub: Publisher[T]) -> None:
            # Completion is not checked: a similar test does that.
            await self._three_subscribers_request_many_upfront(pub, expect_completion=False)

        self._active_publisher_test(3, False, body, optional_rule="1.11")

    def test_optional_spec111_multicast_must_produce_the_same_elements_in_the_same_sequence_to_all_of_its_subscribers_when_requesting_many_upfront_and_complete_as_expected(
        self,
    ) -> None:
        """Rule 1.11: as above, and all three subscribers get on_complete."""

        async def body(pub: Publisher[T]) -> None:
            await self._three_subscribers_request_many_upfront(pub, expect_completion=True)

        self._active_publisher_test(3, True, body, optional_rule="1.11")

    # -- spec rules, section 3 ----------------------------------------------------------------

    def test_required_spec302_must_allow_synchronous_request_calls_from_on_next_and_on_subscribe(
        self,
    ) -> None:
        """Rule 3.2: request(1) x3 inside on_subscribe and request(1) inside every on_next work."""

        async def body(pub: Publisher[T]) -> None:
            sub = _RequestingFromSignalsSubscriber(self.env)
            await self.env.subscribe(pub, sub)
            await self.env.verify_no_async_errors()

        self._active_publisher_test(6, False, body)

    def test_required_spec303_must_not_allow_unbounded_recursion(self) -> None:
        """Rule 3.3: request(1) from on_next may nest on_next at most bounded_depth_... deep."""
        bound = self.bounded_depth_of_on_next_and_request_recursion
        limit = bound + 1

        async def body(pub: Publisher[T]) -> None:
            env = self.env
            sub = _RecursionDepthSubscriber(env, bound, limit)
            try:
                await env.subscribe(pub, sub)
                sub.request(1)  # kicks off request -> on_next -> request -> on_next ...
                await sub.run_completed.expect_close(
                    f"Unable to validate call stack depth safety, awaited at most {limit} signals "
                    f"(bounded_depth_of_on_next_and_request_recursion + 1) or completion"
                )
                env.verify_no_async_errors_no_delay()
            finally:
                # The request/on_next loop may keep the publisher going: stop it.
                sub.cancel()

        self._active_publisher_test(limit, False, body)

    def test_untested_spec304_request_should_not_perform_heavy_computations(self) -> None:
        skip_untested("3.4")

    def test_untested_spec305_cancel_must_not_synchronously_perform_heavy_computation(self) -> None:
        skip_untested("3.5")

    def test_required_spec306_after_subscription_is_cancelled_request_must_be_nops(self) -> None:
        """Rule 3.6: cancel() then request(1) x3 produces no signal at all."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            sub.cancel()
            sub.request(1)
            sub.request(1)
            sub.request(1)
            await sub.expect_none(f"Publisher {pub!r} signalled after cancel() and request() (rule 3.6):")
            self.env.verify_no_async_errors_no_delay()

        self._active_publisher_test(3, False, body)

    def test_required_spec307_after_subscription_is_cancelled_additional_cancelations_must_be_nops(
        self,
    ) -> None:
        """Rule 3.7: cancel() x3 returns normally and produces no signal."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            subscription = sub.subscription.value
            subscription.cancel()
            subscription.cancel()
            subscription.cancel()
            await sub.expect_none(f"Publisher {pub!r} signalled after cancel() (rule 3.7):")
            self.env.verify_no_async_errors_no_delay()

        self._active_publisher_test(1, False, body)

    async def _expect_invalid_request_error(self, pub: Publisher[T], n: int, message_parts: list[str] | None) -> None:
        sub = await self.env.new_manual_subscriber(pub)
        try:
            sub.request(n)
        except Exception as error:
            raise AssertionError(
                f"Publisher {pub!r}: request({n}) raised {error!r}; rule 3.9 requires signalling "
                "on_error(ValueError) instead, and rule 3.16 requires request to return normally"
            ) from error
        message = f"Publisher {pub!r} did not signal on_error(ValueError) after request({n}) (rule 3.9)"
        if message_parts is None:
            await sub.expect_error(ValueError, message)
        else:
            await sub.expect_error_with_message(ValueError, message_parts, message)

    def test_required_spec309_request_zero_must_signal_illegal_argument(self) -> None:
        """Rule 3.9: request(0) signals on_error(ValueError) (Java: IllegalArgumentException), not a raise."""

        async def body(pub: Publisher[T]) -> None:
            await self._expect_invalid_request_error(pub, 0, None)

        self._active_publisher_test(10, False, body)

    def test_required_spec309_request_negative_number_must_signal_illegal_argument(self) -> None:
        """Rule 3.9: request(random negative) signals on_error(ValueError), not a raise."""

        async def body(pub: Publisher[T]) -> None:
            await self._expect_invalid_request_error(pub, -random.randint(1, 2**31 - 1), None)

        self._active_publisher_test(10, False, body)

    def test_optional_spec309_request_negative_number_may_signal_illegal_argument_with_specific_message(
        self,
    ) -> None:
        """Rule 3.9: the ValueError's message says "3.9" or "non-positive/negative subscription request"."""

        async def body(pub: Publisher[T]) -> None:
            await self._expect_invalid_request_error(
                pub,
                -random.randint(1, 2**31 - 1),
                ["3.9", "non-positive subscription request", "negative subscription request"],
            )

        self._active_publisher_test(10, False, body, optional_rule="3.9")

    def test_required_spec312_cancel_must_make_the_publisher_to_eventually_stop_signaling(
        self,
    ) -> None:
        """Rule 3.12: after cancel, late elements are tolerated up to the demand (15), then they stop."""
        demand1, demand2 = 10, 5
        total_demand = demand1 + demand2

        async def body(pub: Publisher[T]) -> None:
            env = self.env
            sub = await env.new_manual_subscriber(pub)
            sub.request(demand1)
            sub.request(demand2)
            # Take one element before cancelling: an asynchronous publisher may legally handle a
            # cancel before it ever emitted, which would leave nothing to observe.
            await sub.next_element()
            sub.cancel()
            signalled = 1
            while True:
                await trio.sleep(env.no_signals_timeout_s)
                # Late terminal signals are not this rule's business (1.8 is a SHOULD, untested).
                late = [entry for entry in sub.received.drain() if sub.received.is_element(entry)]
                if not late:
                    break
                signalled += len(late)
                assert signalled <= total_demand, (
                    f"Publisher {pub!r} signalled [{signalled}] elements, which is more than the signalled "
                    f"demand: {total_demand} (rules 1.1, 3.12)"
                )

        self._active_publisher_test(20, False, body)

    def test_required_spec313_cancel_must_make_the_publisher_eventually_drop_all_references_to_the_subscriber(
        self,
    ) -> None:
        """Rule 3.13: gc_timeout_ms after cancel, gc.collect() frees the subscriber."""

        async def subscribe_take_one_and_cancel(
            pub: Publisher[T],
        ) -> weakref.ref[ManualSubscriber[T]]:
            # A separate coroutine, so that no frame of the test keeps the subscriber alive.
            sub = await self.env.new_manual_subscriber(pub)
            ref = weakref.ref(sub)
            sub.request(1)
            await sub.next_element()
            sub.cancel()
            return ref

        async def body(pub: Publisher[T]) -> None:
            ref = await subscribe_take_one_and_cancel(pub)
            # cancel may take effect asynchronously: give the publisher gc_timeout to let go.
            await trio.sleep(self.env.gc_timeout_s)
            gc.collect()
            sub = ref()
            if sub is not None:
                holders = ", ".join(sorted({type(r).__name__ for r in gc.get_referrers(sub)} - {"frame"}))
                del sub
                raise AssertionError(
                    f"Publisher {pub!r} did not drop its reference to the test subscriber "
                    f"{self.env.ms(self.env.gc_timeout_ms)} after the subscription was cancelled "
                    f"(rule 3.13); it is still referenced by: {holders}"
                )

        self._active_publisher_test(3, False, body)

    def test_required_spec317_must_support_a_pending_element_count_up_to_long_max_value(
        self,
    ) -> None:
        """Rule 3.17: request(MAX_DEMAND) on pub(3) gives 3 elements and on_complete."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            sub.request(MAX_DEMAND)
            await sub.next_elements(3)
            await sub.expect_completion(f"Publisher {pub!r} did not complete after request({MAX_DEMAND}) (rule 3.17)")
            self.env.verify_no_async_errors_no_delay()

        self._active_publisher_test(3, True, body)

    def test_required_spec317_must_support_a_cumulative_pending_element_count_up_to_long_max_value(
        self,
    ) -> None:
        """Rule 3.17: request(MAX//2) twice plus request(1) (= MAX_DEMAND) works on pub(3)."""

        async def body(pub: Publisher[T]) -> None:
            sub = await self.env.new_manual_subscriber(pub)
            sub.request(MAX_DEMAND // 2)  # pending: MAX_DEMAND // 2
            sub.request(MAX_DEMAND // 2)  # pending: MAX_DEMAND - 1
            sub.request(1)  # pending: MAX_DEMAND
            try:
                await sub.next_elements(
                    3,
                    f"Publisher {pub!r} did not deliver its 3 elements for a cumulative demand of MAX_DEMAND (rule 3.17)",
                )
                await sub.expect_completion(
                    f"Publisher {pub!r} did not complete for a cumulative demand of MAX_DEMAND (rule 3.17)"
                )
                self.env.verify_no_async_errors_no_delay()
            finally:
                sub.cancel()

        self._active_publisher_test(3, True, body)

    def test_required_spec317_must_not_signal_on_error_when_pending_above_long_max_value(
        self,
    ) -> None:
        """Rule 3.17: request(MAX_DEMAND - 1) from each of 10 on_next never errors; demand saturates.

        Unlike the Java TCK, this also checks that elements keep coming after the overflow.
        """

        async def body(pub: Publisher[T]) -> None:
            sub = _OverflowingDemandSubscriber(self.env)
            await self.env.subscribe(pub, sub)
            # The first on_next starts up to 10 request(MAX_DEMAND - 1): sure to exceed MAX_DEMAND.
            sub.request(1)
            try:
                # Beyond the Java TCK: demand is now unbounded, so elements must keep coming until
                # the subscriber cancels; a stall means the demand wrapped around or got lost.
                await sub.cancelling.expect_close(
                    f"Publisher {pub!r} stopped signalling after {sub.received_count} element(s) although the "
                    "demand exceeded MAX_DEMAND, which must count as unbounded (rule 3.17)"
                )
                await self.env.verify_no_async_errors()
            finally:
                sub.cancel()

        self._active_publisher_test(2**31 - 1, False, body)


def _expect_same_sequence(pub: Publisher[Any], sequences: dict[int, list[Any]]) -> None:
    """Rule 1.11 (multicast): every subscriber saw the same elements in the same order."""
    first = sequences[1]
    for number, sequence in sequences.items():
        if sequence != first:
            raise AssertionError(
                f"Publisher {pub!r} did not produce the same element sequence for subscribers 1 "
                f"and {number}: {first} != {sequence}"
            )


# -- the TCK's subscribers for these tests ------------------------------------------------------


class _SequentialSignalsSubscriber(Subscriber[Any]):
    """Rule 1.3: requests one by one and records a signal that overlaps another one."""

    def __init__(self, env: TestEnvironment, elements: int) -> None:
        self._env = env
        self._elements = elements
        self._subscription: Subscription | None = None
        self._lock = threading.Lock()
        self._owner: tuple[int, int | None] | None = None
        self._owner_name = ""
        self._depth = 0
        self._current = ""
        self.received = 0
        self.error: BaseException | None = None
        self.completion = Latch(env)

    def _enter(self, signal: str) -> None:
        caller, name = _describe_caller()
        with self._lock:
            if self._owner is None:
                self._owner, self._owner_name, self._depth = caller, name, 1
            elif self._owner == caller:
                self._depth += 1  # nested on the same stack: a synchronous publisher, allowed
            else:
                self._env.flop(
                    f"Illegal concurrent access detected (rule 1.3)! {name} signalled {signal} "
                    f"before {self._owner_name} finished its {self._current} signal"
                )
                return
            self._current = signal

    def _leave(self) -> None:
        caller, _ = _describe_caller()
        with self._lock:
            if self._owner == caller:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None

    def on_subscribe(self, subscription: Subscription) -> None:
        self._enter("on_subscribe()")
        try:
            self._subscription = subscription
            subscription.request(1)
        finally:
            self._leave()

    def on_next(self, element: Any) -> None:
        self._enter(f"on_next({element!r})")
        try:
            self.received += 1
            # One more than the stream holds: some publishers only complete on demand.
            if self.received <= self._elements and self._subscription is not None:
                self._subscription.request(1)
        finally:
            self._leave()

    def on_error(self, error: BaseException) -> None:
        self._enter(f"on_error({error!r})")
        self.error = error
        self._leave()

    def on_complete(self) -> None:
        self._enter("on_complete()")
        self._leave()
        self.completion.close()


class _SignalFloppingSubscriber(Subscriber[Any]):
    """Rule 1.4: expects exactly on_subscribe then on_error, nothing else."""

    def __init__(
        self,
        env: TestEnvironment,
        on_subscribe_latch: Latch,
        on_error_latch: Latch,
        pub: Publisher[Any],
    ) -> None:
        self._env = env
        self._on_subscribe_latch = on_subscribe_latch
        self._on_error_latch = on_error_latch
        self._pub = pub

    def on_subscribe(self, subscription: Subscription) -> None:
        self._on_subscribe_latch.assert_open("Only one on_subscribe call expected (rule 1.9)")
        self._on_subscribe_latch.close()

    def on_next(self, element: Any) -> None:
        self._env.flop(
            f"Unexpected on_next({element!r}) from the failed publisher {self._pub!r} (nothing was requested)"
        )

    def on_error(self, error: BaseException) -> None:
        self._on_subscribe_latch.assert_closed("on_subscribe should be called prior to on_error always (rule 1.9)")
        self._on_error_latch.assert_open(
            f"Error-state Publisher {self._pub!r} called `on_error` twice on new Subscriber (rule 1.7)"
        )
        self._on_error_latch.close()

    def on_complete(self) -> None:
        self._env.flop(f"Unexpected on_complete() from the failed publisher {self._pub!r}")


class _OnSubscribeFirstSubscriber(Subscriber[Any]):
    """Rule 1.9: on_subscribe exactly once and before any other signal."""

    def __init__(self, env: TestEnvironment) -> None:
        self.subscription: Subscription | None = None
        self.on_subscribe_latch = Latch(env)

    def on_subscribe(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.on_subscribe_latch.assert_open("Only one on_subscribe call expected (rules 1.9, 2.12)")
        self.on_subscribe_latch.close()

    def on_next(self, element: Any) -> None:
        self.on_subscribe_latch.assert_closed("on_subscribe should be called prior to on_next always (rule 1.9)")

    def on_error(self, error: BaseException) -> None:
        self.on_subscribe_latch.assert_closed("on_subscribe should be called prior to on_error always (rule 1.9)")

    def on_complete(self) -> None:
        self.on_subscribe_latch.assert_closed("on_subscribe should be called prior to on_complete always (rule 1.9)")


class _RejectionSubscriber(ManualSubscriber[Any]):
    """Rule 1.9 (rejection): on_subscribe once, then on_error once."""

    def __init__(self, env: TestEnvironment) -> None:
        super().__init__(env)
        self.on_subscribe_latch = Latch(env)
        self.on_error_latch = Latch(env)

    def on_subscribe(self, subscription: Subscription) -> None:
        self.on_subscribe_latch.assert_open("Only one on_subscribe call expected (rules 1.9, 2.12)")
        self.on_subscribe_latch.close()

    def on_error(self, error: BaseException) -> None:
        self.on_subscribe_latch.assert_closed("on_subscribe should be called prior to on_error always (rule 1.9)")
        self.on_error_latch.assert_open("Only one on_error call expected (rule 1.7)")
        self.on_error_latch.close()


class _RequestingFromSignalsSubscriber(ManualSubscriber[Any]):
    """Rule 3.2: requests synchronously from on_subscribe and on_next (keeps no elements)."""

    def on_subscribe(self, subscription: Subscription) -> None:
        super().on_subscribe(subscription)
        subscription.request(1)
        subscription.request(1)
        subscription.request(1)

    def on_next(self, element: Any) -> None:
        if self._check_subscribed(f"on_next({element!r})"):
            self.subscription.value.request(1)


class _RecursionDepthSubscriber(ManualSubscriber[Any]):
    """Rule 3.3: requests from on_next and records nesting of on_next on one stack beyond ``bound``."""

    def __init__(self, env: TestEnvironment, bound: int, limit: int) -> None:
        super().__init__(env)
        self._bound = bound
        self._limit = limit
        self._depth = threading.local()
        self._signals_received = 0
        self.run_completed = Latch(env)

    def on_next(self, element: Any) -> None:
        # Elements are not kept: only stack depth matters, and the receptacle could overflow.
        if not self._check_subscribed(f"on_next({element!r})"):
            return
        self._signals_received += 1
        depth = getattr(self._depth, "value", 0) + 1
        self._depth.value = depth
        try:
            if depth > self._bound:
                caller = _describe_caller()[1]
                self.env.flop(
                    f"Got {depth} nested on_next calls within {caller}, yet expected recursive bound was "
                    f"{self._bound} (rule 3.3): request() called from on_next must not call on_next "
                    "again deeper than that (use a drain loop)"
                )
                self.run_completed.close()  # stop the recursive call chain
            elif self._signals_received >= self._limit:
                self.run_completed.close()  # enough signals within the bound: success
            else:
                self.subscription.value.request(1)  # the publisher must break the recursion
        finally:
            self._depth.value = depth - 1

    def on_complete(self) -> None:
        super().on_complete()
        self.run_completed.close()

    def on_error(self, error: BaseException) -> None:
        super().on_error(error)
        self.run_completed.close()


class _OverflowingDemandSubscriber(BlackholeSubscriber[Any]):
    """Rule 3.17: request(MAX_DEMAND - 1) from 10 on_next, then cancel."""

    def __init__(self, env: TestEnvironment) -> None:
        super().__init__(env)
        self._calls_left = 10  # overflow happens after 2 calls already; 10 is plenty
        self.received_count = 0
        self.cancelling = Latch(env)

    def on_next(self, element: Any) -> None:
        if not self._check_subscribed(f"on_next({element!r})"):
            return
        self.received_count += 1
        if self._calls_left > 0:
            self._calls_left -= 1
            self.subscription.value.request(MAX_DEMAND - 1)
        else:
            self.subscription.value.cancel()
            self.cancelling.close()
