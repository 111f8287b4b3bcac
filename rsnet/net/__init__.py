"""The trio shells around the sans-I/O protocol: one connection (``session``), the server that
accepts them (``server``) and the client that dials them (``client``).

Layering: imports the streams core, the protocol, the transports and ``rsnet.errors``; never the
broker, the CLI or the blocking client.
"""
