"""Test doubles for the streams core: a recording subscriber and a hand-driven publisher."""

from __future__ import annotations

from typing import Any

from rsnet.streams import Publisher, Subscriber, Subscription
from rsnet.streams.rules import add_demand


class Recorder(Subscriber[Any]):
    """Records every signal; requests ``initial`` in on_subscribe (0: none)."""

    def __init__(self, initial: int = 0) -> None:
        self.initial = initial
        self.subscription: Subscription | None = None
        self.items: list[Any] = []
        self.errors: list[BaseException] = []
        self.completions = 0
        self.signals: list[str] = []

    def on_subscribe(self, subscription: Subscription) -> None:
        self.signals.append("on_subscribe")
        self.subscription = subscription
        if self.initial:
            subscription.request(self.initial)

    def on_next(self, item: Any) -> None:
        self.signals.append("on_next")
        self.items.append(item)

    def on_error(self, error: BaseException) -> None:
        self.signals.append("on_error")
        self.errors.append(error)

    def on_complete(self) -> None:
        self.signals.append("on_complete")
        self.completions += 1

    def request(self, n: int) -> None:
        self.subscription.request(n)  # type: ignore[union-attr]

    def cancel(self) -> None:
        self.subscription.cancel()  # type: ignore[union-attr]

    @property
    def terminated(self) -> bool:
        return bool(self.errors) or self.completions > 0


class ManualPublisher(Publisher[Any]):
    """A publisher driven by the test: it records demand and cancels, and checks rule 1.1."""

    def __init__(self) -> None:
        self.subscribers: list[Subscriber[Any]] = []
        self.subscriptions: list[ManualSubscription] = []

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        subscription = ManualSubscription(subscriber)
        self.subscribers.append(subscriber)
        self.subscriptions.append(subscription)
        subscriber.on_subscribe(subscription)

    @property
    def last(self) -> ManualSubscription:
        return self.subscriptions[-1]


class ManualSubscription(Subscription):
    def __init__(self, subscriber: Subscriber[Any]) -> None:
        self.subscriber = subscriber
        self.requests: list[int] = []
        self.outstanding = 0
        self.cancelled = False

    def request(self, n: int) -> None:
        self.requests.append(n)
        if n > 0:
            self.outstanding = add_demand(self.outstanding, n)

    def cancel(self) -> None:
        self.cancelled = True

    def emit(self, *items: Any) -> None:
        for item in items:
            assert self.outstanding > 0, "test bug: emitting beyond demand (rule 1.1)"
            self.outstanding -= 1
            self.subscriber.on_next(item)

    def complete(self) -> None:
        self.subscriber.on_complete()

    def fail(self, error: BaseException) -> None:
        self.subscriber.on_error(error)
