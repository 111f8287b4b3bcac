"""The synchronous sources and the shared rule machinery, rule by rule."""

from __future__ import annotations

import gc
import weakref

import pytest

import rsnet
from rsnet.streams.rules import MAX_DEMAND, add_demand, set_undeliverable_handler, validate_subscription

from .support import Recorder


def test_rule_3_17_demand_saturates_at_2_63_minus_1():
    assert add_demand(MAX_DEMAND // 2, MAX_DEMAND // 2 + 1) == MAX_DEMAND
    assert add_demand(MAX_DEMAND, MAX_DEMAND) == MAX_DEMAND
    assert add_demand(3, 4) == 7


def test_rule_1_1_emits_no_more_than_requested():
    recorder = Recorder()
    rsnet.range_(0, 10).subscribe(recorder)
    assert recorder.items == []
    recorder.request(3)
    assert recorder.items == [0, 1, 2]
    recorder.request(2)
    assert recorder.items == [0, 1, 2, 3, 4]
    assert not recorder.terminated


def test_rule_1_5_completes_after_the_last_item_without_extra_demand():
    recorder = Recorder(initial=3)
    rsnet.just("a", "b", "c").subscribe(recorder)
    assert recorder.items == ["a", "b", "c"]
    assert recorder.completions == 1


def test_rule_1_9_subscribe_none_raises_type_error():
    for publisher in (rsnet.range_(0, 1), rsnet.empty(), rsnet.error(ValueError())):
        with pytest.raises(TypeError, match=r"1\.9"):
            publisher.subscribe(None)  # type: ignore[arg-type]


def test_rule_1_9_on_subscribe_comes_first_even_for_failures():
    recorder = Recorder()
    rsnet.error(RuntimeError("boom")).subscribe(recorder)
    assert recorder.signals == ["on_subscribe", "on_error"]

    class Broken:
        def __iter__(self):
            raise OSError("cannot iterate")

    recorder = Recorder()
    rsnet.from_iterable(Broken()).subscribe(recorder)
    assert recorder.signals == ["on_subscribe", "on_error"]
    assert isinstance(recorder.errors[0], OSError)


def test_empty_completes_without_request():
    recorder = Recorder()
    rsnet.empty().subscribe(recorder)
    assert recorder.signals == ["on_subscribe", "on_complete"]


@pytest.mark.parametrize("n", [0, -1, -(2**63)])
def test_rule_3_9_non_positive_request_signals_value_error(n):
    recorder = Recorder()
    rsnet.range_(0, 10).subscribe(recorder)
    recorder.request(n)  # must not raise
    assert len(recorder.errors) == 1
    assert isinstance(recorder.errors[0], ValueError)
    assert "3.9" in str(recorder.errors[0])
    recorder.request(5)  # rule 1.6 / 3.6: the subscription is over
    assert recorder.items == []


def test_rule_3_9_request_zero_from_on_next_is_signalled_after_on_next_returns():
    signals = []

    class Zero(Recorder):
        def on_next(self, item):
            signals.append(("enter", item))
            super().on_next(item)
            self.request(0)
            signals.append(("leave", item))

        def on_error(self, error):
            signals.append(("error", type(error)))
            super().on_error(error)

    recorder = Zero(initial=5)
    rsnet.range_(0, 10).subscribe(recorder)
    # rule 1.3: on_error is not nested inside on_next
    assert signals == [("enter", 0), ("leave", 0), ("error", ValueError)]


def test_rule_3_3_request_from_on_next_does_not_recurse():
    depth = 0
    max_depth = 0

    class OneByOne(Recorder):
        def on_next(self, item):
            nonlocal depth, max_depth
            depth += 1
            max_depth = max(max_depth, depth)
            super().on_next(item)
            self.request(1)
            depth -= 1

    recorder = OneByOne(initial=1)
    rsnet.range_(0, 10_000).subscribe(recorder)
    assert len(recorder.items) == 10_000
    assert recorder.completions == 1
    assert max_depth == 1


def test_rule_3_17_unbounded_request_completes_a_finite_stream():
    recorder = Recorder()
    rsnet.range_(0, 3).subscribe(recorder)
    recorder.request(MAX_DEMAND)
    recorder.request(MAX_DEMAND)
    assert recorder.items == [0, 1, 2] and recorder.completions == 1


def test_rule_3_6_and_3_7_after_cancel_requests_and_cancels_are_noops():
    recorder = Recorder()
    rsnet.range_(0, 10).subscribe(recorder)
    recorder.cancel()
    recorder.cancel()
    recorder.request(5)
    recorder.request(0)
    assert recorder.signals == ["on_subscribe"]


def test_rule_3_13_cancel_drops_the_reference_to_the_subscriber():
    recorder = Recorder(initial=1)
    publisher = rsnet.range_(0, 10)
    publisher.subscribe(recorder)
    subscription = recorder.subscription
    recorder.cancel()
    ref = weakref.ref(recorder)
    del recorder
    gc.collect()
    assert ref() is None
    assert subscription is not None  # the subscription itself is still alive


def test_rule_2_13_an_iterable_yielding_none_fails_the_stream():
    recorder = Recorder(initial=5)
    rsnet.from_iterable([1, None, 3]).subscribe(recorder)
    assert recorder.items == [1]
    assert isinstance(recorder.errors[0], TypeError)


def test_rule_2_13_just_rejects_none():
    with pytest.raises(TypeError):
        rsnet.just(1, None)


def test_rule_1_4_an_iterator_that_raises_becomes_on_error():
    def numbers():
        yield 1
        raise KeyError("source failed")

    recorder = Recorder(initial=5)
    rsnet.from_iterable(numbers()).subscribe(recorder)
    assert recorder.items == [1]
    assert isinstance(recorder.errors[0], KeyError)


def test_rule_1_11_each_subscriber_gets_its_own_iteration():
    publisher = rsnet.from_iterable([1, 2, 3])
    first, second = Recorder(initial=10), Recorder(initial=2)
    publisher.subscribe(first)
    publisher.subscribe(second)
    assert first.items == [1, 2, 3]
    assert second.items == [1, 2]


def test_rule_2_13_a_subscriber_raising_from_on_next_is_cancelled_and_reported():
    reported = []
    previous = set_undeliverable_handler(reported.append)
    try:

        class Raising(Recorder):
            def on_next(self, item):
                super().on_next(item)
                raise RuntimeError("subscriber bug")

        recorder = Raising(initial=5)
        rsnet.range_(0, 10).subscribe(recorder)
    finally:
        set_undeliverable_handler(previous)
    assert recorder.items == [0]  # treated as cancelled after the violation
    assert [type(e) for e in reported] == [RuntimeError]


def test_error_factory_gives_each_subscriber_a_fresh_exception():
    publisher = rsnet.error(lambda: RuntimeError("fresh"))
    first, second = Recorder(), Recorder()
    publisher.subscribe(first)
    publisher.subscribe(second)
    assert first.errors[0] is not second.errors[0]


def test_defer_builds_a_publisher_per_subscriber_and_rejects_a_failing_factory():
    made = []

    def factory():
        made.append(1)
        return rsnet.just(len(made))

    publisher = rsnet.defer(factory)
    first, second = Recorder(initial=1), Recorder(initial=1)
    publisher.subscribe(first)
    publisher.subscribe(second)
    assert (first.items, second.items) == ([1], [2])

    failing = Recorder()
    rsnet.defer(lambda: 1 / 0).subscribe(failing)
    assert failing.signals == ["on_subscribe", "on_error"]


def test_range_rejects_negative_count():
    with pytest.raises(ValueError):
        rsnet.range_(0, -1)


class _Counted(rsnet.Subscription):
    def __init__(self) -> None:
        self.cancels = 0
        self.requests: list[int] = []

    def request(self, n: int) -> None:
        self.requests.append(n)

    def cancel(self) -> None:
        self.cancels += 1


def test_rule_2_5_validate_subscription_keeps_the_first_and_cancels_any_other():
    first, second = _Counted(), _Counted()
    assert validate_subscription(None, first)
    assert not validate_subscription(first, second)
    assert (first.cancels, second.cancels) == (0, 1) and not second.requests


def test_rule_2_5_validate_subscription_cancels_one_nobody_wants_any_more():
    late = _Counted()
    assert not validate_subscription(None, late, wanted=False)
    assert late.cancels == 1


def test_rule_2_13_validate_subscription_rejects_none():
    with pytest.raises(TypeError, match=r"2\.13"):
        validate_subscription(None, None)  # type: ignore[arg-type]  # None on purpose


@pytest.mark.parametrize(
    "stage",
    [
        lambda s: s.pipe(rsnet.ops.map(str)),
        lambda s: s.pipe(rsnet.ops.flat_map(rsnet.just)),
        lambda s: s.pipe(rsnet.ops.on_backpressure_buffer(4)),
        lambda s: rsnet.ops.concat(s),
    ],
    ids=["map", "flat_map", "on_backpressure_buffer", "concat"],
)
def test_rule_2_5_every_stage_cancels_a_second_subscription(stage):
    """Each stage's on_subscribe goes through validate_subscription: a second one is cancelled."""
    from .support import ManualPublisher

    source = ManualPublisher()
    recorder = Recorder(initial=1)
    stage(source).subscribe(recorder)
    inner = source.last.subscriber
    second = _Counted()
    inner.on_subscribe(second)
    assert second.cancels == 1 and not second.requests
    assert not source.last.cancelled
