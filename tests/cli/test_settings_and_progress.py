"""``rsnet serve`` takes the server's keepalive and connection limit (issue 10 finding 7); ``rsnet
topics`` shows each topic's named cursors, so an operator sees a consumer's (a Spark query's)
progress (issue 9)."""

from __future__ import annotations

import pytest
import trio

import rsnet
from rsnet.broker.client import commit, publish
from rsnet.protocol import ErrorCode

from .support import Daemon
from .support import rsnet as run_rsnet


async def test_serve_takes_keepalive_and_max_connections():
    with Daemon("serve", "--demo", "--tcp", "127.0.0.1:0", "--keepalive", "0.5", "--max-connections", "1") as served:
        async with rsnet.connect(served.url) as conn:
            assert conn._session.conn.keepalive_interval == 500  # the WELCOME's
            with pytest.raises(rsnet.HandshakeError) as refused:
                async with rsnet.connect(served.url):
                    pass
            assert refused.value.code == ErrorCode.GOING_AWAY
    bad = run_rsnet("serve", "--demo", "--tcp", "127.0.0.1:0", "--max-connections", "0")
    assert bad.returncode != 0 and "max-connections" in bad.stderr and "Traceback" not in bad.stderr


async def test_topics_shows_committed_cursors_with_their_lag(broker):
    async with rsnet.connect(broker.url) as conn:
        await publish(conn, "progress.events", range(10), producer="p")
        await commit(conn, "progress.events", "spark-query-1", 7)
    shown = await trio.to_thread.run_sync(lambda: run_rsnet("topics", broker.url))
    assert shown.returncode == 0, shown.stderr
    assert "cursor spark-query-1: 7 (lag 3)" in shown.stdout
