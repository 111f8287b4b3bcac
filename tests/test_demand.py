"""The demand policies of an iterating subscriber (rsnet.client_rules), without sockets: a
simulated stream with a clock of its own drives them as the clients do (tests/sync/
test_both_clients.py checks the demand the real clients put on the wire)."""

from __future__ import annotations

import pytest

from rsnet.client_rules import (
    DEFAULT_BUDGET,
    INITIAL_WINDOW,
    MAX_WINDOW,
    MIN_WINDOW,
    AdaptiveDemand,
    Refill,
    demand_policy,
)
from rsnet.protocol import DEFAULT_MAX_FRAME_SIZE

MIB = 1024 * 1024


class Clock:
    """Simulated seconds: the policy reads it; only the simulation moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Stream:
    """A publisher as fast as its demand, ``rtt`` seconds away (a request's first item arrives
    one round trip after it, then a batch of up to ``batch`` items every ``per_batch`` seconds),
    items of ``item_bytes`` on the wire, and a consumer that spends ``per_item`` seconds on each.
    It drives the policy as both clients do: ``starved`` before every wait, ``received`` per
    batch, ``consumed`` per item, requesting what it returns; and it records what a user of
    the stream would see."""

    def __init__(
        self,
        policy: AdaptiveDemand | Refill,
        clock: Clock,
        *,
        rtt: float = 200e-6,
        per_item: float = 0.5e-6,
        item_bytes: int = 18,
        batch: int = 256,
        per_batch: float = 20e-6,
    ) -> None:
        self.policy, self.clock = policy, clock
        self.rtt, self.per_item, self.item_bytes = rtt, per_item, item_bytes
        self.batch, self.per_batch = batch, per_batch
        self.arrivals: list[tuple[float, int]] = []  # (time, items), in time order
        self.buffered = 0
        self.requested = 0
        self.consumed = 0
        self.waited = 0.0
        self.peak_outstanding = 0  # items requested and not yet consumed, at the most
        self.request(policy.initial)

    def request(self, n: int) -> None:
        if not n:
            return
        self.requested += n
        self.peak_outstanding = max(self.peak_outstanding, self.requested - self.consumed)
        start = max(self.clock.now + self.rtt, self.arrivals[-1][0] + self.per_batch if self.arrivals else 0.0)
        for k, first in enumerate(range(0, n, self.batch)):
            self.arrivals.append((start + k * self.per_batch, min(self.batch, n - first)))

    def deliver_due(self) -> None:
        while self.arrivals and self.arrivals[0][0] <= self.clock.now:
            _, count = self.arrivals.pop(0)
            self.buffered += count
            self.policy.received(count, count * self.item_bytes)

    def take(self, count: int) -> None:
        """The consumer takes ``count`` items."""
        for _ in range(count):
            self.deliver_due()
            if not self.buffered:
                assert self.arrivals, "the consumer waits for items nobody requested"
                self.policy.starved()
                self.waited += self.arrivals[0][0] - self.clock.now
                self.clock.now = self.arrivals[0][0]
                self.deliver_due()
            self.buffered -= 1
            self.consumed += 1
            self.clock.now += self.per_item
            self.request(self.policy.consumed())

    def rate(self, count: int) -> float:
        """Items per second over the next ``count`` items."""
        start = self.clock.now
        self.take(count)
        return count / (self.clock.now - start)


def adaptive(clock: Clock, **options) -> AdaptiveDemand:
    return AdaptiveDemand(clock, **options)


def test_the_first_request_assumes_the_largest_items_until_the_first_ones_arrive():
    clock = Clock()
    policy = adaptive(clock)
    assert policy.initial == DEFAULT_BUDGET // DEFAULT_MAX_FRAME_SIZE == 4
    assert adaptive(clock, max_item_bytes=16 * 1024).initial == INITIAL_WINDOW  # small frames: 256 fit
    stream = Stream(policy, clock)
    stream.take(1)  # the 4 small items arrived, the consumer waited for them: up to 2 x 256 now
    assert stream.requested == 2 * INITIAL_WINDOW + 1


def test_a_fast_consumer_grows_the_window_until_the_round_trip_no_longer_dominates():
    clock = Clock()
    stream = Stream(adaptive(clock), clock, rtt=200e-6, per_item=0.5e-6)
    stream.take(100_000)  # the ramp: a few milliseconds
    assert stream.rate(500_000) > 0.9 / stream.per_item  # within 10% of the consumer's own speed
    assert stream.policy.window > 4 * 200e-6 / 0.5e-6  # a quarter of it covers the round trip


def test_a_fixed_small_prefetch_is_bound_by_the_round_trip_for_comparison():
    clock = Clock()
    stream = Stream(Refill(256), clock, rtt=200e-6, per_item=0.5e-6)
    stream.take(10_000)
    assert stream.rate(100_000) < 0.6 / stream.per_item  # the 5x of issue 13, in the small


def test_small_items_stop_at_max_window():
    clock = Clock()
    stream = Stream(adaptive(clock), clock, rtt=50e-3, per_item=0.1e-6)  # a long round trip
    stream.take(300_000)
    assert stream.policy.window == MAX_WINDOW
    assert stream.peak_outstanding <= MAX_WINDOW


@pytest.mark.parametrize("item_bytes", [1024, 64 * 1024, MIB - 64])
def test_the_byte_budget_bounds_what_is_outstanding_whatever_the_item_size(item_bytes):
    clock = Clock()
    stream = Stream(adaptive(clock), clock, rtt=50e-3, per_item=1e-6, item_bytes=item_bytes, batch=16)
    stream.take(20_000 if item_bytes < MIB // 2 else 500)
    assert stream.peak_outstanding * item_bytes <= DEFAULT_BUDGET
    assert stream.policy.limit_window() == DEFAULT_BUDGET // item_bytes  # and it is used


def test_a_budget_smaller_than_one_item_still_moves_one_at_a_time():
    clock = Clock()
    stream = Stream(adaptive(clock, budget=1000), clock, item_bytes=5000, batch=1)
    stream.take(50)
    assert stream.consumed == 50 and stream.peak_outstanding == 1


def test_a_slow_consumer_shrinks_the_window():
    clock = Clock()
    stream = Stream(adaptive(clock), clock, rtt=200e-6, per_item=0.5e-6)
    stream.take(100_000)
    grown = stream.policy.window
    stream.per_item = 1e-3  # now it takes a millisecond per item: 8 x 1000/s x 200 us ~ 2 items
    stream.take(2 * grown)
    assert stream.policy.window <= 2 * MIN_WINDOW
    waited = stream.waited
    stream.take(1_000)
    assert stream.waited == waited  # and a small window is enough for it: it never waits


def test_a_consumer_that_speeds_up_again_regrows_the_window():
    clock = Clock()
    stream = Stream(adaptive(clock), clock, per_item=1e-3)
    stream.take(2_000)
    assert stream.policy.window <= 2 * MIN_WINDOW
    stream.per_item = 0.5e-6
    stream.take(100_000)
    assert stream.rate(300_000) > 0.9 / stream.per_item


def test_item_sizes_are_followed_up_at_once_and_down_gradually():
    clock = Clock()
    policy = adaptive(clock)
    policy.received(100, 100 * 20)
    assert policy.item_bytes == 20
    policy.received(1, 100_000)
    assert policy.item_bytes == 100_000
    policy.received(10, 10 * 20)
    assert 20 < policy.item_bytes < 100_000
    for _ in range(200):
        policy.received(10, 10 * 20)
    assert policy.item_bytes == pytest.approx(20, rel=0.01)
    policy.received(5, 0)  # unmeasured (an item delivered alone): no change
    assert policy.item_bytes == pytest.approx(20, rel=0.01)


def test_the_round_trip_is_measured_from_a_request_to_the_first_item_it_allowed():
    clock = Clock()
    policy = adaptive(clock, max_item_bytes=1024)  # 256 up front
    clock.now = 0.003
    policy.received(10, 100)
    assert policy.rtt == pytest.approx(0.003)  # the SUBSCRIBE's own round trip
    policy.received(182, 1820)

    def top_up() -> int:
        """Consume up to the next top-up; what it requests (and times)."""
        assert policy.consumed(policy.until_due() - 1) == 0
        return policy.consumed()

    assert top_up() > 0
    clock.now = 0.0035
    policy.received(64, 640)  # the rest of the first 256: not the sample
    clock.now = 0.004
    policy.received(1, 10)  # the first item of the top-up
    assert policy.rtt == pytest.approx(0.001)  # a smaller sample replaces the estimate
    assert top_up() > 0
    clock.now = 1.0
    policy.received(10**4, 10**5)  # a much slower one: the estimate rises by a quarter only
    assert policy.rtt == pytest.approx(0.001 * 1.25)


@pytest.mark.parametrize("limit", [0, 1, 3, 5, 1000, 100_000])
def test_a_limit_is_never_exceeded_and_is_reached(limit):
    clock = Clock()
    policy = adaptive(clock, limit=limit)
    stream = Stream(policy, clock)
    stream.take(limit)
    assert stream.requested == limit
    assert policy.consumed() == 0 and policy.until_due() > 10**18


def test_until_due_is_where_consumed_first_asks_for_more():
    clock = Clock()
    for policy in (Refill(100), adaptive(clock, max_item_bytes=1024)):
        due = policy.until_due()
        assert [policy.consumed() for _ in range(due - 1)] == [0] * (due - 1)
        assert policy.consumed() > 0


def test_demand_policy_chooses_by_prefetch():
    clock = Clock()
    assert isinstance(demand_policy(clock), AdaptiveDemand)
    fixed = demand_policy(clock, prefetch=64, limit=10)
    assert isinstance(fixed, Refill) and fixed.initial == 10
    assert demand_policy(clock, budget=10 * MIB).budget == 10 * MIB
    with pytest.raises(ValueError):
        demand_policy(clock, prefetch=64, budget=MIB)  # a fixed window is counted in items
    for bad in (0, -1, 1.5, "1"):
        with pytest.raises(ValueError):
            demand_policy(clock, budget=bad)  # type: ignore[arg-type]  # the point of the test
        with pytest.raises(ValueError):
            demand_policy(clock, prefetch=bad)  # type: ignore[arg-type]  # the point of the test
