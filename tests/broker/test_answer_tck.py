"""The TCK over the broker's one-item answer (``$commit``'s, once its write is done): one item
then completion, or an error, as demand and the answer allow (rules 1.1, 1.9, 3.9...)."""

from __future__ import annotations

from typing import Any

from rsnet.broker.broker import _Answer
from rsnet.streams import Publisher, empty
from rsnet.tck import PublisherVerification


class TestAnswer(PublisherVerification[Any]):
    max_elements_from_publisher = 1

    def create_publisher(self, elements: int) -> Publisher[Any]:
        if elements == 0:
            return empty()  # an answer always has its one item
        answer = _Answer({"cursor": "c", "offset": 1})
        answer.resolve()
        return answer

    def create_failed_publisher(self) -> Publisher[Any]:
        answer = _Answer({"cursor": "c", "offset": 1})
        answer.resolve(RuntimeError("the cursor file could not be written"))
        return answer
