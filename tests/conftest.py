"""Fixtures shared by the test packages."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic garbage collector off for the test: what it checks is freed by reference
    counting alone (a server tunes the collector to run rarely: ``rsnet.net.gc_tuning``)."""
    gc.collect()  # what earlier tests left
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
