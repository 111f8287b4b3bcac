from __future__ import annotations

import pytest

from .support import Daemon


@pytest.fixture(scope="module")
def broker():
    """One in-memory broker per test module (tests use their own topic names)."""
    with Daemon("broker", "--tcp", "127.0.0.1:0") as daemon:
        yield daemon


@pytest.fixture(scope="module")
def demo():
    with Daemon("serve", "--demo", "--tcp", "127.0.0.1:0") as daemon:
        yield daemon
