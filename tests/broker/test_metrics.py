"""Broker metrics, the /metrics and /health endpoint over real sockets, and structured logs."""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import threading
import tracemalloc
from types import SimpleNamespace

import pytest
import trio
import trio.testing

import rsnet
from rsnet.broker.logging import configure_logging
from rsnet.broker.metrics import (
    MAX_REQUEST_BODY,
    MAX_REQUEST_HEAD,
    REFUSAL_SLOTS,
    RENDER_REUSE_S,
    BrokerMetrics,
    connection_budget,
    serve_http,
)

from .support import broker_serving

# -- the metrics ----------------------------------------------------------------------------


def value(metrics: BrokerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_each_broker_has_its_own_registry():
    first, second = BrokerMetrics(), BrokerMetrics()  # the global registry would refuse the second
    first.records_in("a", 5)
    assert value(first, "rsnet_broker_records_in_total", topic="a") == 5
    assert value(second, "rsnet_broker_records_in_total", topic="a") is None


def test_connections_and_streams():
    metrics = BrokerMetrics()
    assert value(metrics, "rsnet_broker_streams", kind="publish") == 0  # present before first use
    metrics.connection_opened()
    metrics.connection_opened()
    metrics.connection_closed()
    metrics.stream_opened("subscribe")
    metrics.stream_opened("subscribe")
    metrics.stream_opened("publish")
    metrics.stream_closed("subscribe")
    assert value(metrics, "rsnet_broker_connections") == 1
    assert value(metrics, "rsnet_broker_connections_opened_total") == 2
    assert value(metrics, "rsnet_broker_streams", kind="subscribe") == 1
    assert value(metrics, "rsnet_broker_streams", kind="publish") == 1
    with pytest.raises(ValueError):
        metrics.stream_opened("sideways")  # type: ignore[arg-type]


async def test_every_connection_is_counted_even_one_that_ended_between_two_scrapes():
    from rsnet.broker.broker import Broker
    from rsnet.broker.daemon import metrics_refresher

    metrics, broker = BrokerMetrics(), Broker()
    async with broker_serving(broker) as (url, server):
        refresh = metrics_refresher(broker, server)
        async with rsnet.connect(url):  # one stays open across the scrape
            for _ in range(3):  # as CLI commands do: connect, ask, close, all between two scrapes
                async with rsnet.connect(url) as conn:
                    async for _topic in conn.subscribe("$topics"):
                        pass
            while len(server.sessions) > 1:  # the server has seen the three close
                await trio.sleep(0.01)
            refresh(metrics)
            assert value(metrics, "rsnet_broker_connections_opened_total") == 4
            assert value(metrics, "rsnet_broker_connections") == 1
        while server.sessions:
            await trio.sleep(0.01)
        refresh(metrics)
        assert value(metrics, "rsnet_broker_connections_opened_total") == 4
        assert value(metrics, "rsnet_broker_connections") == 0


async def test_only_the_subscribers_furthest_behind_have_their_own_series(monkeypatch):
    # Attack round 5: 80,000 idle subscriptions made every scrape 10 MB of series and stalled
    # the event loop for up to half a second. Per topic, the count and the largest lag.
    from rsnet.broker import daemon
    from rsnet.broker.broker import Broker
    from rsnet.broker.client import publish
    from rsnet.protocol import Accept, Subscribe

    from .support import RawClient

    monkeypatch.setattr(daemon, "MAX_SUBSCRIBER_SERIES", 5)
    metrics, broker = BrokerMetrics(), Broker()
    async with broker_serving(broker) as (url, server), rsnet.connect(url) as conn:
        await publish(conn, "a", list(range(20)))
        client = await RawClient.connect(url)
        await client.send(*(Subscribe(2 * i + 1, "a", {"from": i}, 0, {}) for i in range(20)))
        for i in range(20):
            await client.frame_of(Accept, 2 * i + 1)
        daemon.metrics_refresher(broker, server)(metrics)
        text = metrics.render()[0].decode()
        lags = sorted(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("rsnet_broker_subscriber_lag{")
        )
        assert lags == [16, 17, 18, 19, 20]
        assert text.count("rsnet_broker_subscriber_demand{") == 5
        assert value(metrics, "rsnet_broker_subscribers", topic="a") == 20
        assert value(metrics, "rsnet_broker_subscriber_lag_max", topic="a") == 20
        await client.aclose()


def test_topic_counters_and_storage():
    metrics = BrokerMetrics()
    metrics.records_in("sensors.kitchen", 10)
    metrics.records_in("sensors.kitchen")
    metrics.records_out("sensors.kitchen", 7)
    metrics.records_dropped("sensors.kitchen", 3)
    metrics.slow_subscriber_disconnected("orders.new")
    metrics.set_storage("sensors.kitchen", 4096, records=11)
    metrics.auth_denied("unauthenticated")
    metrics.auth_denied("forbidden")
    metrics.auth_denied("forbidden")
    assert value(metrics, "rsnet_broker_records_in_total", topic="sensors.kitchen") == 11
    assert value(metrics, "rsnet_broker_records_out_total", topic="sensors.kitchen") == 7
    assert value(metrics, "rsnet_broker_records_dropped_total", topic="sensors.kitchen") == 3
    assert value(metrics, "rsnet_broker_slow_subscriber_disconnects_total", topic="orders.new") == 1
    assert value(metrics, "rsnet_broker_storage_bytes", topic="sensors.kitchen") == 4096
    assert value(metrics, "rsnet_broker_storage_records", topic="sensors.kitchen") == 11
    assert value(metrics, "rsnet_broker_auth_denials_total", reason="forbidden") == 2
    assert value(metrics, "rsnet_broker_auth_denials_total", reason="unauthenticated") == 1


def test_subscriber_series_are_removed_with_the_subscriber():
    metrics = BrokerMetrics()
    metrics.set_lag("sensors.a", "sub-1", 120)
    metrics.set_lag("sensors.b", "sub-1", 3)  # a wildcard subscriber lags per topic
    metrics.set_lag("sensors.a", "sub-2", 0)
    metrics.set_demand("sub-1", 16)
    assert value(metrics, "rsnet_broker_subscriber_lag", topic="sensors.a", subscriber="sub-1") == 120
    assert value(metrics, "rsnet_broker_subscriber_demand", subscriber="sub-1") == 16
    metrics.remove_subscriber("sub-1")
    metrics.remove_subscriber("never-seen")
    assert value(metrics, "rsnet_broker_subscriber_lag", topic="sensors.a", subscriber="sub-1") is None
    assert value(metrics, "rsnet_broker_subscriber_lag", topic="sensors.b", subscriber="sub-1") is None
    assert value(metrics, "rsnet_broker_subscriber_demand", subscriber="sub-1") is None
    assert value(metrics, "rsnet_broker_subscriber_lag", topic="sensors.a", subscriber="sub-2") == 0


def test_producer_series_are_removed_with_the_producer():
    metrics = BrokerMetrics()
    metrics.set_producer_demand("orders", "p1", 64)
    metrics.set_producer_demand("orders", "p2", 0)
    assert value(metrics, "rsnet_broker_producer_demand", topic="orders", producer="p1") == 64
    metrics.remove_producer("orders", "p1")
    metrics.remove_producer("orders", "p1")
    assert value(metrics, "rsnet_broker_producer_demand", topic="orders", producer="p1") is None
    assert value(metrics, "rsnet_broker_producer_demand", topic="orders", producer="p2") == 0


def test_a_removed_topic_leaves_no_series():
    metrics = BrokerMetrics()
    for topic in ("gone", "kept"):
        metrics.records_in(topic, 1)
        metrics.records_out(topic, 1)
        metrics.records_dropped(topic, 1)
        metrics.set_storage(topic, 10, 1)
        metrics.set_lag(topic, "sub", 1)
        metrics.set_producer_demand(topic, "p", 1)
    metrics.remove_topic("gone")
    metrics.remove_topic("never-seen")
    assert 'topic="gone"' not in metrics.render()[0].decode()
    assert value(metrics, "rsnet_broker_records_in_total", topic="kept") == 1
    assert value(metrics, "rsnet_broker_subscriber_lag", topic="kept", subscriber="sub") == 1
    assert value(metrics, "rsnet_broker_producer_demand", topic="kept", producer="p") == 1


def test_render_runs_refreshers_first_and_survives_a_failing_one(caplog):
    metrics = BrokerMetrics()

    def broken(_: BrokerMetrics) -> None:
        raise RuntimeError("bug")

    metrics.add_refresher(broken)
    metrics.add_refresher(lambda m: m.set_lag("t", "s", 42))
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    assert 'rsnet_broker_subscriber_lag{subscriber="s",topic="t"} 42.0' in body.decode()
    assert "a metrics refresher failed" in caplog.text


def test_render_speaks_openmetrics_when_asked():
    body, content_type = BrokerMetrics().render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


# -- the HTTP endpoint, over real sockets -----------------------------------------------------


@pytest.fixture
async def endpoint(nursery):
    metrics = BrokerMetrics()
    state: dict = {"healthy": True, "topics": 3}

    def health() -> dict:
        if state.get("raise"):
            raise RuntimeError("the storage is on fire")
        return dict(state)

    serve = functools.partial(serve_http, metrics, "127.0.0.1", 0, health, request_timeout=0.5, max_connections=4)
    listeners = await nursery.start(serve)
    return SimpleNamespace(metrics=metrics, state=state, port=listeners[0].socket.getsockname()[1])


async def exchange(port: int, data: bytes, *, close: bool = False) -> bytes:
    """Send raw bytes, then read until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        if close:
            await stream.send_eof()
        received = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                received += chunk
        return received


def parse_responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    responses = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines)}
        length = int(headers.get("content-length", "0"))
        responses.append((int(status_line.split()[1]), headers, data[:length]))
        data = data[length:]
    return responses


async def get(port: int, target: str, method: str = "GET", extra: str = "") -> tuple[int, dict[str, str], bytes]:
    raw = await exchange(port, f"{method} {target} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n{extra}\r\n".encode())
    (response,) = parse_responses(raw)
    return response


async def test_get_metrics(endpoint):
    endpoint.metrics.records_in("sensors.kitchen", 5)
    status, headers, body = await get(endpoint.port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    assert 'rsnet_broker_records_in_total{topic="sensors.kitchen"} 5.0' in body.decode()
    status, _, _ = await get(endpoint.port, "/metrics?name[]=x")  # a query string is ignored
    assert status == 200


async def test_get_metrics_as_openmetrics(endpoint):
    status, headers, body = await get(endpoint.port, "/metrics", extra="accept: application/openmetrics-text\r\n")
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


async def test_head_has_the_headers_and_no_body(endpoint):
    raw = await exchange(endpoint.port, b"HEAD /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert int(parse_responses(head + b"\r\n\r\n")[0][1]["content-length"]) > 0
    assert rest == b""


async def test_health_is_200_when_healthy_and_503_when_not(endpoint):
    status, headers, body = await get(endpoint.port, "/health")
    assert (status, headers["content-type"], json.loads(body)) == (
        200,
        "application/json",
        {"healthy": True, "topics": 3},
    )
    endpoint.state["healthy"] = False
    status, _, body = await get(endpoint.port, "/health")
    assert (status, json.loads(body)["healthy"]) == (503, False)
    endpoint.state.pop("healthy")  # no verdict is no health
    assert (await get(endpoint.port, "/health"))[0] == 503


async def test_a_failing_health_check_is_503_and_logged(endpoint, caplog):
    endpoint.state["raise"] = True
    status, _, body = await get(endpoint.port, "/health")
    assert status == 503
    assert json.loads(body) == {"healthy": False, "error": "the health check failed"}
    assert "the storage is on fire" in caplog.text  # the traceback goes to the log, not the client


async def test_other_paths_are_404_and_other_methods_405(endpoint):
    for target in ["/", "/metricsx", "/metrics/", "/health/../metrics", "*"]:
        assert (await get(endpoint.port, target))[0] == 404
    status, headers, _ = await get(endpoint.port, "/metrics", method="POST", extra="content-length: 0\r\n")
    assert (status, headers["allow"]) == (405, "GET, HEAD")
    assert (await get(endpoint.port, "/health", method="DELETE"))[0] == 405


async def test_keep_alive_and_pipelining(endpoint):
    raw = await exchange(
        endpoint.port,
        b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
        b"GET /nothing HTTP/1.1\r\nhost: x\r\n\r\n"
        b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    assert [status for status, _, _ in parse_responses(raw)] == [200, 404, 200]


async def test_http_1_0_is_answered_and_closed(endpoint):
    (response,) = parse_responses(await exchange(endpoint.port, b"GET /health HTTP/1.0\r\n\r\n"))
    assert response[0] == 200


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET\r\n\r\n", 400),
        (b"GET /metrics\r\n\r\n", 400),  # HTTP/0.9
        (b"GET /metrics HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without host
        (b"G(T /metrics HTTP/1.1\r\nhost: x\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nhost: x\r\nbad header line\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: nope\r\n\r\n", 400),
        (b"GET /m\x00trics HTTP/1.1\r\nhost: x\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) + b"\r\n\r\n", 400),  # a TLS hello
        (b"GET /metrics HTTP/1.1\r\nhost: x\r\nx: " + b"a" * (MAX_REQUEST_HEAD * 2) + b"\r\n\r\n", 431),
        (b"POST /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n" + b"x" * (MAX_REQUEST_BODY * 2), 413),
    ],
)
async def test_bad_requests_get_an_error_and_the_server_lives_on(endpoint, request_bytes, status):
    responses = parse_responses(await exchange(endpoint.port, request_bytes))
    assert [response[0] for response in responses] == [status]
    assert responses[0][1]["connection"] == "close"
    assert (await get(endpoint.port, "/health"))[0] == 200


async def test_a_client_that_hangs_up_mid_request_does_no_harm(endpoint):
    (response,) = parse_responses(await exchange(endpoint.port, b"GET /metrics HTTP/1.1\r\nhost:", close=True))
    assert response[0] == 400  # a half-closed request is incomplete
    stream = await trio.open_tcp_stream("127.0.0.1", endpoint.port)
    await stream.send_all(b"GET /metr")
    await stream.aclose()
    assert (await get(endpoint.port, "/metrics"))[0] == 200


async def test_a_slow_request_is_cut_off(endpoint):
    stream = await trio.open_tcp_stream("127.0.0.1", endpoint.port)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
        with trio.fail_after(3):  # the endpoint's request_timeout is 0.5 s
            assert await stream.receive_some(1024) == b""


async def test_an_idle_keep_alive_connection_is_closed(endpoint):
    stream = await trio.open_tcp_stream("127.0.0.1", endpoint.port)
    async with stream:
        await stream.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        received = b""
        with trio.fail_after(3):
            while chunk := await stream.receive_some(1024):
                received += chunk
        assert [status for status, _, _ in parse_responses(received)] == [200]


async def test_a_flood_of_connections_holds_at_most_the_limit_plus_the_refusal_slots(endpoint):
    # Each accepted socket is a file descriptor the durable topics may need: beyond the limit
    # and the refusals being answered, connections wait in the listen backlog (it accepted
    # them all, and a refusal's socket lingers a second).
    before = len(os.listdir("/proc/self/fd"))
    flood = [await trio.open_tcp_stream("127.0.0.1", endpoint.port) for _ in range(100)]
    try:
        await trio.testing.wait_all_tasks_blocked()
        accepted = len(os.listdir("/proc/self/fd")) - before - len(flood)
        assert accepted <= 4 + REFUSAL_SLOTS
    finally:
        for stream in flood:
            await stream.aclose()
    await trio.sleep(1.5)  # the refusals' lingering ends (LINGER), their slots come back
    assert (await get(endpoint.port, "/health"))[0] == 200


async def test_health_is_answered_while_every_slot_is_taken_and_the_rest_is_refused(endpoint):
    # Attack round 5: slow requests held every slot, and /health was answered 503 "too many
    # connections": to a load balancer or Kubernetes, an unhealthy broker to restart.
    held = []
    for _ in range(4):  # max_connections: each sends half a request and nothing more
        stream = await trio.open_tcp_stream("127.0.0.1", endpoint.port)
        await stream.send_all(b"GET /metrics HTTP/1.1\r\n")
        held.append(stream)
    await trio.testing.wait_all_tasks_blocked()
    status, _, body = await get(endpoint.port, "/health")
    assert status == 200 and json.loads(body)["topics"] == 3
    endpoint.state["healthy"] = False
    assert (await get(endpoint.port, "/health"))[0] == 503  # the broker's own answer, unhealthy
    status, _, body = await get(endpoint.port, "/metrics")
    assert status == 503 and body == b"too many connections\n"
    for stream in held:
        await stream.aclose()


@pytest.mark.parametrize("opening", [b"", b"GET /metrics HTTP/1.1\r\n"], ids=["silent", "half-a-request"])
async def test_health_is_answered_at_once_behind_a_flood_of_sockets_that_hold_every_slot(nursery, opening):
    # Attack round 6: 200 silent sockets held the 72 slots until their request timeout, and a
    # /health probe waited behind them in the listen backlog for 17 s. The oldest are now
    # closed to make room: the probe is answered with every flooding socket still open (and
    # a request timeout of an hour, which would otherwise be the wait).
    health = functools.partial(dict, healthy=True)
    serve = functools.partial(
        serve_http, BrokerMetrics(), "127.0.0.1", 0, health, request_timeout=3600, max_connections=4
    )
    port = (await nursery.start(serve))[0].socket.getsockname()[1]
    before = len(os.listdir("/proc/self/fd"))
    flood = []
    for _ in range(100):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        if opening:
            await stream.send_all(opening)
        flood.append(stream)
    try:
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(5):
            assert (await get(port, "/health"))[0] == 200
        await trio.testing.wait_all_tasks_blocked()
        assert len(os.listdir("/proc/self/fd")) - before - len(flood) <= 4 + REFUSAL_SLOTS
    finally:
        for stream in flood:
            await stream.aclose()


async def test_connections_waiting_for_a_render_are_evicted_to_make_room_too(nursery):
    # Attack round of session 22: eviction closed only the socket, and a scrape waiting for
    # another's render (one at a time, 0.9 s for 8,000 topics) waits for no socket, so evicted
    # scrapes kept their slots until that render was done, and /health waited behind them.
    metrics = BrokerMetrics()
    health = functools.partial(dict, healthy=True)
    serve = functools.partial(serve_http, metrics, "127.0.0.1", 0, health, request_timeout=3600, max_connections=4)
    port = (await nursery.start(serve))[0].socket.getsockname()[1]
    held = []
    async with metrics._rendering:  # a render in progress, for as long as this block lasts
        try:
            for _ in range(4):  # every connection slot: scrapes waiting for the render
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
                held.append(stream)
            for _ in range(REFUSAL_SLOTS):  # and every refusal slot: silent sockets
                held.append(await trio.open_tcp_stream("127.0.0.1", port))
            await trio.testing.wait_all_tasks_blocked()
            assert metrics._rendering.statistics().tasks_waiting == 4
            with trio.fail_after(5):
                assert (await get(port, "/health"))[0] == 200  # made room: the oldest scrape went
            assert metrics._rendering.statistics().tasks_waiting == 3
        finally:
            for stream in held:
                await stream.aclose()


async def test_slow_readers_of_metrics_share_its_encoding_instead_of_a_copy_each(nursery):
    # Attack round 7: 72 connections asking for a 29 MB /metrics and reading nothing took the
    # broker from 271 to 2,101 MiB: each pending answer held the headers and body joined anew.
    metrics = BrokerMetrics()
    for index in range(3000):
        metrics.records_in(f"topic.{index:05d}.{'x' * 100}", 1)
    serve = functools.partial(
        serve_http, metrics, "127.0.0.1", 0, functools.partial(dict, healthy=True), request_timeout=3600
    )
    port = (await nursery.start(serve))[0].socket.getsockname()[1]
    size = len((await get(port, "/metrics"))[2])  # encoded: scrapes within a second share it
    assert size > 400_000
    readers = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")  # and never reads
            readers.append(stream)
        await trio.testing.wait_all_tasks_blocked(0.1)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        for stream in readers:
            await stream.aclose()
    assert held < size  # (20 copies before)


async def test_the_endpoint_stops_when_cancelled():
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(serve_http, BrokerMetrics(), "127.0.0.1", 0, lambda: {"healthy": True})
            port = listeners[0].socket.getsockname()[1]
            assert (await get(port, "/health"))[0] == 200
            scope.cancel()
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", port)


# -- structured logs ------------------------------------------------------------------------


@pytest.fixture
def root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_logs_are_one_object_per_line_with_extra_fields(root_logger):
    out = io.StringIO()
    configure_logging(json=True, level="debug", stream=out)
    log = logging.getLogger("rsnet.broker.test")
    log.info("topic %s created\nsecond line é", "sensors.kitchen", extra={"topic": "sensors.kitchen", "offset": 7})
    log.debug("with an object", extra={"peer": ("127.0.0.1", 5000), "thing": object()})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert set(first) == {"time", "level", "logger", "message", "topic", "offset"}
    assert first["time"].endswith("Z") and first["time"][10] == "T"
    assert (first["level"], first["logger"]) == ("info", "rsnet.broker.test")
    assert first["message"] == "topic sensors.kitchen created\nsecond line é"
    assert (first["topic"], first["offset"]) == ("sensors.kitchen", 7)
    assert lines[0].isascii()
    second = json.loads(lines[1])
    assert second["peer"] == ["127.0.0.1", 5000] and second["thing"].startswith("<object")


def test_json_logs_carry_exceptions_and_redact_secret_fields(root_logger):
    out = io.StringIO()
    configure_logging(json=True, stream=out)
    log = logging.getLogger("rsnet.broker.test")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra={"auth_token": "s3cret", "client_secret": "s3cret", "time": "mine"})
    log.debug("below the level")
    (line,) = out.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["level"] == "error"
    assert "ValueError: boom" in entry["exception"]
    assert entry["auth_token"] == entry["client_secret"] == "[redacted]"
    assert entry["extra_time"] == "mine"  # an extra field never overwrites a core one
    assert "s3cret" not in out.getvalue()


def test_configure_logging_replaces_its_own_handler_only(root_logger):
    other = logging.NullHandler()
    root_logger.addHandler(other)
    first, second = io.StringIO(), io.StringIO()
    configure_logging(json=True, stream=first)
    configure_logging(json=False, stream=second)
    logging.getLogger("rsnet.broker.test").warning("hello", extra={"topic": "a.b"})
    assert first.getvalue() == ""
    assert second.getvalue().rstrip().endswith("WARNING rsnet.broker.test: hello topic='a.b'")
    assert other in root_logger.handlers


async def test_an_rsnet_client_given_the_http_port_is_told_at_once(endpoint):
    # The HTTP server answers binary at once (400: no request line will ever end) instead of
    # waiting out its timeout, and the client says an HTTP server answered: not "handshake
    # timed out" after 10 s, nor "a frame must be an array".
    with trio.fail_after(5):  # the handshake timeout is 10 s: this must not be it
        with pytest.raises(rsnet.HandshakeError, match="answered in HTTP, not the rsnet protocol"):
            async with rsnet.connect(f"tcp://127.0.0.1:{endpoint.port}"):
                pass
    refused = await exchange(endpoint.port, b"\x93\x00\xa5rsnet", close=True)
    assert refused.startswith(b"HTTP/1.1 400")


def test_the_endpoint_serves_a_small_share_of_the_descriptors():
    # At a low descriptor limit its 64 + 8 sockets came on top of the listeners' half and the
    # topics' eighth: at 128 descriptors a flood of it and of the TCP listener left durable
    # topics none (14 of 60 publishes stored).
    assert [connection_budget(n) for n in (64, 128, 1024, 1 << 20)] == [2, 4, 32, 64]


async def test_metrics_are_encoded_in_a_worker_thread_at_most_once_a_second_per_format(mock_clock):
    # Encoded in the event loop, 5,000 topics' metrics (2.4 MB) held every connection 0.45 s
    # per scrape, and four scrapers in a loop raised another client's p50 from 2 to 310 ms.
    metrics = BrokerMetrics()
    in_main_thread: list[bool] = []

    class Probe:
        def describe(self) -> list:
            return []

        def collect(self) -> list:
            in_main_thread.append(threading.current_thread() is threading.main_thread())
            return []

    metrics.registry.register(Probe())  # type: ignore[arg-type]  # a collector by duck typing
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_http, metrics, "127.0.0.1", 0, lambda: {"healthy": True})
        port = listeners[0].socket.getsockname()[1]
        for _ in range(3):
            assert (await get(port, "/metrics"))[0] == 200
        assert in_main_thread == [False]  # once, off the event loop
        assert (await get(port, "/metrics", extra="accept: application/openmetrics-text\r\n"))[0] == 200
        mock_clock.jump(RENDER_REUSE_S)
        assert (await get(port, "/metrics"))[0] == 200
        assert in_main_thread == [False, False, False]
        nursery.cancel_scope.cancel()
