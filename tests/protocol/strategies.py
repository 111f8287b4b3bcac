"""Hypothesis strategies for msgpack values and every v1 frame type."""

from __future__ import annotations

from hypothesis import strategies as st

from rsnet.protocol import (
    MAX_INT,
    MIN_MAX_FRAME_SIZE,
    Accept,
    Batch,
    Cancel,
    Complete,
    ConnError,
    Error,
    GoAway,
    Hello,
    Next,
    Offer,
    Ping,
    Pong,
    Request,
    Subscribe,
    Welcome,
)

# Every msgpack value a payload may hold. Floats exclude NaN only because NaN != NaN; keys are
# strings because the spec allows only string and binary keys, and JSON-shaped data uses strings.
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
items = values.filter(lambda v: v is not None)
uints = st.integers(0, MAX_INT)
stream_ids = st.integers(1, MAX_INT)
metadata = st.dictionaries(st.text(max_size=10), values, max_size=3)
settings = st.fixed_dictionaries(
    {},
    optional={
        "max_frame_size": st.integers(MIN_MAX_FRAME_SIZE, 2**31 - 1),
        "max_streams": st.integers(0, 2**31 - 1),
        "keepalive_interval": st.integers(0, 2**31 - 1),
        "auth_token": st.text(max_size=10) | st.binary(max_size=10),
        "metadata": metadata,
    },
)

frames = st.one_of(
    st.builds(Hello, st.just("rsnet"), st.lists(st.integers(1, MAX_INT), min_size=1, max_size=16), settings),
    st.builds(Welcome, st.integers(1, MAX_INT), settings),
    st.builds(Ping, uints),
    st.builds(Pong, uints),
    st.builds(GoAway, st.text(max_size=20)),
    st.builds(ConnError, uints, st.text(max_size=20), values),
    st.builds(Subscribe, stream_ids, st.text(max_size=20), values, uints, metadata),
    st.builds(Offer, stream_ids, st.text(max_size=20), values, metadata),
    st.builds(Accept, stream_ids, metadata),
    st.builds(Request, stream_ids, st.integers(-(2**63), MAX_INT)),
    st.builds(Cancel, stream_ids),
    st.builds(Next, stream_ids, items),
    st.builds(Batch, stream_ids, st.lists(items, max_size=5)),
    st.builds(Complete, stream_ids),
    st.builds(Error, stream_ids, uints, st.text(max_size=20), values),
)
