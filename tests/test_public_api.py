"""The public API is deliberate: what ``rsnet`` exports, what type checkers see, what users
cannot construct."""

from __future__ import annotations

import ast
import pathlib

import pytest

import rsnet
import rsnet.streams
import rsnet.sync
from rsnet.errors import single_errors

INIT = pathlib.Path(rsnet.__file__)


def _type_checking_names() -> set[str]:
    """The names imported under ``if TYPE_CHECKING:`` in rsnet/__init__.py."""
    for node in ast.parse(INIT.read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return {alias.asname or alias.name for imp in node.body for alias in imp.names}  # type: ignore[attr-defined]  # every statement there is an import
    raise AssertionError("rsnet/__init__.py has no TYPE_CHECKING block")


def test_every_exported_name_resolves_and_type_checkers_see_each_one():
    assert set(rsnet.__all__) == _type_checking_names()
    for name in rsnet.__all__:
        assert getattr(rsnet, name) is not None
    assert set(rsnet.streams.__all__) <= set(rsnet.__all__), "the streams core is re-exported whole"


def test_what_users_need_is_exported():
    for name in ["connect", "Server", "Host", "StreamContext", "RemotePublisher", "Client"]:
        assert name in rsnet.__all__
    for name in ["RsnetError", "StreamError", "ConnectionLost", "HandshakeError", "TransportClosed", "ProtocolError"]:
        assert issubclass(getattr(rsnet, name), rsnet.RsnetError)


def test_the_error_tree():
    assert issubclass(rsnet.HandshakeError, rsnet.ConnectionLost)
    assert issubclass(rsnet.TransportClosed, rsnet.ConnectionLost)
    assert not issubclass(rsnet.TransportClosed, OSError)
    assert issubclass(rsnet.StreamError, rsnet.RsnetError) and not issubclass(rsnet.StreamError, rsnet.ConnectionLost)
    error = rsnet.StreamError(8, "no")
    assert (error.code, error.code_name, str(error)) == (8, "REJECTED", "REJECTED: no")


def test_an_api_with_a_nursery_of_its_own_raises_one_error_not_a_group():
    """``except ConnectionLost`` around ``connect`` or ``publish`` works: the group their nursery
    makes is undone for a lone error, and for one error several tasks raised (a connection's
    end, which each of its streams reports); different errors stay a group."""
    lost = rsnet.ConnectionLost("connection closed")
    with pytest.raises(rsnet.ConnectionLost) as caught, single_errors():
        raise ExceptionGroup("two tasks heard of it", [lost, lost])
    assert caught.value is lost
    other = rsnet.ConnectionLost("connection closed")
    with pytest.raises(ExceptionGroup), single_errors():
        raise ExceptionGroup("two errors", [lost, other])


def test_clients_are_made_by_connect_only():
    with pytest.raises(TypeError, match=r"use connect\(\)"):
        rsnet.Client()
    with pytest.raises(TypeError, match=r"use connect\(\)"):
        rsnet.sync.BlockingClient()


def test_the_package_ships_its_types():
    assert (INIT.parent / "py.typed").exists()


def test_the_brokers_codes_have_names_once_the_broker_package_is_loaded():
    import rsnet.broker  # what any broker helper (client, blocking, CLI) imports first

    assert rsnet.StreamError(4101, "beyond the end").code_name == "OFFSET_OUT_OF_RANGE"
    assert str(rsnet.StreamError(4100, "gone")) == "OFFSET_TRIMMED: gone"
    assert rsnet.StreamError(4999).code_name == "application error 4999"
    with pytest.raises(ValueError):
        rsnet.errors.register_code_names({8: "NOT_REJECTED"})


def test_dir_shows_the_public_names_not_the_modules_own_imports():
    import rsnet

    shown = set(dir(rsnet))
    assert set(rsnet.__all__) <= shown
    assert not {"Any", "TYPE_CHECKING", "importlib", "annotations"} & shown
