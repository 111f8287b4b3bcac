"""The scenarios of issues 6, 11 and 13, as rows: one row is one thing measured on every system.

A row has a client ``kind`` (what the client process does, see :mod:`benchmarks.systems`),
a transport, its parameters (full and ``--quick`` sizes), and how its raw result becomes
metrics. Item counts may differ per system so that each run takes a second or a few: rates
are per second, and the count is printed next to each number.

Kinds and their parameters:

- ``stream``: one stream of ``count`` items of ``size`` bytes, ``prefetch`` demand window
  (None: rsnet's default, adaptive demand; the ceiling grants everything up front); ``pace`` > 0
  makes a slow consumer (items/s).
- ``stop_and_wait``: one stream, request(1) per item.
- ``first_item``: ``iterations`` times: open a stream of one item, time to its item.
- ``many_streams``: ``streams`` concurrent streams of ``items`` items on one connection.
- ``many_connections``: ``connections`` concurrent connections, one stream of ``items`` each.
- scenario 6 (``rsnet`` and ``rsnet-js``): ``stream`` again, read by the Python client and by the
  Node one from the same server: the ratio is the Node client's advantage (``subject``).
- ``fanout`` (scenarios 5 and 7, brokers only): ``subscribers`` subscriptions over
  ``connections`` connections (at most ``FANOUT_CONNECTIONS``, 10) from the earliest offset
  with ``prefetch``, one producer publishing ``count`` records of ``size``
  bytes to the broker; the broker's ``storage`` and ``fsync`` are server parameters.
- ``publish`` (scenario 7): one producer publishes ``count`` records and waits for every
  acknowledgement; ``replay``: ``count`` records stored first (not timed), one subscriber reads
  them all from the start; ``latency``: a producer paced at ``rate`` records/s for ``seconds``,
  one subscriber measuring publish -> delivery for every record. A latency row's ``rate`` is
  ``rate_from``: a fraction of the same system's rate in another row, in the same run (or of
  ``rate_system``'s, for every system of the row: the same pace for all).
- ``live_connections`` (scenario 8): ``connections`` connections to one server, each with an open
  stream (demand 1, the first item received) at once; the client reads the server's memory
  (RSS from /proc, and tracemalloc's count when the server traces) before and with them all live.

See :mod:`benchmarks.systems.broker` and :mod:`benchmarks.systems.jetstream` for exactly what
the brokers' clients do, and what an acknowledgement means for each.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .systems import PEERS, broker

PREFETCH = 4096
"""The "realistic prefetch" of issue 6: demand granted 4096 up front, then 3072 at a time."""

MIB_ITEM = 1024 * 1024 - 64
"""A "1 MiB" item: as large as fits one frame under the default max_frame_size."""


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool = True


ITEMS_S = Metric("items_per_s", "items/s", "items/s")
MB_S = Metric("mb_per_s", "MB/s", "MB/s")
US_ITEM = Metric("us_per_item", "µs per item", "µs", higher_is_better=False)
P50 = Metric("p50_us", "p50", "µs", higher_is_better=False)
P99 = Metric("p99_us", "p99", "µs", higher_is_better=False)
P999 = Metric("p999_us", "p99.9", "µs", higher_is_better=False)
SERVED = Metric("served", "served", "connections")
PER_CONN_KIB = Metric("server_kib_per_conn", "server RSS per connection", "KiB", higher_is_better=False)
TRACED_KIB = Metric("server_traced_kib_per_conn", "server traced per connection", "KiB", higher_is_better=False)
CPU_CONN = Metric("server_cpu_us_per_conn", "server CPU per connection", "µs", higher_is_better=False)
SETUP_S = Metric("setup_s", "all live after", "s", higher_is_better=False)
SECONDS = Metric("seconds", "total", "s", higher_is_better=False)
DELIVERIES_S = Metric("deliveries_per_s", "deliveries/s", "deliveries/s")
RECORDS_S = Metric("records_per_s", "records/s", "records/s")
CPU_SERVER = Metric("server_cpu_us", "server CPU per item", "µs", higher_is_better=False)
CPU_CLIENT = Metric("client_cpu_us", "client CPU per item", "µs", higher_is_better=False)
SERVER_PEAK = Metric("server_peak_mib", "server peak RSS", "MiB", higher_is_better=False)
SERVER_STEADY = Metric("server_steady_mib", "server steady RSS", "MiB", higher_is_better=False)
SERVER_DRIFT = Metric("server_drift_mib", "server drift", "MiB", higher_is_better=False)
CLIENT_PEAK = Metric("client_peak_mib", "client peak RSS", "MiB", higher_is_better=False)
CLIENT_STEADY = Metric("client_steady_mib", "client steady RSS", "MiB", higher_is_better=False)
CLIENT_DRIFT = Metric("client_drift_mib", "client drift", "MiB", higher_is_better=False)


@dataclass(frozen=True)
class Row:
    """One measured thing, on every system of ``systems``."""

    id: str
    scenario: int
    title: str
    kind: str
    transport: str
    params: dict[str, Any]
    metrics: tuple[Metric, ...]
    per_system: dict[str, dict[str, Any]] = field(default_factory=dict)  # parameter overrides
    server_params: dict[str, Any] = field(default_factory=dict)  # keyword arguments of serve()
    timeout: float = 120.0
    max_runs: int | None = None  # memory rows: one long run is enough
    chart: bool = True  # plotted as throughput (items/s)
    systems: tuple[str, ...] = PEERS
    rate_from: tuple[str, float] | None = None  # (row id, fraction): params["rate"] from that row, same run
    rate_system: str | None = None  # whose rate in rate_from's row paces every system (None: each its own)
    subject: str = "rsnet"  # the ratios are its advantage over each other system of the row

    @property
    def primary(self) -> Metric:
        return self.metrics[0]

    def params_for(self, system: str) -> dict[str, Any]:
        return {**self.params, **self.per_system.get(system, {})}

    def expected_items(self, params: dict[str, Any]) -> int | None:
        if self.kind in ("stream", "stop_and_wait"):
            return params["count"]
        if self.kind == "many_streams":
            return params["streams"] * params["items"]
        if self.kind == "many_connections":
            return params["connections"] * params["items"]
        if self.kind == "fanout":
            return params["subscribers"] * params["count"]
        if self.kind in ("publish", "replay"):
            return params["count"]
        if self.kind == "live_connections":
            return params["connections"] * params["items"]
        return None


TRANSPORTS = {"tcp": "TCP", "ws": "WebSocket"}


def build(quick: bool) -> list[Row]:
    """The rows of every scenario (scenario 5, the broker, comes from :func:`broker_rows`)."""
    q = quick
    rows: list[Row] = []
    for transport, name in TRANSPORTS.items():
        # About a second a row for rsnet: shorter rows (0.2 s) moved the WebSocket ÷ TCP ratios
        # of target 5 by ±15% run to run.
        for size, label, fast_count, peer_count in (
            (16, "16 B", 4_000_000, 50_000),
            (1024, "1 KiB", 1_000_000, 50_000),
        ):
            rows.append(
                Row(
                    id=f"s1-{size}-{transport}",
                    scenario=1,
                    title=f"one stream, {label} items, {name}",
                    kind="stream",
                    transport=transport,
                    params={"count": 20_000 if q else fast_count, "size": size, "prefetch": PREFETCH},
                    per_system={"rsocket-py": {"count": 2_000 if q else peer_count}},
                    metrics=(ITEMS_S, MB_S, CPU_SERVER, CPU_CLIENT),
                )
            )
    # Default against tuned demand (issue 13, target 2): prefetch None is what an application
    # gets that never sets one (adaptive demand within a 4 MiB budget); the rows above are the
    # tuned 4096. rsocket-py has no such default: it gets 256. The ceiling has no window to vary.
    for transport, name in TRANSPORTS.items():
        for size, label, fast_count in ((16, "16 B", 4_000_000), (1024, "1 KiB", 1_000_000)):
            with_peer = size == 16 and transport == "tcp"
            rows.append(
                Row(
                    id=f"s1-{size}-{transport}-default",
                    scenario=1,
                    title=f"one stream, {label} items, {name}, prefetch not set (rsnet's default"
                    + ("; rsocket-py: 256)" if with_peer else ")"),
                    kind="stream",
                    transport=transport,
                    params={"count": 20_000 if q else fast_count, "size": size, "prefetch": None},
                    per_system={"rsocket-py": {"count": 2_000 if q else 50_000, "prefetch": 256}},
                    metrics=(ITEMS_S, MB_S, CPU_SERVER, CPU_CLIENT),
                    systems=("rsnet", "rsocket-py") if with_peer else ("rsnet",),
                )
            )
    rows.append(
        Row(
            id="s1-1mib-tcp-default",
            scenario=1,
            title="one stream, 1 MiB items, TCP, prefetch not set (rsnet's default): client memory",
            kind="stream",
            transport="tcp",
            # 1 MiB less 64 bytes: an item and its frame fit the default max_frame_size (1 MiB).
            params={"count": 20 if q else 300, "size": MIB_ITEM, "prefetch": None},
            metrics=(ITEMS_S, MB_S, CLIENT_PEAK, CPU_CLIENT),
            systems=("rsnet",),
            chart=False,
        )
    )
    for transport, name in TRANSPORTS.items():
        rows.append(
            Row(
                id=f"s2-saw-{transport}",
                scenario=2,
                title=f"stop-and-wait request(1), {name}",
                kind="stop_and_wait",
                transport=transport,
                params={"count": 300 if q else 5_000, "size": 16},
                metrics=(ITEMS_S, US_ITEM),
            )
        )
    for transport, name in TRANSPORTS.items():
        rows.append(
            Row(
                id=f"s2-rtt-{transport}",
                scenario=2,
                title=f"round trip: subscribe to first item, {name}",
                kind="first_item",
                transport=transport,
                params={"iterations": 50 if q else 2_000, "size": 16},
                metrics=(P50, P99, P999),
                chart=False,
            )
        )
    for transport, name in TRANSPORTS.items():
        rows.append(
            Row(
                id=f"s3-streams-{transport}",
                scenario=3,
                title=f"{'100' if q else '1,000'} streams x 100 items, one connection, {name}",
                kind="many_streams",
                transport=transport,
                params={"streams": 100 if q else 1_000, "items": 100, "size": 16, "prefetch": PREFETCH},
                metrics=(SECONDS, ITEMS_S, CPU_SERVER, CPU_CLIENT),
            )
        )
    for transport, name in TRANSPORTS.items():
        rows.append(
            Row(
                id=f"s3-conns-{transport}",
                scenario=3,
                title=f"{'50' if q else '1,000'} connections x 1 stream of 100 items, {name}",
                kind="many_connections",
                transport=transport,
                params={"connections": 50 if q else 1_000, "items": 100, "size": 16, "prefetch": PREFETCH},
                metrics=(SECONDS, ITEMS_S, CPU_SERVER, CPU_CLIENT),
            )
        )
    rows.append(
        Row(
            id="s4-slow-tcp",
            scenario=4,
            title=f"slow consumer, {'20,000' if q else '1,000,000'} items of 16 B paced at 100k items/s, TCP",
            kind="stream",
            transport="tcp",
            params={"count": 20_000 if q else 1_000_000, "size": 16, "prefetch": PREFETCH, "pace": 100_000},
            # rsocket-py moves 15-30k items/s: 100k/s would not be slow for it, and 1,000,000 items
            # would take a minute. It gets a pace below its own speed, and fewer items.
            per_system={"rsocket-py": {"count": 2_000 if q else 50_000, "pace": 5_000}},
            metrics=(SERVER_PEAK, SERVER_STEADY, SERVER_DRIFT, CLIENT_PEAK, CLIENT_STEADY, CLIENT_DRIFT, ITEMS_S),
            timeout=180.0,
            max_runs=1,
            chart=False,
        )
    )
    rows += broker_rows(quick)
    # Tuned (prefetch 4096) and default demand (prefetch not set: both clients' adaptive demand,
    # the same policy), so "fast by default" is measured for Node too; and each client's
    # Reactive Streams Subscriber, which requests by hand with the prefetch rule (no iterator:
    # Node's `for await` costs a promise and a microtask per item, ~100 ns). Each client first
    # reads a warm-up stream the same way, untimed (V8 compiles the hot path while it runs,
    # the way a JVM benchmark warms up), except in the cold rows: a client's first stream.
    for transport, name in TRANSPORTS.items():
        for suffix, prefetch, api, warm, how in (
            ("", PREFETCH, "iterator", True, ""),
            ("-default", None, "iterator", True, ", prefetch not set (default)"),
            ("-subscriber", PREFETCH, "subscriber", True, ", a Subscriber's on_next/onNext"),
            ("-cold", PREFETCH, "iterator", False, ", the client's first stream (no warm-up)"),
        ):
            rows.append(
                Row(
                    id=f"s6-js-16-{transport}{suffix}",
                    scenario=6,
                    title=f"one stream, 16 B items, {name}{how}: Node client vs Python client",
                    kind="stream",
                    transport=transport,
                    params={
                        "count": 20_000 if q else 1_000_000,
                        "size": 16,
                        "prefetch": prefetch,
                        "api": api,
                        "warmup": (2_000 if q else JS_WARMUP) if warm else 0,
                    },
                    metrics=(ITEMS_S, MB_S, CPU_SERVER, CPU_CLIENT),
                    systems=("rsnet", "rsnet-js"),
                    subject="rsnet-js",
                )
            )
    rows += jetstream_rows(quick)
    rows += connection_rows(quick)
    if quick:
        rows = [Row(**{**row.__dict__, "timeout": 30.0}) for row in rows]
    return rows


JS_WARMUP = 500_000
"""Items of the untimed stream each client reads before a scenario 6 row's (Node runs its first
~300,000 items at about half its steady rate while V8 compiles; CPython needs none, and gets the
same)."""

FANOUT_CONNECTIONS = 10
"""Subscribers share at most this many connections (issue 13: 100 subscribers over 10)."""

FANOUT_COUNTS = {
    # subscribers: (records per run, --quick records); deliveries = records x subscribers.
    1: (200_000, 5_000),
    10: (50_000, 1_000),
    100: (20_000, 200),
}
"""Records published per run: a second or a few per run at the broker's speed on this machine
(at 100 subscribers, 5,000 records took half a second, and runs swung from 470k to 930k
deliveries/s one after the other)."""


def _subscribers(count: int) -> str:
    connections = min(count, FANOUT_CONNECTIONS)
    if count == 1:
        return "1 subscriber"
    return f"{count} subscribers ({connections} connections)"


def broker_rows(quick: bool) -> list[Row]:
    """Scenario 5: one producer to 1, 10 and 100 subscribers, for each kind of topic, each
    subscriber an ``async for``; and to 100, in memory and under ``interval``, taking the
    arrays shape (``items: "arrays"``, [offset, timestamp, value]: half the decoding for
    subscribers that know their topic, the bytes shared at the head as the maps' are), and
    as Reactive Streams Subscribers (no task, no iteration: the client process, which bounds
    the ``async for`` rows at 100 subscribers, does less per delivery)."""
    groups = [
        (storage, fsync, where, count, "maps", "iterator")
        for storage, fsync, where in broker.STORAGE
        for count in broker.SUBSCRIBERS
    ]
    groups += [
        (storage, fsync, where, 100, shape, api)
        for shape, api in (("arrays", "iterator"), ("maps", "subscriber"))
        for storage, fsync, where in broker.STORAGE
        if fsync in (None, "interval")
    ]
    rows = []
    for storage, fsync, where, subscribers, shape, api in groups:
        full, small = FANOUT_COUNTS[subscribers]
        arrays, plain = shape == "arrays", api == "subscriber"
        rows.append(
            Row(
                id=f"s5-{fsync or storage}-{subscribers}"
                + ("-arrays" if arrays else "")
                + ("-subscriber" if plain else ""),
                scenario=5,
                title=f"1 producer to {_subscribers(subscribers)}"
                + (" taking arrays" if arrays else "")
                + (" (Subscribers)" if plain else "")
                + f", {where}",
                kind="fanout",
                transport="tcp",
                params={
                    "subscribers": subscribers,
                    "connections": min(subscribers, FANOUT_CONNECTIONS),
                    "count": small if quick else full,
                    "size": 16,
                    "prefetch": PREFETCH,
                    "items": shape,
                    "api": api,
                },
                server_params={"storage": storage, "fsync": fsync},
                metrics=(DELIVERIES_S, RECORDS_S, MB_S, CPU_SERVER, CPU_CLIENT),
                chart=False,
                systems=("rsnet-broker",),
            )
        )
    return rows


def select(rows: list[Row], only: list[str]) -> list[Row]:
    """The rows whose id starts with one of ``only`` (all if empty), with the rows they take
    their rate from (a latency row paces at a fraction of another row's rate, same run)."""
    if not only:
        return rows
    wanted = {r.id for r in rows if r.id.startswith(tuple(only))}
    wanted |= {r.rate_from[0] for r in rows if r.id in wanted and r.rate_from is not None}
    return [r for r in rows if r.id in wanted]


RECORD = 100
"""Bytes per record in scenario 7 (rsnet's broker against JetStream)."""

JETSTREAM_COUNTS = {
    # row: (rsnet-broker records, jetstream records, --quick records): a second or a few per run.
    "publish": (300_000, 100_000, 2_000),
    1: (200_000, 50_000, 1_000),
    10: (30_000, 20_000, 500),
    100: (3_000, 2_000, 100),
    "replay": (1_000_000, 1_000_000, 20_000),
}
LATENCY_SECONDS = (5.0, 1.0)
"""How long a latency row's producer publishes (full, --quick)."""

BROKERS = ("rsnet-broker", "jetstream")
POLICIES = {
    "always": ("always", {}, "fsync always (rsnet's default)"),
    "interval": ("interval", {}, "fsync interval (100 ms)"),
    "interval-25ms": ("interval", {"fsync_interval": 0.025}, "fsync interval of 25 ms"),
    "never": ("never", {}, "fsync never (JetStream's guarantee)"),
}
"""Scenario 7's policies: row suffix -> (rsnet's fsync, more server parameters, title). Under
``interval`` subscribers see a record once the periodic sync has stored it, so the latency rows
show the interval itself: at 100 ms (the broker's default) and at 25 ms, side by side."""


def jetstream_rows(quick: bool) -> list[Row]:
    """Scenario 7: rsnet's broker (durable topics) against NATS JetStream (file storage), 100 B records.

    Every row names rsnet's fsync policy; JetStream's acknowledgement is the same in every row
    (written to its file store, not fsynced: see :mod:`benchmarks.systems.jetstream`), which is
    rsnet's ``never``. rsnet's subscribers use rsnet's default prefetch, JetStream's its ordered
    consumer's defaults: what a Python application gets without tuning.
    """
    q = quick

    def counts(key: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        mine, theirs, small = JETSTREAM_COUNTS[key]
        return {"count": small if q else mine}, {"jetstream": {"count": small if q else theirs}}

    def broker_row(id: str, title: str, kind: str, policy: str, params: dict[str, Any], **more: Any) -> Row:
        fsync, server, _ = POLICIES[policy]
        return Row(
            id=id,
            scenario=7,
            subject="rsnet-broker",
            title=title,
            kind=kind,
            transport="tcp",
            params={"size": RECORD, "storage": "file", **params},
            server_params={"storage": "durable", "fsync": fsync, **server},
            chart=False,
            systems=BROKERS,
            **more,
        )

    rows = []
    for fsync in ("always", "interval", "never"):
        params, per_system = counts("publish")
        rows.append(
            broker_row(
                f"s7-publish-{fsync}",
                f"publish with acknowledgement, 1 producer, rsnet {POLICIES[fsync][2]}",
                "publish",
                fsync,
                params,
                per_system=per_system,
                metrics=(RECORDS_S, CPU_SERVER, CPU_CLIENT),
            )
        )
    fanouts = ((1, "always"), (10, "always"), (100, "always"), (1, "interval"), (1, "interval-25ms"), (1, "never"))
    for subscribers, policy in fanouts:
        params, per_system = counts(subscribers)
        rows.append(
            broker_row(
                f"s7-fanout-{subscribers}" + ("" if policy == "always" else f"-{policy}"),
                f"1 producer to {_subscribers(subscribers)}, rsnet {POLICIES[policy][2]}",
                "fanout",
                policy,
                {**params, "subscribers": subscribers, "connections": min(subscribers, FANOUT_CONNECTIONS)},
                per_system=per_system,
                metrics=(DELIVERIES_S, RECORDS_S, CPU_SERVER, CPU_CLIENT),
            )
        )
    params, per_system = counts("replay")
    rows.append(
        broker_row(
            "s7-replay",
            f"replay {params['count']:,} stored records to 1 subscriber",
            "replay",
            "never",  # only the filling (not timed) depends on it
            params,
            per_system=per_system,
            metrics=(RECORDS_S, CPU_SERVER, CPU_CLIENT),
            timeout=240.0,
        )
    )
    # ``never`` is JetStream's own guarantee; under ``always`` and ``interval`` rsnet shows a
    # record only once synced (its offset could otherwise be given again after an OS crash).
    for policy in ("always", "interval", "interval-25ms", "never"):
        rows.append(
            broker_row(
                f"s7-latency-{policy}",
                f"latency publish -> subscriber at half the max rate, rsnet {POLICIES[policy][2]}",
                "latency",
                policy,
                {"seconds": LATENCY_SECONDS[1] if q else LATENCY_SECONDS[0]},
                # The max rate of a producer with one subscriber (publishing alone is faster, and
                # half of that can be more than the pair sustains: the backlog would be measured).
                rate_from=("s7-fanout-1" + ("" if policy == "always" else f"-{policy}"), 0.5),
                metrics=(P99, P50, P999, RECORDS_S, CPU_SERVER, CPU_CLIENT),
            )
        )
    # Each system above runs at half its own max rate: rsnet's is several times JetStream's. The
    # same guarantee at the same pace (JetStream's) separates the load from the system.
    rows.append(
        broker_row(
            "s7-latency-never-same-rate",
            f"latency publish -> subscriber at JetStream's half max rate for both, rsnet {POLICIES['never'][2]}",
            "latency",
            "never",
            {"seconds": LATENCY_SECONDS[1] if q else LATENCY_SECONDS[0]},
            rate_from=("s7-fanout-1-never", 0.5),
            rate_system="jetstream",
            metrics=(P99, P50, P999, RECORDS_S, CPU_SERVER, CPU_CLIENT),
        )
    )
    return rows


LIVE_CONNECTIONS = (10_000, 200)
"""Scenario 8's connections (full, --quick): issue 13's "10,000 concurrent connections"."""
TRACED_CONNECTIONS = (1_000, 50)


def connection_rows(quick: bool) -> list[Row]:
    """Scenario 8: connections at scale, one server process, each connection with a live stream."""
    rows = []
    for n, traced in (
        (LIVE_CONNECTIONS[1] if quick else LIVE_CONNECTIONS[0], False),
        (TRACED_CONNECTIONS[1] if quick else TRACED_CONNECTIONS[0], True),
    ):
        rows.append(
            Row(
                id=f"s8-live-{n}" + ("-traced" if traced else ""),
                scenario=8,
                title=f"{n:,} connections, each with a live stream, one server"
                + (" (server under tracemalloc)" if traced else ""),
                kind="live_connections",
                transport="tcp",
                params={"connections": n, "items": 2, "size": 16, **({"traced": True} if traced else {})},
                server_params={"tracemalloc": True} if traced else {},
                metrics=(TRACED_KIB, PER_CONN_KIB, SERVED, SETUP_S, CPU_CONN)
                if traced
                else (PER_CONN_KIB, SERVED, SETUP_S, CPU_CONN),
                chart=False,
                systems=("rsnet", "ceiling"),
                timeout=240.0,
                max_runs=1 if traced else None,  # tracemalloc counts bytes, not time: one run says it
            )
        )
    return rows


# -- metrics from one run's raw numbers ---------------------------------------------------------------


def _memory(samples: list[tuple[float, float]], prefix: str) -> dict[str, float]:
    """Peak, steady (median of the second half of the run) and drift (last tenth minus the
    tenth at mid-run: how much it still grew while streaming) of an RSS series."""
    if not samples:
        return {}
    values = [mib for _, mib in samples]
    n = len(values)
    tenth = max(1, n // 10)
    mid = values[n // 2 - tenth // 2 : n // 2 - tenth // 2 + tenth] or values[-tenth:]
    return {
        f"{prefix}_peak_mib": max(values),
        f"{prefix}_steady_mib": statistics.median(values[n // 2 :]),
        f"{prefix}_drift_mib": statistics.mean(values[-tenth:]) - statistics.mean(mid),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def metrics_of(
    row: Row,
    result: dict[str, Any],
    rss: dict[str, list[tuple[float, float]]],
    params: dict[str, Any],
    server_cpu_s: float,
) -> dict[str, float]:
    """Turn a client's raw result (the RSS series, the server's CPU time while the client
    ran) into this row's metrics. The server's CPU is per item it sent: the timed ones and
    those of an untimed warm-up stream (``warmup_items``), which it sent while the client ran."""
    out: dict[str, float] = {}
    if result.get("items"):
        out["server_cpu_us"] = server_cpu_s / (result["items"] + result.get("warmup_items", 0)) * 1e6
        if "cpu_s" in result:
            out["client_cpu_us"] = result["cpu_s"] / result["items"] * 1e6
    if "latencies_us" in result:
        latencies = result["latencies_us"]
        out["p50_us"] = statistics.median(latencies)
        out["p99_us"] = percentile(latencies, 0.99)
        out["p999_us"] = percentile(latencies, 0.999)
    if "items" in result and result.get("seconds"):
        seconds = result["seconds"]
        out["items_per_s"] = result["items"] / seconds
        out["mb_per_s"] = result["items"] * params["size"] / seconds / 1e6
        out["us_per_item"] = seconds / result["items"] * 1e6 if result["items"] else float("nan")
        out["seconds"] = seconds
        if row.kind == "fanout":
            out["deliveries_per_s"] = out["items_per_s"]
            out["records_per_s"] = params["count"] / seconds
        elif row.kind in ("publish", "replay", "latency"):
            out["records_per_s"] = out["items_per_s"]
    if row.kind == "live_connections" and result.get("served") and "server_rss_live_mib" in result:
        served = result["served"]
        out["served"] = served
        out["setup_s"] = result["setup_s"]
        out["server_kib_per_conn"] = (result["server_rss_live_mib"] - result["server_rss_base_mib"]) * 1024 / served
        if "server_traced_live" in result:
            out["server_traced_kib_per_conn"] = (
                (result["server_traced_live"] - result["server_traced_base"]) / 1024 / served
            )
        out["server_cpu_us_per_conn"] = server_cpu_s / served * 1e6
    out.update(_memory(rss.get("server", []), "server"))
    out.update(_memory(rss.get("client", []), "client"))
    return out


def check(row: Row, result: dict[str, Any], params: dict[str, Any]) -> str | None:
    """What is wrong with a client's result, if anything (e.g. items lost)."""
    expected = row.expected_items(params)
    if expected is not None and result.get("items") != expected:
        return f"received {result.get('items')} items, expected {expected}"
    if row.kind == "first_item" and len(result.get("latencies_us", [])) != params["iterations"]:
        return "missing latency samples"
    if row.kind == "live_connections" and result.get("served") != params["connections"]:
        return f"served {result.get('served')} of {params['connections']} connections: {result.get('failure', '')}"
    return None
