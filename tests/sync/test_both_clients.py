"""The same scenarios through both clients, the trio one and the blocking one: the same results
and the same exception types, because both drive the rules of :mod:`rsnet.client_rules`.

The servers run in a background thread (tests/sync/support.py); the trio client runs its own
``trio.run`` in the test's thread, the blocking client runs there directly.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio

import rsnet
import rsnet.sync
from rsnet.client_rules import DEFAULT_BUDGET, MAX_WINDOW
from rsnet.errors import ConnectionLost, HandshakeError, RsnetError, StreamError, TransportClosed
from rsnet.protocol import ErrorCode

from .support import Listener, Probes, ScriptedPeer, ServerThread, make_server, wire_demand

TOKEN = "s3cret"
SCHEMES = ["tcp", "ws"]
DEMAND_OPTIONS = ("prefetch", "limit", "budget")
"""Options of ``subscribe``; the others go to ``connect``. None: the default."""


def trio_items(
    url: str,
    name: str,
    params: Any = None,
    *,
    into: list[Any],
    take: int | None = None,
    before_leaving: Callable[[], None] = lambda: None,
    **options: Any,
):
    """Subscribe with the trio client, appending items to ``into`` (so items that came before
    an error are visible); after ``take`` items, call ``before_leaving`` (a blocking check, run
    in a worker thread while the connection stays live) and leave the loop."""
    demand = {key: options.pop(key, None) for key in DEMAND_OPTIONS}

    async def main() -> None:
        async with rsnet.connect(url, **options) as conn:
            async with conn.subscribe(name, params, **demand) as items:
                async for item in items:
                    into.append(item)
                    if len(into) == take:
                        await trio.to_thread.run_sync(before_leaving)
                        return

    trio.run(main)


def sync_items(
    url: str,
    name: str,
    params: Any = None,
    *,
    into: list[Any],
    take: int | None = None,
    before_leaving: Callable[[], None] = lambda: None,
    **options: Any,
):
    """The same with the blocking client."""
    demand = {key: options.pop(key, None) for key in DEMAND_OPTIONS}
    with rsnet.sync.connect(url, **options) as client:
        items = client.subscribe(name, params, **demand)
        for item in items:
            into.append(item)
            if len(into) == take:
                before_leaving()
                items.close()
                return


def trio_checked(url: str, name: str, params: Any, *, take: int, every: int, check: Callable[[int], None], **demand):
    """Take ``take`` items with the trio client; after every ``every``-th, once everything the
    client wrote so far has reached the server, call ``check(items taken)``."""

    async def settle(conn: rsnet.Client) -> None:
        # Two one-item streams, one after the other: the second's SUBSCRIBE is written after
        # whatever the iterator had requested, so its item comes back after the server read it.
        for _ in range(2):
            assert [x async for x in conn.subscribe("range", {"count": 1})] == [0]

    async def main() -> None:
        async with rsnet.connect(url) as conn:
            async with conn.subscribe(name, params, **demand) as items:
                taken = 0
                async for _ in items:
                    taken += 1
                    if taken % every == 0:
                        await settle(conn)
                        check(taken)
                    if taken == take:
                        return

    trio.run(main)


def sync_checked(url: str, name: str, params: Any, *, take: int, every: int, check: Callable[[int], None], **demand):
    """The same with the blocking client (which writes a REQUEST as soon as it decides it)."""
    with rsnet.sync.connect(url) as client:
        items = client.subscribe(name, params, **demand)
        for taken, _ in enumerate(items, 1):
            if taken % every == 0:
                for _ in range(2):
                    assert list(client.subscribe("range", {"count": 1})) == [0]
                check(taken)
            if taken == take:
                items.close()
                return


CLIENTS = {"trio": trio_items, "blocking": sync_items}
CHECKED = {"trio": trio_checked, "blocking": sync_checked}
Items = Callable[..., None]


@pytest.fixture(params=list(CLIENTS))
def client_kind(request) -> str:
    return request.param


@pytest.fixture
def items_of(client_kind) -> Items:
    return CLIENTS[client_kind]


@pytest.fixture
def checked(client_kind) -> Callable[..., None]:
    return CHECKED[client_kind]


@pytest.fixture(scope="module")
def probes() -> Probes:
    return Probes()


@pytest.fixture(scope="module")
def servers(probes) -> dict[str, rsnet.Server]:
    """ "plain", and "guarded" (needs TOKEN)."""
    return {"plain": make_server(probes), "guarded": make_server(probes, token=TOKEN)}


@pytest.fixture(scope="module")
def server_thread(servers):
    keys = [(name, scheme) for name in servers for scheme in SCHEMES]
    with ServerThread([Listener(servers[name], scheme) for name, scheme in keys]) as thread:
        yield thread


@pytest.fixture(scope="module")
def urls(servers, server_thread):
    """("plain" | "guarded" (needs TOKEN), scheme) -> URL."""
    keys = [(name, scheme) for name in servers for scheme in SCHEMES]
    return dict(zip(keys, server_thread.urls, strict=True))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_params_are_one_mapping_and_reach_the_publisher(items_of, urls, scheme):
    got: list[Any] = []
    items_of(urls["plain", scheme], "range", {"start": 7, "count": 1000}, into=got, prefetch=32)
    assert got == list(range(7, 1007))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_remote_error_is_a_stream_error_with_code_name_and_data_after_the_items(items_of, urls, scheme):
    got: list[Any] = []
    with pytest.raises(StreamError) as raised:
        items_of(urls["plain", scheme], "fail", {"n": 3}, into=got)
    assert got == [0, 1, 2]
    assert (raised.value.code, raised.value.message, raised.value.data) == (4711, "quota exceeded", {"limit": 10})
    assert raised.value.code_name == "application error 4711"
    assert isinstance(raised.value, RsnetError)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_unknown_publisher_is_refused_with_its_code(items_of, urls, scheme):
    with pytest.raises(StreamError) as raised:
        items_of(urls["plain", scheme], "no-such-publisher", into=[])
    assert raised.value.code == ErrorCode.UNKNOWN_PUBLISHER
    assert raised.value.code_name == "UNKNOWN_PUBLISHER"


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("token", [None, "wrong"])
def test_a_refused_token_is_a_handshake_error_with_code_unauthorized(items_of, urls, scheme, token):
    with pytest.raises(HandshakeError) as raised:
        items_of(urls["guarded", scheme], "range", {"count": 1}, into=[], token=token)
    assert raised.value.code == ErrorCode.UNAUTHORIZED
    assert isinstance(raised.value, ConnectionLost)


def test_the_right_token_is_accepted(items_of, urls):
    got: list[Any] = []
    items_of(urls["guarded", "tcp"], "range", {"count": 2}, into=got, token=TOKEN)
    assert got == [0, 1]


@pytest.mark.parametrize("scheme", ["tcp", "ws"])
def test_an_unreachable_server_is_transport_closed(items_of, scheme):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(TransportClosed) as raised:
        items_of(f"{scheme}://127.0.0.1:{port}/", "range", {"count": 1}, into=[], timeout=2)
    assert isinstance(raised.value, ConnectionLost)


def test_a_silent_server_is_a_handshake_error_with_code_timeout(items_of):
    # The peer stays silent for 2 s, then closes: only our own 0.3 s timeout gives TIMEOUT.
    with ScriptedPeer(lambda sock: time.sleep(2.0)) as peer:
        with pytest.raises(HandshakeError) as raised:
            items_of(peer.url, "range", {"count": 1}, into=[], timeout=0.3)
    assert raised.value.code == ErrorCode.TIMEOUT


@pytest.mark.parametrize(
    ("url", "params", "prefetch", "error"),
    [
        ("http://127.0.0.1:1/", None, 1, ValueError),  # not a scheme a client dials
        ("tcp://127.0.0.1/", None, 1, ValueError),  # no port
        ("tcp://127.0.0.1:99999", None, 1, ValueError),  # a port out of range
        ("tcp://127.0.0.1:{port}", [("count", 1)], 1, TypeError),  # params must be a mapping
        ("tcp://127.0.0.1:{port}", None, 0, ValueError),  # prefetch must be positive
    ],
)
def test_bad_arguments_are_refused_the_same_way(items_of, urls, url, params, prefetch, error):
    port = urls["plain", "tcp"].rsplit(":", 1)[1]
    with pytest.raises(error):
        items_of(url.format(port=port), "range", params, into=[], prefetch=prefetch)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_demand_follows_the_same_refill_rule(items_of, urls, probes, scheme, request):
    """prefetch 8: 8 up front, then 6 (8 - 8//4) each time 6 were consumed; leaving after 20
    items cancels. Both clients ask the server for exactly the same amount."""
    tag = request.node.name
    probe = probes[tag]
    granted_before_leaving: list[int] = []

    def demand_settles() -> None:
        # 20 consumed: refills after the 6th, 12th and 18th item reach the server.
        deadline = time.monotonic() + 5
        while probe.requested < 8 + 3 * 6 and time.monotonic() < deadline:
            time.sleep(0.005)
        granted_before_leaving.append(probe.requested)

    got: list[Any] = []
    items_of(
        urls["plain", scheme], "endless", {"tag": tag}, into=got, take=20, prefetch=8, before_leaving=demand_settles
    )
    assert got == list(range(20))
    assert granted_before_leaving == [8 + 3 * 6]
    assert probe.cancelled.wait(5), "leaving the loop must cancel the stream at the server"
    assert probe.requested == 8 + 3 * 6  # nothing more after the cancel


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(("limit", "prefetch"), [(20, 8), (5, 64), (0, 8), (3, None), (5, None), (1000, None)])
def test_a_limit_is_exact_demand_on_the_wire(items_of, urls, probes, scheme, limit, prefetch, request):
    """``limit=n`` takes n items and never asks the server for more, then cancels; with a fixed
    ``prefetch`` and with the default, adaptive demand alike."""
    tag = request.node.name
    got: list[Any] = []
    items_of(urls["plain", scheme], "endless", {"tag": tag}, into=got, limit=limit, prefetch=prefetch)
    assert got == list(range(limit))
    probe = probes[tag]
    if limit:
        assert probe.cancelled.wait(5), "taking the last item cancels the stream"
    assert probe.requested == limit
    assert probe.emitted == limit


BLOB = 1024 * 1024 - 64
"""A 1 MiB item, less what its frame adds, so that it fits the default max_frame_size."""


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("budget", [None, 2 * 1024 * 1024])
def test_by_default_1_mib_items_keep_demand_on_the_wire_within_the_byte_budget(
    checked, urls, server_thread, servers, probes, scheme, budget, request
):
    """The default demand (no prefetch) counts bytes: at every item, what the client has
    requested and not yet consumed, as the server received it, is at most the budget's worth of
    1 MiB items (4 with the default 4 MiB: under the fixed 256 of old, 256 MiB)."""
    tag = request.node.name
    probe = probes[tag]
    outstanding: list[int] = []

    def check(taken: int) -> None:
        outstanding.append(wire_demand(server_thread, servers["plain"], probe) - taken)

    checked(urls["plain", scheme], "blobs", {"tag": tag, "size": BLOB}, take=12, every=1, check=check, budget=budget)
    limit = (budget or DEFAULT_BUDGET) // BLOB
    assert len(outstanding) == 12
    assert all(0 < count <= limit for count in outstanding), outstanding
    assert probe.cancelled.wait(5)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_by_default_demand_on_the_wire_stays_bounded_for_small_items(
    checked, urls, server_thread, servers, probes, scheme, request
):
    """Small items: the adaptive window may grow, never beyond MAX_WINDOW items outstanding."""
    tag = request.node.name
    probe = probes[tag]
    outstanding: list[int] = []

    def check(taken: int) -> None:
        outstanding.append(wire_demand(server_thread, servers["plain"], probe) - taken)

    checked(urls["plain", scheme], "endless", {"tag": tag}, take=30_000, every=10_000, check=check)
    assert len(outstanding) == 3
    assert all(0 < count <= MAX_WINDOW for count in outstanding), outstanding


def test_a_budget_sizes_the_adaptive_window_only(items_of, urls):
    """A byte budget with a fixed prefetch is refused (a fixed window is counted in items)."""
    with pytest.raises(ValueError):
        items_of(urls["plain", "tcp"], "range", {"count": 1}, into=[], prefetch=8, budget=1024)
    with pytest.raises(ValueError):
        items_of(urls["plain", "tcp"], "range", {"count": 1}, into=[], budget=0)
