"""Each operator's behaviour, demand handling and cancel propagation."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import rsnet
from rsnet import ops
from rsnet.streams import MAX_DEMAND
from rsnet.streams.operators import BufferOverflowError, StreamTimeoutError

from .support import ManualPublisher, Recorder


async def collect(publisher, prefetch=256):
    return [item async for item in rsnet.iterate(publisher, prefetch=prefetch)]


def run_with(operator, initial=0):
    """Subscribe a Recorder through ``operator`` to a fresh ManualPublisher."""
    source = ManualPublisher()
    recorder = Recorder(initial=initial)
    operator(source).subscribe(recorder)
    return source, recorder


# -- map / filter / distinct_until_changed --------------------------------------------------


async def test_map_filter_distinct():
    assert await collect(rsnet.range_(0, 6).pipe(ops.map(lambda x: x * 10))) == [0, 10, 20, 30, 40, 50]
    assert await collect(rsnet.range_(0, 10).pipe(ops.filter(lambda x: x % 3 == 0))) == [0, 3, 6, 9]
    assert await collect(rsnet.just(1, 1, 2, 2, 2, 1, 3).pipe(ops.distinct_until_changed())) == [1, 2, 1, 3]
    assert await collect(rsnet.just("a", "A", "b").pipe(ops.distinct_until_changed(key=str.lower))) == ["a", "b"]


def test_filter_replaces_each_dropped_item_with_one_request_upstream():
    source, recorder = run_with(ops.filter(lambda x: x > 0), initial=2)
    upstream = source.last
    upstream.emit(0, 5, 0, 0)
    assert recorder.items == [5]
    assert sum(upstream.requests) == 2 + 3  # rule 1.1 holds: 2 asked, 1 delivered, 1 still owed


def test_a_failing_user_function_cancels_upstream_and_signals_the_error():
    for operator in (
        ops.map(lambda x: 1 / 0),
        ops.filter(lambda x: 1 / 0),
        ops.take_while(lambda x: 1 / 0),
        ops.scan(lambda a, b: 1 / 0, seed=0),
        ops.distinct_until_changed(key=lambda x: 1 / 0),
    ):
        source, recorder = run_with(operator, initial=1)
        source.last.emit(1)
        assert source.last.cancelled
        assert [type(e) for e in recorder.errors] == [ZeroDivisionError]
        source.last.complete()  # a late terminal signal from upstream is not passed on
        assert recorder.completions == 0


def test_rule_2_13_map_returning_none_fails_the_stream():
    source, recorder = run_with(ops.map(lambda x: None), initial=1)
    source.last.emit(1)
    assert isinstance(recorder.errors[0], TypeError) and source.last.cancelled


def test_rule_3_13_cancel_through_an_operator_drops_the_downstream():
    source, recorder = run_with(ops.map(str), initial=1)
    recorder.cancel()
    assert source.last.cancelled
    source.last.emit(1)  # rule 2.8: a late item goes nowhere
    assert recorder.items == []


# -- take / skip / take_while / limit_rate --------------------------------------------------


def test_take_requests_no_more_than_it_needs_and_cancels_when_done():
    source, recorder = run_with(ops.take(3))
    recorder.request(MAX_DEMAND)
    upstream = source.last
    assert upstream.requests == [3]
    upstream.emit(1, 2, 3)
    assert recorder.items == [1, 2, 3] and recorder.completions == 1
    assert upstream.cancelled


def test_take_zero_completes_at_once_and_cancels_upstream():
    source, recorder = run_with(ops.take(0))
    assert recorder.signals == ["on_subscribe", "on_complete"]
    assert source.last.cancelled and source.last.requests == []


async def test_skip_take_while_limit_rate():
    assert await collect(rsnet.range_(0, 10).pipe(ops.skip(7))) == [7, 8, 9]
    assert await collect(rsnet.range_(0, 10).pipe(ops.take_while(lambda x: x < 4))) == [0, 1, 2, 3]
    assert await collect(rsnet.range_(0, 100).pipe(ops.limit_rate(8)), prefetch=1000) == list(range(100))


def test_limit_rate_caps_each_upstream_request():
    source, recorder = run_with(ops.limit_rate(8))
    recorder.request(MAX_DEMAND)
    upstream = source.last
    assert upstream.requests == [8]
    upstream.emit(*range(6))
    assert upstream.requests == [8, 6]  # topped up after 3/4 of the rate arrived
    assert upstream.outstanding == 8


def test_limit_rate_never_requests_beyond_downstream_demand():
    source, recorder = run_with(ops.limit_rate(100))
    recorder.request(5)
    assert source.last.requests == [5]


@pytest.mark.parametrize("operator", [ops.take(5), ops.limit_rate(4), ops.skip(2), ops.buffer(3)])
def test_rule_3_9_request_zero_through_demand_changing_operators(operator):
    recorder = Recorder()
    operator(rsnet.range_(0, 10)).subscribe(recorder)
    recorder.request(0)
    assert [type(e) for e in recorder.errors] == [ValueError]


# -- scan / reduce / buffer ----------------------------------------------------------------


async def test_scan_reduce_buffer():
    assert await collect(rsnet.range_(1, 4).pipe(ops.scan(lambda a, b: a + b))) == [1, 3, 6, 10]
    assert await collect(rsnet.range_(1, 4).pipe(ops.scan(lambda a, b: a * b, seed=10))) == [10, 20, 60, 240]
    assert await collect(rsnet.range_(1, 4).pipe(ops.reduce(lambda a, b: a + b))) == [10]
    assert await collect(rsnet.empty().pipe(ops.reduce(lambda a, b: a + b))) == []
    assert await collect(rsnet.empty().pipe(ops.reduce(lambda a, b: a + b, seed=0))) == [0]
    assert await collect(rsnet.range_(0, 7).pipe(ops.buffer(3))) == [[0, 1, 2], [3, 4, 5], [6]]


def test_reduce_waits_for_downstream_demand_before_emitting():
    source, recorder = run_with(ops.reduce(lambda a, b: a + b))
    source.last.emit(1, 2, 3)
    source.last.complete()
    assert recorder.signals == ["on_subscribe"]  # rule 1.1: nothing before a request
    recorder.request(1)
    assert recorder.items == [6] and recorder.completions == 1


def test_buffer_asks_count_times_the_demand():
    source, recorder = run_with(ops.buffer(4))
    recorder.request(2)
    assert source.last.requests == [8]
    recorder.request(MAX_DEMAND)
    assert source.last.outstanding == MAX_DEMAND


# -- concat / merge / flat_map / zip -------------------------------------------------------


async def test_concat_merge_zip_flat_map():
    assert await collect(ops.concat(rsnet.just(1, 2), rsnet.empty(), rsnet.just(3))) == [1, 2, 3]
    assert sorted(await collect(ops.merge(rsnet.just(1, 2), rsnet.just(3)))) == [1, 2, 3]
    assert await collect(ops.zip(rsnet.just(1, 2, 3), rsnet.just("a", "b"))) == [(1, "a"), (2, "b")]
    assert await collect(ops.zip(rsnet.range_(0, 3), rsnet.range_(10, 3), combine=lambda a, b: a + b)) == [10, 12, 14]
    assert await collect(rsnet.range_(0, 3).pipe(ops.flat_map(lambda i: rsnet.just(i, i), max_concurrency=1))) == [
        0,
        0,
        1,
        1,
        2,
        2,
    ]


def test_concat_carries_unmet_demand_over_to_the_next_source():
    first, second = ManualPublisher(), ManualPublisher()
    recorder = Recorder(initial=5)
    ops.concat(first, second).subscribe(recorder)
    first.last.emit(1, 2)
    first.last.complete()
    assert second.last.requests == [3]  # deferred requesting: 5 asked, 2 delivered
    second.last.emit(3, 4, 5)
    second.last.complete()
    assert recorder.items == [1, 2, 3, 4, 5] and recorder.completions == 1


def test_concat_of_many_synchronous_sources_does_not_grow_the_stack():
    recorder = Recorder(initial=MAX_DEMAND)
    ops.concat(*[rsnet.just(i) for i in range(5000)]).subscribe(recorder)
    assert len(recorder.items) == 5000 and recorder.completions == 1


def test_concat_cancel_reaches_the_active_source():
    first = ManualPublisher()
    recorder = Recorder(initial=1)
    ops.concat(first, rsnet.just(2)).subscribe(recorder)
    recorder.cancel()
    assert first.last.cancelled


def test_flat_map_respects_max_concurrency_and_downstream_demand():
    inners = [ManualPublisher() for _ in range(4)]
    source, recorder = run_with(ops.flat_map(lambda i: inners[i], max_concurrency=2, prefetch=4))
    outer = source.last
    assert outer.requests == [2]
    outer.emit(0, 1)
    assert [len(p.subscriptions) for p in inners] == [1, 1, 0, 0]
    inners[0].last.emit("a0", "a1")
    inners[1].last.emit("b0")
    assert recorder.items == []  # rule 1.1: no downstream demand yet, items wait in the queues
    recorder.request(2)
    assert len(recorder.items) == 2
    inners[0].last.complete()
    recorder.request(10)
    assert sorted(recorder.items) == ["a0", "a1", "b0"]
    assert outer.requests == [2, 1]  # a finished inner frees a slot for one more


def test_flat_map_error_in_one_inner_cancels_the_others_and_the_outer():
    inners = [ManualPublisher(), ManualPublisher()]
    source, recorder = run_with(ops.flat_map(lambda i: inners[i]), initial=10)
    source.last.emit(0, 1)
    inners[0].last.fail(OSError("inner failed"))
    assert [type(e) for e in recorder.errors] == [OSError]
    assert source.last.cancelled and inners[1].last.cancelled


def test_flat_map_round_robin_does_not_starve_a_slow_inner():
    fast, slow = ManualPublisher(), ManualPublisher()
    source, recorder = run_with(ops.flat_map(lambda p: p, prefetch=8))
    source.last.emit(fast, slow)
    fast.last.emit(*range(8))
    slow.last.emit("s")
    recorder.request(2)
    assert "s" in recorder.items


def test_zip_completes_when_one_source_is_exhausted_and_cancels_the_rest():
    long_source = ManualPublisher()
    recorder = Recorder(initial=10)
    ops.zip(rsnet.just(1), long_source).subscribe(recorder)
    long_source.last.emit("x")
    assert recorder.items == [(1, "x")] and recorder.completions == 1
    assert long_source.last.cancelled


def test_zip_emits_only_under_demand():
    a, b = ManualPublisher(), ManualPublisher()
    recorder = Recorder()
    ops.zip(a, b).subscribe(recorder)
    a.last.emit(1, 2)
    b.last.emit(3, 4)
    assert recorder.items == []
    recorder.request(1)
    assert recorder.items == [(1, 3)]


# -- backpressure strategies ----------------------------------------------------------------


def test_on_backpressure_buffer_policies():
    def run(overflow):
        dropped = []
        source, recorder = run_with(ops.on_backpressure_buffer(2, overflow, on_drop=dropped.append))
        assert source.last.requests == [MAX_DEMAND]
        source.last.emit(1, 2, 3)
        recorder.request(10)
        return recorder, dropped

    recorder, dropped = run("drop_oldest")
    assert recorder.items == [2, 3] and dropped == [1]
    recorder, dropped = run("drop_latest")
    assert recorder.items == [1, 2] and dropped == [3]
    recorder, dropped = run("error")
    assert recorder.items == [] and [type(e) for e in recorder.errors] == [BufferOverflowError]


def test_on_backpressure_buffer_delivers_buffered_items_before_completion():
    source, recorder = run_with(ops.on_backpressure_buffer(10))
    source.last.emit(1, 2, 3)
    source.last.complete()
    assert recorder.completions == 0
    recorder.request(2)
    assert recorder.items == [1, 2] and recorder.completions == 0
    recorder.request(1)
    assert recorder.items == [1, 2, 3] and recorder.completions == 1


def test_on_backpressure_drop_and_latest():
    source, recorder = run_with(ops.on_backpressure_drop())
    source.last.emit(1)
    recorder.request(1)
    source.last.emit(2, 3)
    assert recorder.items == [2]

    source, recorder = run_with(ops.on_backpressure_latest())
    source.last.emit(1, 2, 3)
    recorder.request(1)
    assert recorder.items == [3]


# -- timeout / retry --------------------------------------------------------------------------


async def test_timeout_fires_when_the_gap_is_too_long(autojump_clock):
    async def slow():
        yield 1
        await trio.sleep(5)
        yield 2

    async with trio.open_nursery() as nursery:
        publisher = rsnet.from_async_iterable(slow, nursery=nursery).pipe(ops.timeout(1.0, nursery=nursery))
        seen = []
        with pytest.raises(StreamTimeoutError):
            async for item in rsnet.iterate(publisher):
                seen.append(item)
    assert seen == [1]


async def test_timeout_does_not_fire_while_items_keep_coming(autojump_clock):
    async def steady():
        for i in range(20):
            await trio.sleep(0.5)
            yield i

    async with trio.open_nursery() as nursery:
        publisher = rsnet.from_async_iterable(steady, nursery=nursery).pipe(ops.timeout(1.0, nursery=nursery))
        assert await collect(publisher) == list(range(20))


def test_retry_resubscribes_and_gives_up_after_the_limit():
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            return ops.concat(rsnet.just(len(attempts)), rsnet.error(OSError("flaky")))
        return rsnet.just("ok")

    recorder = Recorder(initial=10)
    rsnet.defer(flaky).pipe(ops.retry(5)).subscribe(recorder)
    assert recorder.items == [1, 2, "ok"] and recorder.completions == 1

    recorder = Recorder(initial=10)
    rsnet.error(lambda: OSError("always")).pipe(ops.retry(1000)).subscribe(recorder)
    assert [type(e) for e in recorder.errors] == [OSError]  # 1000 synchronous retries, no recursion


def test_retry_should_retry_can_veto():
    recorder = Recorder(initial=1)
    rsnet.error(KeyError("fatal")).pipe(ops.retry(should_retry=lambda e: not isinstance(e, KeyError))).subscribe(
        recorder
    )
    assert [type(e) for e in recorder.errors] == [KeyError]


def test_retry_carries_unmet_demand_to_the_new_subscription():
    source = ManualPublisher()
    recorder = Recorder(initial=5)
    source.pipe(ops.retry(1)).subscribe(recorder)
    source.last.emit(1, 2)
    source.last.fail(OSError())
    assert source.last.requests == [3]


@pytest.mark.parametrize(
    "make",
    [
        lambda: ops.map(str),
        lambda: ops.take(10),
        lambda: ops.buffer(2),
        lambda: ops.flat_map(lambda p: p),
        lambda: ops.on_backpressure_buffer(8),
        lambda: ops.limit_rate(2),
        lambda: ops.retry(3),
    ],
)
def test_rule_2_5_a_second_on_subscribe_is_cancelled(make):
    source, _recorder = run_with(make(), initial=1)
    stage_subscriber = source.subscribers[-1]
    intruder = ManualPublisher()
    intruder.subscribe(stage_subscriber)
    assert intruder.last.cancelled and intruder.last.requests == []


# -- MulticastProcessor ---------------------------------------------------------------------


def test_multicast_processor_is_paced_by_the_slowest_subscriber():
    processor = rsnet.MulticastProcessor(buffer_size=4)
    source = ManualPublisher()
    source.subscribe(processor)
    fast, slow = Recorder(initial=10), Recorder(initial=1)
    processor.subscribe(fast)
    processor.subscribe(slow)
    assert source.last.requests == [4]
    source.last.emit(1, 2, 3, 4)
    assert fast.items == [1] and slow.items == [1]  # lockstep: item 2 waits for the slow one
    slow.request(10)
    assert fast.items == slow.items == [1, 2, 3, 4]
    assert source.last.requests == [4, 3]  # replenished as items left the buffer


def test_multicast_processor_error_reaches_everyone_without_demand():
    processor = rsnet.MulticastProcessor()
    source = ManualPublisher()
    source.subscribe(processor)
    first, second = Recorder(), Recorder()
    processor.subscribe(first)
    processor.subscribe(second)
    source.last.fail(OSError("upstream died"))
    assert [type(e) for e in first.errors + second.errors] == [OSError, OSError]
    late = Recorder()
    processor.subscribe(late)
    assert late.signals == ["on_subscribe", "on_error"]


def test_multicast_processor_cancelled_subscriber_no_longer_holds_back_the_rest():
    processor = rsnet.MulticastProcessor(buffer_size=8)
    source = ManualPublisher()
    source.subscribe(processor)
    stuck, active = Recorder(), Recorder(initial=10)
    processor.subscribe(stuck)
    processor.subscribe(active)
    source.last.emit(1, 2)
    assert active.items == []
    stuck.cancel()
    assert active.items == [1, 2]


def test_multicast_processor_rule_3_9_only_fails_the_offending_subscriber():
    processor = rsnet.MulticastProcessor()
    source = ManualPublisher()
    source.subscribe(processor)
    bad, good = Recorder(), Recorder(initial=5)
    processor.subscribe(bad)
    processor.subscribe(good)
    bad.request(0)
    source.last.emit(1)
    source.last.complete()
    assert [type(e) for e in bad.errors] == [ValueError]
    assert good.items == [1] and good.completions == 1


def test_multicast_processor_cancels_upstream_when_the_last_subscriber_leaves():
    processor = rsnet.MulticastProcessor()
    source = ManualPublisher()
    source.subscribe(processor)
    first, second = Recorder(initial=1), Recorder(initial=1)
    processor.subscribe(first)
    processor.subscribe(second)
    first.cancel()
    assert not source.last.cancelled
    second.cancel()
    assert source.last.cancelled  # cancel travels back to the source
    late = Recorder()
    processor.subscribe(late)
    assert [type(e) for e in late.errors] == [rsnet.ProcessorCancelledError]
