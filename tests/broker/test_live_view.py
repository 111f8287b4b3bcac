"""The live view the broker serves on its HTTP (metrics) port: exactly its allow-list of files,
with their content types and security headers, the page's configuration, and packaging.

The page itself runs in Chromium in client/js/test/browser.test.js (through tests/js/).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import pathlib
import subprocess
import sys
import time
import tomllib
import urllib.request
from types import SimpleNamespace

import pytest

from rsnet.broker.live import CONFIG_PATH, MAX_FILE, ROUTES, Endpoint, LiveView
from rsnet.broker.metrics import BrokerMetrics, serve_http

from .test_metrics import exchange, get, parse_responses

ROOT = pathlib.Path(__file__).resolve().parents[2]
STATIC = ROOT / "rsnet" / "broker" / "static"


@pytest.fixture
async def endpoint(nursery):
    live = LiveView(Endpoint("ws", "127.0.0.1", 7601), auth=False)
    serve = functools.partial(serve_http, pages=live.respond, request_timeout=0.5)
    listeners = await nursery.start(serve, BrokerMetrics(), "127.0.0.1", 0, lambda: {"healthy": True})
    return SimpleNamespace(port=listeners[0].socket.getsockname()[1])


async def test_the_page_and_its_files_are_served_with_their_types(endpoint):
    types = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
    for path, (name, _) in ROUTES.items():
        status, headers, body = await get(endpoint.port, path.decode())
        assert status == 200, path
        assert body == (STATIC / name).read_bytes()
        assert headers["content-type"] == f"{types[pathlib.Path(name).suffix]}; charset=utf-8"
        assert headers["x-content-type-options"] == "nosniff"
        assert "script-src 'self'" in headers["content-security-policy"]
        assert int(headers["content-length"]) == len(body) <= MAX_FILE
    status, _, body = await get(endpoint.port, "/?topic=sensors.kitchen&demand=100")  # the page's own query
    assert status == 200 and body.startswith(b"<!doctype html>")


async def test_the_page_refers_only_to_what_is_served(endpoint):
    _, _, page = await get(endpoint.port, "/")
    for reference in (b'href="/live/live.css"', b'src="/live/live.js"'):
        assert reference in page
    _, _, script = await get(endpoint.port, "/live/live.js")
    assert b'from "./rsnet-client.js"' in script
    assert b'fetch("/live/config.json")' in script


async def test_the_configuration_tells_the_page_where_the_websocket_is(endpoint):
    status, headers, body = await get(endpoint.port, CONFIG_PATH.decode())
    assert (status, headers["content-type"]) == (200, "application/json")
    assert json.loads(body) == {"websocket": {"scheme": "ws", "host": "127.0.0.1", "port": 7601}, "auth": False}


def test_the_configuration_without_websocket_or_with_a_wildcard_address():
    def config(live: LiveView) -> object:
        response = live.respond(CONFIG_PATH)
        assert response is not None
        return json.loads(response[2])

    assert config(LiveView(None, auth=True)) == {"websocket": None, "auth": True}
    assert config(LiveView(Endpoint("wss", None, 443), auth=False))["websocket"] == {  # type: ignore[index]
        "scheme": "wss",
        "host": None,  # the page uses the host it was loaded from
        "port": 443,
    }


@pytest.mark.parametrize(
    "target",
    [
        "/index.html",
        "/live",
        "/live/",
        "/live/index.html",
        "/live/LIVE.JS",
        "/live/live.js/",
        "//live/live.js",
        "/live//live.js",
        "/live/./live.js",
        "/live/../live/live.js",
        "/live/%2e%2e/live.py",
        "/live/..%2f..%2fpyproject.toml",
        "/../pyproject.toml",
        "/live/../../../../etc/passwd",
        "/static/live.js",
        "/rsnet/broker/static/live.js",
        "/live/live.py",
        "/live/config.json/..",
        "http://127.0.0.1/live/live.js",
        "/live/live.js%00.html",
        "*",
    ],
)
async def test_nothing_outside_the_allow_list_is_served(endpoint, target):
    status, headers, body = await get(endpoint.port, target)
    assert status == 404
    assert headers["content-type"].startswith("text/plain")
    assert body == b"404 Not Found: try /, /metrics or /health\n"


async def test_only_get_and_head(endpoint):
    status, headers, _ = await get(endpoint.port, "/live/live.js", method="POST", extra="content-length: 0\r\n")
    assert (status, headers["allow"]) == (405, "GET, HEAD")
    raw = await exchange(endpoint.port, b"HEAD / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and rest == b""
    assert int(parse_responses(head + b"\r\n\r\n")[0][1]["content-length"]) == len((STATIC / "index.html").read_bytes())


async def test_an_unchanged_file_is_304_without_a_body(endpoint):
    _, headers, _ = await get(endpoint.port, "/live/rsnet-client.js")
    etag = headers["etag"]
    raw = await exchange(
        endpoint.port,
        f'GET /live/rsnet-client.js HTTP/1.1\r\nhost: x\r\nif-none-match: "other", {etag}\r\n\r\n'
        "GET /live/live.css HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode(),
    )
    not_modified, rest = raw.split(b"\r\n\r\n", 1)
    assert not_modified.startswith(b"HTTP/1.1 304 ")
    assert b"content-length" not in not_modified.lower()  # else it would have to be the 200's length
    assert rest.startswith(b"HTTP/1.1 200 ")  # the next response on the same connection
    assert (await get(endpoint.port, "/live/rsnet-client.js", extra='if-none-match: "stale"\r\n'))[0] == 200


def test_the_files_ship_in_the_python_package():
    """pip install rsnet (a wheel, no node) must carry every file the live view serves."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["rsnet"]
    for name, _ in ROUTES.values():
        assert any(fnmatch.fnmatch(f"broker/static/{name}", glob) for glob in globs), name
        assert (STATIC / name).stat().st_size <= MAX_FILE


def test_the_broker_announces_and_serves_its_live_view(tmp_path):
    listen = ["--tcp", "127.0.0.1:0", "--ws", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]
    rsnet = pathlib.Path(sys.executable).parent / "rsnet"
    process = subprocess.Popen([rsnet, "broker", *listen], stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        printed = ""
        deadline = time.monotonic() + 20
        while "topics in memory" not in printed:
            line = process.stderr.readline()
            assert line and time.monotonic() < deadline, printed
            printed += line
        ws_port = int(printed.split("serving ws://127.0.0.1:", 1)[1].split("/", 1)[0])
        live = printed.split("live view on ", 1)[1].split()[0]
        assert live.startswith("http://127.0.0.1:") and live.endswith("/")
        with urllib.request.urlopen(live, timeout=10) as page:
            assert page.read() == (STATIC / "index.html").read_bytes()
        with urllib.request.urlopen(live + "live/config.json", timeout=10) as config:
            assert json.load(config) == {
                "websocket": {"scheme": "ws", "host": "127.0.0.1", "port": ws_port},
                "auth": False,
            }
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
