"""rsnet: Reactive Streams across the network, on trio.

The streams core is re-exported here: ``rsnet.from_iterable(...)``, ``rsnet.iterate(...)``,
``rsnet.ops.map(...)``. See ``rsnet.streams`` for the layering.
"""

from .streams import *  # noqa: F401,F403 - the core is the package's public surface
from .streams import __all__ as _streams_all

__version__ = "0.1.0"
__all__ = [*_streams_all, "__version__"]
