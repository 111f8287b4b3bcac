"""The ``rsnet`` command line.

``rsnet demo`` runs a small live demo of the streams core: a fast producer feeding a slow
consumer through a bounded pipeline, showing that the producer only runs as far ahead as
the consumer's demand allows.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import trio

from . import streams
from .streams import ops


async def _demo(items: int, prefetch: int) -> None:
    produced = 0

    async def sensor():  # a fast producer: it could run ahead forever, but is never asked to
        nonlocal produced
        for reading in range(items):
            produced += 1
            yield {"seq": reading, "value": (reading * 37) % 101}
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        readings = streams.from_async_iterable(sensor, nursery=nursery).pipe(
            ops.filter(lambda r: r["value"] % 2 == 0),
            ops.map(lambda r: r["value"]),
            ops.buffer(4),
            ops.map(lambda batch: sum(batch) / len(batch)),
        )
        consumed = 0
        async with streams.iterate(readings, prefetch=prefetch) as averages:
            async for average in averages:
                consumed += 1
                print(
                    f"average of 4 even readings: {average:6.2f}   "
                    f"produced so far: {produced:4d}   (ahead of the consumer by at most "
                    f"the demand of {prefetch} batches)"
                )
                await trio.sleep(0.05)  # a slow consumer
        print(f"done: {consumed} averages from {produced} readings")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rsnet", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the live demo")
    demo.add_argument("--items", type=int, default=200, help="readings the producer offers")
    demo.add_argument("--prefetch", type=int, default=2, help="batches the consumer requests")
    args = parser.parse_args(argv)
    if args.command == "demo":
        trio.run(_demo, args.items, args.prefetch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
