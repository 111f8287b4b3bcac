"""The systems under test. Each module has the same two entry points, run in their own process
by :mod:`benchmarks.worker`:

- ``serve(transport, ready)``: listen on 127.0.0.1 (an ephemeral port), call ``ready(port)``,
  then serve until the process is killed;
- ``run_client(kind, transport, port, params, deadline) -> dict``: run one client measurement
  (see :mod:`benchmarks.scenarios` for the kinds and their parameters) and return its raw
  numbers.

Every server publishes the same thing: a stream named ``items`` of ``count`` copies of a
``size``-byte binary payload, parameters sent by the subscriber.

- :mod:`.ceiling`: pre-framed msgpack over a trio socket with batched writes (no rsnet code);
- :mod:`.rsocket_peer`: rsocket-py on asyncio (TCP: its asyncio transport; WebSocket: aiohttp);
- :mod:`.rsnet_system`: rsnet's ``Server`` and ``connect``;
- :mod:`.rsnet_js` (``rsnet-js``): scenario 6 only, rsnet's JavaScript client in Node against
  :mod:`.rsnet_system`'s server; reported "not available" without node or ``client/js/node_modules``;
- :mod:`.broker` (``rsnet-broker``): scenarios 5 and 7, rsnet's broker (its server takes
  ``storage`` and ``fsync``; client kinds ``fanout``, ``publish``, ``replay``, ``latency``);
  reported "not available" if ``rsnet.broker`` cannot be imported;
- :mod:`.jetstream` (``jetstream``): scenario 7, NATS JetStream (``nats-server``) driven by
  nats-py, the same client kinds; reported "not available" without ``nats-server`` or nats-py.
"""

PEERS = ("rsnet", "rsocket-py", "ceiling")
"""The systems compared side by side in scenarios 1-4."""

SYSTEMS = (*PEERS, "rsnet-js", "rsnet-broker", "jetstream")

MODULES = {
    "rsnet": "benchmarks.systems.rsnet_system",
    "rsocket-py": "benchmarks.systems.rsocket_peer",
    "ceiling": "benchmarks.systems.ceiling",
    "rsnet-js": "benchmarks.systems.rsnet_js",
    "rsnet-broker": "benchmarks.systems.broker",
    "jetstream": "benchmarks.systems.jetstream",
}
