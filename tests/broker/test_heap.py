"""The broker daemon keeps glibc's heap at what it uses (rsnet/broker/heap.py).

Each case runs in its own Python process (malloc's settings are process-wide) and measures the
process's resident memory (``/proc/self/statm``) around 64 MiB of blocks freed while small
objects allocated between them stay alive: the pattern that kept a soaked broker's RSS high.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from rsnet.broker.heap import Heap

pytestmark = pytest.mark.skipif(not Heap().available, reason="the C library is not glibc >= 2.33")

FRAGMENT = """
import os
from rsnet.broker.heap import Heap, release_free_memory

heap = Heap()
# The free chunks start-up left (how many moves with every import) used up first: else the
# pins below may land in them rather than between the blocks, which then free as one.
fillers = [bytearray(1000) for _ in range(10_000)]

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def fragment(size):
    '''64 MiB of blocks of ``size`` bytes with small live objects between them; frees the
    blocks and returns the MiB that stayed resident.'''
    base = resident()
    blocks, pins = [], []
    for _ in range((64 << 20) // size):
        blocks.append(bytearray(size))
        pins.append(bytearray(1000))  # over 512 bytes: from malloc too, between the blocks
    fragment.pins = pins
    del blocks
    return (resident() - base) >> 20

{case}
"""


def run(case: str) -> str:
    script = FRAGMENT.format(case=textwrap.dedent(case))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_large_blocks_freed_after_a_larger_one_stay_resident_unless_the_mmap_threshold_is_fixed() -> None:
    case = """
    if {fixed}:
        assert heap.fix_mmap_threshold()
    freed = bytearray(4 << 20)  # one large block freed: glibc raises its threshold to 4 MiB
    del freed
    print(fragment(1 << 20))
    """
    assert int(run(case.format(fixed=False))) >= 60  # glibc's default: 1 MiB blocks came from the heap
    assert int(run(case.format(fixed=True))) <= 2  # from mmap, and given back when freed


def test_trimming_gives_free_pages_inside_the_heap_back() -> None:
    case = """
    heap.fix_mmap_threshold()
    kept = fragment(100_000)  # under the threshold: from the heap
    free = heap.free_bytes() >> 20
    before = resident()
    assert heap.trim()
    print(kept, free, (before - resident()) >> 20)
    """
    kept, free, released = map(int, run(case).split())
    assert kept >= 60 and free >= 60 and released >= 55


def test_the_release_task_trims_only_when_enough_is_free() -> None:
    case = """
    import trio  # imported late: what importing it allocates and frees would change case 1
    from trio.testing import MockClock

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: release_free_memory(heap, interval=5, threshold=32 << 20))
            base = resident()
            blocks, pins = [], []
            for _ in range(80):  # 8 MB free: under the threshold, left alone
                blocks.append(bytearray(100_000)); pins.append(bytearray(1000))
            del blocks
            await trio.sleep(6)
            untouched = resident() - base
            kept = fragment(100_000)  # 64 MiB free: trimmed at the next round
            await trio.sleep(5)
            print(untouched >> 20, kept, (resident() - base) >> 20)
            nursery.cancel_scope.cancel()

    heap.fix_mmap_threshold()
    trio.run(main, clock=MockClock(autojump_threshold=0))
    """
    untouched, kept, after = map(int, run(case).split())
    assert untouched >= 6 and kept >= 50 and after <= 4  # the first 8 MB were reused, then everything free went
