"""The fences a failure leaves on its producers (rsnet/broker/fences.py) are bounded."""

from __future__ import annotations

from rsnet.broker.fences import Fences


def test_fences_keep_the_newest_up_to_their_bound_and_go_with_their_topic():
    fences = Fences(limit=3)
    fences.fence("t", ["a", "b"])
    fences.fence("u", ["a"])
    fences.fence("t", ["a"])  # fenced again: the newest now
    fences.fence("u", ["c"])  # one too many: the oldest, (t, b), is forgotten
    assert len(fences) == 3
    assert [fences.holds(*key) for key in (("t", "a"), ("t", "b"), ("u", "a"), ("u", "c"))] == [True, False, True, True]
    fences.lift("u", "a")
    fences.forget_topic("t")
    assert [fences.holds(*key) for key in (("t", "a"), ("u", "a"), ("u", "c"))] == [False, False, True]
