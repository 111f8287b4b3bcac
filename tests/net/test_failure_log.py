"""Unexpected failures are logged with tracebacks at a bounded rate (resource budget: log lines)."""

from __future__ import annotations

import logging

from rsnet.net import failures


def test_tracebacks_are_bounded_per_minute_and_the_rest_counted(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(failures.time, "monotonic", lambda: now[0])
    limited = failures.RateLimitedLog(logging.getLogger("rsnet.test.failures"), per_minute=10)
    with caplog.at_level(logging.INFO, logger="rsnet.test.failures"):
        for i in range(25):
            try:
                raise RuntimeError(f"failure {i}")
            except RuntimeError:
                limited.exception("connection failed")
        assert len(caplog.records) == 10
        assert all(record.exc_info for record in caplog.records)
        now[0] += 60
        try:
            raise RuntimeError("the next minute")
        except RuntimeError:
            limited.exception("connection failed")
    assert [record.getMessage() for record in caplog.records[10:]] == [
        "15 more failures in the last minute; their tracebacks were left out",
        "connection failed",
    ]
