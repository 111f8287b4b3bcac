"""rsnet's benchmark suite: rsnet against its peers, side by side, in one run (issues 6 and 13).

    python -m benchmarks run [--quick] [--json out.json] [--runs N] [--only SCENARIO ...]
    python -m benchmarks profile ROW [--system S]     # a flame graph of the server (py-spy)

Every measurement starts a fresh server process and a separate client process over
127.0.0.1 (see :mod:`benchmarks.runner`), for each system (:mod:`benchmarks.systems`):

- ``rsnet``: this project's server and client;
- ``rsocket-py``: the ``rsocket`` package from PyPI, the RSocket implementation for Python;
- ``ceiling``: a minimal trio program that sends pre-framed msgpack frames with batched writes,
  so rsnet / ceiling shows how much room is left;
- ``rsnet-broker``: scenarios 5 and 7, rsnet's broker: one producer fanned out to 1, 10 and 100
  subscribers, in memory and durable under each fsync policy; acknowledged publishing, replay,
  publish -> subscriber latency;
- ``jetstream``: scenario 7, NATS JetStream (``nats-server``, Debian's package) driven by
  nats-py: the broker a Python application would pick instead, on the same rows.

Scenario 8 opens 10,000 connections to one server, each with a live stream, and reads the
server's memory per connection (RSS, and tracemalloc in a traced row).

The scenarios are in :mod:`benchmarks.scenarios`; the suite (:mod:`benchmarks.suite`) runs
them round-robin, ``runs`` times, and :mod:`benchmarks.report` writes ``RESULTS.md`` and a
chart. Nothing here asserts on timings: ``--quick`` exists so CI keeps the suite working.
"""
