"""The publisher the JS benchmark reads: ``items`` (``count`` payloads of ``size`` bytes), as in
benchmarks/systems/rsnet_system.py. Served with ``rsnet serve bench_server:server``."""

import itertools
from typing import Any

import rsnet

server = rsnet.Server()


@server.publisher("items")
def items(params: dict[str, Any], ctx: Any) -> Any:
    return rsnet.from_iterable(itertools.repeat(b"x" * params["size"], params["count"]))
