"""An error or a completion needs no demand (rules 1.4, 1.5, 1.9; the TCK's createFailedPublisher).

Every publisher below has no items left to deliver before its terminal signal, so a subscriber
that never calls ``request`` must still see ``on_subscribe`` and then exactly one terminal
signal. The sources and every operator that switches or combines sources are covered: a
terminal signal held back until demand arrives would hang a remote subscriber that waits for
the error before requesting (issue 10, finding 8).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

import rsnet
from rsnet import ops
from rsnet.streams import Publisher
from rsnet.streams.operators import StreamTimeoutError

from .support import ManualPublisher, Recorder


class Boom(Exception):
    pass


def failing() -> Publisher[Any]:
    return rsnet.error(Boom("failed"))


def raising_iterable() -> Any:
    raise Boom("failed")
    yield  # a generator that fails on its first step


FAILS: dict[str, Callable[[], Publisher[Any]]] = {
    "error": failing,
    "from_iterable, raising on the first item": lambda: rsnet.from_iterable(raising_iterable()),
    "from_iterable, None as the first item": lambda: rsnet.from_iterable([None]),
    "concat(range_(0, 0), error)": lambda: ops.concat(rsnet.range_(0, 0), failing()),
    "concat(empty, from_iterable([]), error)": lambda: ops.concat(rsnet.empty(), rsnet.from_iterable([]), failing()),
    "retry(0) of error": lambda: ops.retry(0)(failing()),
    "retry(3) of error": lambda: ops.retry(3)(failing()),
    "merge(range_(0, 0), error)": lambda: ops.merge(rsnet.range_(0, 0), failing()),
    "flat_map to error": lambda: rsnet.just(1).pipe(ops.flat_map(lambda _: failing())),
    "flat_map of error": lambda: failing().pipe(ops.flat_map(lambda _: rsnet.just(1))),
    "zip(range_(0, 3), error)": lambda: ops.zip(rsnet.range_(0, 3), failing()),
    "map of concat(empty, error)": lambda: ops.concat(rsnet.empty(), failing()).pipe(ops.map(str)),
    "filter, take, limit_rate of error": lambda: failing().pipe(ops.filter(bool), ops.take(5), ops.limit_rate(2)),
    "scan, reduce, buffer of error": lambda: failing().pipe(ops.scan(max), ops.reduce(max), ops.buffer(2)),
    "on_backpressure_buffer of error": lambda: failing().pipe(ops.on_backpressure_buffer(4)),
    "on_backpressure_drop of error": lambda: failing().pipe(ops.on_backpressure_drop()),
    "on_backpressure_latest of error": lambda: failing().pipe(ops.on_backpressure_latest()),
}
COMPLETES: dict[str, Callable[[], Publisher[Any]]] = {
    "empty": rsnet.empty,
    "range_(0, 0)": lambda: rsnet.range_(0, 0),
    "from_iterable(iter([]))": lambda: rsnet.from_iterable(iter([])),
    "concat(range_(0, 0), empty)": lambda: ops.concat(rsnet.range_(0, 0), rsnet.empty()),
    "concat()": lambda: ops.concat(),
    "merge(range_(0, 0), empty)": lambda: ops.merge(rsnet.range_(0, 0), rsnet.empty()),
    "flat_map over range_(0, 0)": lambda: rsnet.range_(0, 0).pipe(ops.flat_map(lambda _: rsnet.just(1))),
    "flat_map to empty": lambda: rsnet.range_(0, 3).pipe(ops.flat_map(lambda _: rsnet.empty())),
    "zip(range_(0, 0), range_(0, 3))": lambda: ops.zip(rsnet.range_(0, 0), rsnet.range_(0, 3)),
    "take(0)": lambda: rsnet.range_(0, 3).pipe(ops.take(0)),
    "buffer, scan of range_(0, 0)": lambda: rsnet.range_(0, 0).pipe(ops.buffer(2), ops.scan(max)),
}


@pytest.mark.parametrize("make", FAILS.values(), ids=FAILS.keys())
def test_an_error_is_signalled_without_any_request(make: Callable[[], Publisher[Any]]) -> None:
    recorder = Recorder(initial=0)
    make().subscribe(recorder)
    assert recorder.signals == ["on_subscribe", "on_error"]
    assert isinstance(recorder.errors[0], (Boom, TypeError))


@pytest.mark.parametrize("make", COMPLETES.values(), ids=COMPLETES.keys())
def test_a_completion_is_signalled_without_any_request(make: Callable[[], Publisher[Any]]) -> None:
    recorder = Recorder(initial=0)
    make().subscribe(recorder)
    assert recorder.signals == ["on_subscribe", "on_complete"]


def test_a_source_that_fails_later_fails_without_any_request_once_it_has_nothing_left() -> None:
    """concat switches to the failing source as soon as the first completes, demand or not."""
    first = ManualPublisher()
    recorder = Recorder(initial=0)
    ops.concat(first, failing()).subscribe(recorder)
    assert recorder.signals == ["on_subscribe"]
    first.last.subscriber.on_complete()
    assert recorder.signals == ["on_subscribe", "on_error"]


def test_items_before_the_error_still_wait_for_demand() -> None:
    """The other side of the rule: an error never overtakes items a source still holds (rule 1.1 holds)."""
    recorder = Recorder(initial=0)
    ops.concat(rsnet.just(1), failing()).subscribe(recorder)
    assert recorder.signals == ["on_subscribe"]
    recorder.request(1)
    assert recorder.signals == ["on_subscribe", "on_next", "on_error"]


async def test_timeout_fires_without_any_request(autojump_clock: Any) -> None:
    source = ManualPublisher()
    recorder = Recorder(initial=0)
    async with trio.open_nursery() as nursery:
        source.pipe(ops.timeout(1.0, nursery=nursery)).subscribe(recorder)
        await trio.sleep(2)
    assert recorder.signals == ["on_subscribe", "on_error"]
    assert isinstance(recorder.errors[0], StreamTimeoutError)
