"""The operators, each a function returning ``Publisher -> Publisher`` for ``Publisher.pipe``.

Every operator respects demand (it never emits more than was requested downstream, rule 1.1)
and cancel (cancelling downstream cancels every upstream it holds, rule 3.12).
"""

from .aggregating import buffer, reduce, scan
from .backpressure import (
    BufferOverflowError,
    on_backpressure_buffer,
    on_backpressure_drop,
    on_backpressure_latest,
)
from .elementwise import distinct_until_changed, filter, map
from .flat_map import flat_map, merge
from .limiting import limit_rate, skip, take, take_while
from .sequential import concat, retry
from .timeout import StreamTimeoutError, timeout
from .zip import zip

__all__ = [
    "BufferOverflowError",
    "StreamTimeoutError",
    "buffer",
    "concat",
    "distinct_until_changed",
    "filter",
    "flat_map",
    "limit_rate",
    "map",
    "merge",
    "on_backpressure_buffer",
    "on_backpressure_drop",
    "on_backpressure_latest",
    "reduce",
    "retry",
    "scan",
    "skip",
    "take",
    "take_while",
    "timeout",
    "zip",
]
