"""Keeping the broker process's memory at what it uses, not at the most it ever used (glibc).

CPython takes every object over 512 bytes (records, frames, receive chunks, send buffers)
from malloc, and glibc's malloc keeps much of what is freed:

- **The dynamic mmap threshold.** A block of 128 KiB or more comes from mmap, and goes back to
  the OS when freed; but freeing one raises the threshold to its size (up to 32 MiB). After
  the first large frame, batch or buffer is freed, blocks of that size come from the brk heap
  instead, where freed space between live objects stays resident. :meth:`Heap.fix_mmap_threshold`
  sets the threshold (``mallopt(M_MMAP_THRESHOLD)``), which also stops it moving.
- **Free space inside the heap.** glibc gives back only the top of the heap. :meth:`Heap.trim`
  (``malloc_trim(0)``) also releases the free pages in the middle; :func:`release_free_memory`
  does it when at least ``TRIM_WHEN_FREE`` bytes are free, at most once per interval.

Measured with ``benchmarks/soak.py --pad 100000`` (100 kB records, connections cut every 2 s),
4 minutes: without these, the brk heap grew to 206 MiB resident; with the threshold fixed, it
stayed at 13-30 MiB (the large blocks came and went through mmap). ``malloc_trim`` costs a few
milliseconds when it has little to release and up to ~60 ms for ~150 MiB.

Elsewhere than glibc (musl, macOS) every method does nothing and says so (False, 0).
"""

from __future__ import annotations

import ctypes
import logging
import time

import trio

log = logging.getLogger("rsnet.broker")

M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 128 << 10
"""glibc's own starting threshold, kept: blocks this large or larger always come from mmap."""
TRIM_WHEN_FREE = 16 << 20
"""Free bytes inside the heap that make :func:`release_free_memory` trim it."""
TRIM_INTERVAL_S = 5.0


_MALLINFO2_FIELDS = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS]


def _glibc() -> ctypes.CDLL | None:
    """The C library, if it is glibc 2.33 or later (it has ``mallinfo2``); else None."""
    try:
        libc = ctypes.CDLL(None)
        mallopt, malloc_trim, mallinfo2 = libc.mallopt, libc.malloc_trim, libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    mallinfo2.argtypes, mallinfo2.restype = [], _MallInfo2
    return libc


class Heap:
    """This process's malloc heap. Process-wide: only the process's owner (the broker daemon)
    should change it, not a library object."""

    def __init__(self) -> None:
        self._libc = _glibc()

    @property
    def available(self) -> bool:
        """Whether the C library is glibc (else nothing here has an effect)."""
        return self._libc is not None

    def fix_mmap_threshold(self, size: int = MMAP_THRESHOLD) -> bool:
        """Serve blocks of ``size`` bytes or more from mmap from now on, whatever is freed
        later; returns whether glibc took it."""
        return self._libc is not None and self._libc.mallopt(M_MMAP_THRESHOLD, size) == 1

    def free_bytes(self) -> int:
        """Bytes free inside malloc's arenas: resident until trimmed (if they were ever touched)."""
        return 0 if self._libc is None else int(self._libc.mallinfo2().fordblks)

    def trim(self) -> bool:
        """Give every free page of the heap back to the OS (``malloc_trim(0)``); returns
        whether any was. Blocks the calling thread while it walks the free memory."""
        return self._libc is not None and self._libc.malloc_trim(0) == 1


async def release_free_memory(
    heap: Heap, *, interval: float = TRIM_INTERVAL_S, threshold: int = TRIM_WHEN_FREE
) -> None:
    """Every ``interval`` seconds, trim the heap if ``threshold`` bytes or more are free in it."""
    while True:
        await trio.sleep(interval)
        free = heap.free_bytes()
        if free >= threshold:
            start = time.perf_counter()
            heap.trim()
            log.debug("trimmed the heap (%d bytes free) in %.1f ms", free, (time.perf_counter() - start) * 1000)
