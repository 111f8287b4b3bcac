"""timeout: fail the stream when the gap before the next signal grows too long.

Each subscription has one watchdog task in the nursery given to the operator. The deadline
moves on with every item, which costs a clock read per item and no await; the watchdog wakes
at the old deadline, sees it moved, and sleeps again. The task ends with the subscription
(terminal signal or cancel), so it never outlives what it watches.
"""

from __future__ import annotations

from typing import Any

import trio

from ..interfaces import Subscriber, Subscription
from ..rules import validate_subscription
from ..subscriptions import ForwardingSubscriber
from ._base import Operator, stage


class StreamTimeoutError(TimeoutError):
    """No item or terminal signal arrived within the timeout."""


class _TimeoutSubscriber(ForwardingSubscriber):
    __slots__ = ("_deadline", "_nursery", "_scope", "_seconds")

    def __init__(self, downstream: Subscriber[Any], seconds: float, nursery: trio.Nursery) -> None:
        super().__init__(downstream)
        self._seconds = seconds
        self._nursery = nursery
        self._scope = trio.CancelScope()
        self._deadline = 0.0

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self.upstream, subscription):
            return  # one watchdog per subscription: a second on_subscribe starts none
        self._deadline = trio.current_time() + self._seconds
        super().on_subscribe(subscription)
        if self.done:
            return
        try:
            self._nursery.start_soon(self._watch)
        except RuntimeError as error:  # the nursery is closed to new tasks
            self.fail(error)

    def on_next(self, item: Any) -> None:
        self._deadline = trio.current_time() + self._seconds
        super().on_next(item)

    def on_error(self, error: BaseException) -> None:
        self._scope.cancel()
        super().on_error(error)

    def on_complete(self) -> None:
        self._scope.cancel()
        super().on_complete()

    def cancel(self) -> None:
        self._scope.cancel()
        super().cancel()

    async def _watch(self) -> None:
        with self._scope:
            while True:
                deadline = self._deadline
                await trio.sleep_until(deadline)
                if self._deadline == deadline and not self.done:
                    self.fail(StreamTimeoutError(f"no signal within {self._seconds} s"))
                    return


def timeout(seconds: float, *, nursery: trio.Nursery) -> Operator:
    """Signal :class:`StreamTimeoutError` (and cancel upstream) if ``seconds`` pass after
    subscribing or after an item without a further item or terminal signal.

    The watchdog task of each subscription runs in ``nursery``.
    """
    if seconds <= 0:
        raise ValueError(f"timeout() needs seconds > 0, got {seconds}")
    return stage(lambda downstream: _TimeoutSubscriber(downstream, seconds, nursery))
