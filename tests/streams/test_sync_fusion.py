"""Synchronous fusion: ``poll_sync(n)`` on an iterable source's subscription hands over the
same items, in the same order, with the same end, as ``request(n)`` signals (rules 1.1, 1.4,
1.5, 1.6, 2.13, 3.13); the network session takes a stream's first window this way."""

from __future__ import annotations

import gc
import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import rsnet
from rsnet.streams import Subscriber, Subscription

from .support import Recorder


class Polling(Subscriber[Any]):
    """Takes items by ``poll_sync`` alone, as the network session does."""

    def __init__(self) -> None:
        self.subscription: Any = None

    def on_subscribe(self, subscription: Subscription) -> None:
        self.subscription = subscription

    def on_next(self, item: Any) -> None:
        raise AssertionError("a polled source signals no item")

    def on_error(self, error: BaseException) -> None:
        raise AssertionError("a polled source signals no end")

    def on_complete(self) -> None:
        raise AssertionError("a polled source signals no end")


def _failing_after(count: int) -> Callable[[], Iterator[int]]:
    def numbers() -> Iterator[int]:
        yield from range(count)
        raise KeyError("source failed")

    return numbers


def _none_then_failing() -> Iterator[Any]:
    yield from [0, None]
    raise KeyError("source failed")


SOURCES: dict[str, Callable[[], Any]] = {
    "three": lambda: [0, 1, 2],
    "four": lambda: range(4),
    "endless": lambda: itertools.count(),
    "fails after 2": _failing_after(2),
    "fails after 4": _failing_after(4),
    "None third": lambda: [0, 1, None, 3],
    "None fifth": lambda: [0, 1, 2, 3, None],
    "None, then fails": _none_then_failing,
}


def _signalled(source: Callable[[], Any], n: int, rounds: int) -> tuple[list[Any], str]:
    recorder = Recorder()
    rsnet.from_iterable(source()).subscribe(recorder)
    for _ in range(rounds):
        if recorder.terminated:
            break
        recorder.request(n)
    end = (
        "open" if not recorder.terminated else "complete" if recorder.completions else type(recorder.errors[0]).__name__
    )
    return recorder.items, end


def _polled(source: Callable[[], Any], n: int, rounds: int) -> tuple[list[Any], str]:
    polling = Polling()
    rsnet.from_iterable(source()).subscribe(polling)
    items: list[Any] = []
    end: Any = False
    for _ in range(rounds):
        taken, end = polling.subscription.poll_sync(n)
        assert len(taken) <= n  # rule 1.1
        assert end is not False or len(taken) == n
        items += taken
        if end is not False:
            break
    return items, "open" if end is False else "complete" if end is True else type(end).__name__


@pytest.mark.parametrize("name", SOURCES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_polling_takes_what_requesting_signals(name, n):
    """Rules 1.1, 1.4, 1.5 and 2.13 alike: the items, and an end as soon as the look-ahead
    finds one (a completion needs no further demand)."""
    for rounds in (1, 2, 3):
        assert _polled(SOURCES[name], n, rounds) == _signalled(SOURCES[name], n, rounds)


def test_a_polled_end_is_final_and_lets_go_of_the_subscriber():
    """Rules 1.6 and 3.13: after the end, nothing more is polled and nothing is held."""
    polling = Polling()
    rsnet.from_iterable([1, 2]).subscribe(polling)
    subscription = polling.subscription
    assert subscription.poll_sync(5) == ([1, 2], True)
    assert subscription.poll_sync(5) == ([], False)
    subscription.request(1)  # rule 3.6: a no-op, and still no signal
    reference = weakref.ref(polling)
    del polling
    gc.collect()
    assert reference() is None


def test_requesting_after_polling_goes_on_in_order():
    recorder = Recorder()
    rsnet.range_(0, 5).subscribe(recorder)
    assert recorder.subscription.poll_sync(2) == ([0, 1], False)  # type: ignore[union-attr]
    recorder.request(10)
    assert recorder.items == [2, 3, 4]
    assert recorder.completions == 1


def test_inside_its_own_drain_loop_it_cannot_be_polled():
    """From an ``on_next`` the drain loop is running (rule 3.3): the poll takes nothing, and
    the request that follows is the loop's."""
    polled = []

    class PollingFromOnNext(Recorder):
        def on_next(self, item):
            super().on_next(item)
            if item == 0:
                polled.append(self.subscription.poll_sync(3))
                self.request(3)

    recorder = PollingFromOnNext(initial=1)
    rsnet.range_(0, 10).subscribe(recorder)
    assert polled == [([], False)]
    assert recorder.items == [0, 1, 2, 3]


def test_items_are_never_compared_only_checked_for_none():
    """Rule 2.13 is checked by identity: items whose ``==`` raises (a numpy array's does) pass."""

    class Incomparable:
        def __eq__(self, other):
            raise ValueError("the truth value is ambiguous")

        __hash__ = object.__hash__

    first, second = Incomparable(), Incomparable()
    polling = Polling()
    rsnet.from_iterable([first, second, None]).subscribe(polling)
    items, end = polling.subscription.poll_sync(5)
    assert len(items) == 2 and items[0] is first and items[1] is second
    assert isinstance(end, TypeError)
