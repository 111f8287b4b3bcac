"""The broker's live view: a page served by its HTTP endpoint (the metrics port), no build step.

    live = LiveView(websocket=Endpoint("ws", "127.0.0.1", 7601), auth=False)
    await nursery.start(serve_http, metrics, "127.0.0.1", 9100, health, live=live.respond)
    # then open http://127.0.0.1:9100/

The page (``static/index.html``, ``live.js``, ``live.css``) runs rsnet's JavaScript client in
the browser (``static/rsnet-client.js``: the client of ``client/js/src`` and msgpackr bundled
into one ES module by ``client/js/scripts/bundle.mjs``, committed, and checked against its
sources by the client's tests). It lists the topics with their rates and lag (``$topics``),
subscribes to the one clicked, and shows its recent records, its delivered rate and a demand
control; on a ``backpressure`` topic lowering the demand slows the producer.

The page learns where the broker's WebSocket endpoint is from ``/live/config.json``:
``{"websocket": {"scheme", "host", "port"} or null, "auth": bool}``; ``host`` is null when the
broker listens on every address, and the page then uses its own host name. The user can
override it (``?broker=ws://...`` or the page's form), and give a token when ``auth`` is on.

What is served, and only that: the fixed :data:`ROUTES` (exact paths; a query string is
ignored), read once from the package when the :class:`LiveView` is made; no request path ever
reaches the file system, so there is nothing to traverse. Each file is at most
:data:`MAX_FILE` bytes (checked on loading), so every response is bounded. Responses carry
their content type, ``x-content-type-options: nosniff``, a content security policy that allows
scripts and styles from this origin only and connections to WebSockets, and an ETag
(``If-None-Match`` gets a 304).

This module imports nothing from the rest of the broker: :mod:`rsnet.broker.metrics` serves
what :meth:`LiveView.respond` answers.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
from dataclasses import dataclass

Headers = list[tuple[bytes, bytes]]
Response = tuple[int, Headers, bytes]

MAX_FILE = 1 << 20
"""Largest file the live view serves, in bytes (the bundled client is about 120 KiB)."""

ROUTES: dict[bytes, tuple[str, bytes]] = {
    b"/": ("index.html", b"text/html; charset=utf-8"),
    b"/live/live.js": ("live.js", b"text/javascript; charset=utf-8"),
    b"/live/live.css": ("live.css", b"text/css; charset=utf-8"),
    b"/live/rsnet-client.js": ("rsnet-client.js", b"text/javascript; charset=utf-8"),
}
"""Request path -> (file in ``rsnet/broker/static/``, content type): the whole allow-list."""

CONFIG_PATH = b"/live/config.json"

SECURITY_HEADERS: Headers = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self' ws: wss:;"
        b" img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
]


@dataclass(frozen=True)
class Endpoint:
    """Where the page's WebSocket goes: ``scheme`` ``ws`` or ``wss``; ``host`` None for "the
    host the page was loaded from" (the broker listens on every address)."""

    scheme: str
    host: str | None
    port: int


class LiveView:
    """The live view's files and configuration, answered by :meth:`respond`."""

    def __init__(self, websocket: Endpoint | None, auth: bool) -> None:
        static = importlib.resources.files(__package__ or "rsnet.broker") / "static"
        self._files: dict[bytes, tuple[bytes, Headers, bytes]] = {}  # path -> body, headers, etag
        for path, (name, content_type) in ROUTES.items():
            self._add(path, static.joinpath(name).read_bytes(), content_type, name)
        config = {
            "websocket": None if websocket is None else vars(websocket),
            "auth": auth,
        }
        self._add(CONFIG_PATH, json.dumps(config).encode() + b"\n", b"application/json", "config.json")

    def _add(self, path: bytes, body: bytes, content_type: bytes, name: str) -> None:
        if len(body) > MAX_FILE:
            raise ValueError(f"the live view's {name} is {len(body)} bytes, over the {MAX_FILE}-byte bound")
        etag = b'"' + hashlib.sha256(body).hexdigest()[:20].encode() + b'"'
        headers = [
            (b"content-type", content_type),
            (b"cache-control", b"no-cache"),  # revalidate: a new broker may ship a new page
            (b"etag", etag),
            *SECURITY_HEADERS,
        ]
        self._files[path] = (body, headers, etag)

    @property
    def paths(self) -> list[bytes]:
        """Every path served (the allow-list and the configuration)."""
        return list(self._files)

    def respond(self, path: bytes, if_none_match: bytes | None = None) -> Response | None:
        """The response to ``GET path`` (query string already removed), or None when the path
        is not the live view's. ``if_none_match`` is the request's header of that name."""
        found = self._files.get(path)
        if found is None:
            return None
        body, headers, etag = found
        if if_none_match is not None and etag in (tag.strip() for tag in if_none_match.split(b",")):
            return 304, headers, b""
        return 200, headers, body
