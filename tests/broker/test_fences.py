"""The fences a failure leaves on its producers (rsnet/broker/fences.py) are bounded."""

from __future__ import annotations

from rsnet.broker.fences import Fences


def test_fences_keep_the_newest_up_to_their_bound_and_go_with_their_topic():
    fences = Fences(limit=3)
    fences.fence("t", {"a": 10, "b": 20})
    fences.fence("u", {"a": 0})
    fences.fence("t", {"a": 15})  # fenced again: the newest now, from the lower sequence
    fences.fence("u", {"c": 5})  # one too many: the oldest, (t, b), is forgotten
    assert len(fences) == 3
    keys = (("t", "a"), ("t", "b"), ("u", "a"), ("u", "c"))
    assert [fences.resume(*key) for key in keys] == [10, None, 0, 5]
    fences.lift("u", "a")
    fences.forget_topic("t")
    assert [fences.resume(*key) for key in keys] == [None, None, None, 5]
