"""rsnet's benchmark suite: rsnet against its peers, side by side, in one run (issue 6).

    python -m benchmarks run [--quick] [--json out.json] [--runs N] [--only SCENARIO ...]

Every measurement starts a fresh server process and a separate client process over
127.0.0.1 (see :mod:`benchmarks.runner`), for each system (:mod:`benchmarks.systems`):

- ``rsnet``: this project's server and client;
- ``rsocket-py``: the ``rsocket`` package from PyPI, the RSocket implementation for Python;
- ``ceiling``: a minimal trio program that sends pre-framed msgpack frames with batched writes,
  so rsnet / ceiling shows how much room is left;
- ``rsnet-broker``: scenario 5 only, rsnet's broker fanning one producer out to 1, 10 and 100
  subscribers, on an in-memory topic and on a durable one under each fsync policy.

The scenarios are in :mod:`benchmarks.scenarios`; the suite (:mod:`benchmarks.suite`) runs
them round-robin, ``runs`` times, and :mod:`benchmarks.report` writes ``RESULTS.md`` and a
chart. Nothing here asserts on timings: ``--quick`` exists so CI keeps the suite working.
"""
