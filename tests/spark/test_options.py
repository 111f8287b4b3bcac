"""Option parsing (rsnet.spark.options), without a Spark session: what a typo is told."""

from __future__ import annotations

import pytest

from rsnet.spark import options

URL = "tcp://127.0.0.1:1"


def test_a_misspelt_option_is_named_with_the_documented_name_it_is_closest_to():
    # Spark hands option names over lowercased: the Spark user check saw "startingoffset"
    # refused with no hint of the camelCase name the docs use.
    with pytest.raises(
        ValueError, match=r"unknown option\(s\) startingoffset \(did you mean startingOffsets\?\); known:"
    ):
        options.parse({"url": URL, "topic": "t", "startingoffset": "earliest"})
    with pytest.raises(ValueError, match=r"unknown option\(s\) qqq; known: cursor"):
        options.parse({"url": URL, "topic": "t", "qqq": "1"})


@pytest.mark.parametrize("topics", ["o.t,", "a,,b", " , a", '["a", ""]'])
def test_a_topic_list_with_an_empty_name_is_refused(topics):
    # It was accepted, the empty name dropped: a name left out by mistake went unnoticed.
    with pytest.raises(ValueError, match="has an empty name"):
        options.parse({"url": URL, "topic": topics})
    assert options.parse({"url": URL, "topic": " a , b "}).topics == ("a", "b")
