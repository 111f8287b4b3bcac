"""The frames of wire protocol v1: type numbers, field layouts, limits, and validation.

A frame on the wire is a msgpack array ``[type, field1, field2, ...]`` (protocol/SPEC.md,
"Frames"). Each frame class below lists its fields in wire order; :func:`parse_frame` turns a
decoded array into a frame object, checking every field's type and range, and
:func:`frame_fields` turns a frame object back into the array to encode.

Frame objects are also the events :class:`~rsnet.protocol.Connection` reports for frames it
receives. Constructing one does not validate it: tests build invalid frames on purpose.

This module imports nothing but the standard library and :mod:`rsnet.protocol.errors`.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable
from typing import Any, ClassVar

from .errors import ErrorCode, RemoteProtocolError

PROTOCOL_VERSION = 1
"""The version this implementation speaks, the only one it offers and accepts."""

MAGIC = "rsnet"
"""Second element of every HELLO: a peer that is not rsnet fails at its first frame."""

MAX_INT = 2**63 - 1
"""Largest integer in any protocol field; also unbounded demand (Reactive Streams rule 3.17)."""

MIN_INT = -(2**63)

DEFAULT_MAX_FRAME_SIZE = 1 << 20
"""Default for the largest encoded frame a side accepts, in bytes."""

MIN_MAX_FRAME_SIZE = 16384
"""No side may announce a smaller max_frame_size, so a HELLO this small is always accepted."""

MAX_MAX_FRAME_SIZE = 2**31 - 1

DEFAULT_MAX_STREAMS = 1024
"""Default for how many concurrent streams a side lets its peer open."""

DEFAULT_KEEPALIVE_INTERVAL = 20_000
"""Default keepalive interval in milliseconds; the connection is dead after 3 silent intervals."""

DEFAULT_HANDSHAKE_TIMEOUT = 10_000
"""Milliseconds a side waits for the handshake to complete before closing with TIMEOUT."""

MAX_SETTING = 2**31 - 1
"""Upper bound of max_streams and keepalive_interval."""

MAX_ERROR_MESSAGE = 4096
"""Most bytes (UTF-8) of the ``message`` of an ERROR, CONN_ERROR or GO_AWAY this side sends;
longer ones are cut and end with :data:`TRUNCATED` (SPEC 11.3)."""

MAX_ERROR_DATA = 8192
"""Most bytes (msgpack) of the ``data`` of an ERROR or CONN_ERROR this side sends; larger data
is replaced by a string that starts with :data:`TRUNCATED` (SPEC 11.3). Message and data
together stay far below MIN_MAX_FRAME_SIZE, so an error frame always fits."""

TRUNCATED = "[truncated]"
"""The marker that ends a cut message, and starts the string that replaces oversized data."""

MAX_VERSIONS = 16
"""Most versions a HELLO may offer."""

FIRST_EXTENSION_TYPE = 64
"""Frame types from here up are extensions: a receiver that does not know one ignores it."""


class FrameType(enum.IntEnum):
    """Frame type numbers (the first element of every frame)."""

    HELLO = 1
    WELCOME = 2
    PING = 3
    PONG = 4
    GO_AWAY = 5
    CONN_ERROR = 6
    SUBSCRIBE = 16
    OFFER = 17
    ACCEPT = 18
    REQUEST = 19
    CANCEL = 20
    NEXT = 21
    BATCH = 22
    COMPLETE = 23
    ERROR = 24


# Field checkers: each returns the value or raises RemoteProtocolError naming the field.
# Exact type checks (not isinstance) because msgpack booleans must never pass as integers.
_Check = Callable[[Any, str], Any]


def _fail(name: str, what: str, value: Any) -> RemoteProtocolError:
    return RemoteProtocolError(ErrorCode.PROTOCOL_ERROR, f"{name} must be {what}, got {value!r:.80}")


_CONDITIONS: dict[_Check, tuple[str, str]] = {}
"""The checkers made by :func:`_check`: their condition and what it asks for, compiled inline
into the parsers (see :func:`_parser`)."""

_NAMESPACE: dict[str, Any] = {
    "__name__": __name__,
    "_fail": _fail,
    "MAX_INT": MAX_INT,
    "MIN_INT": MIN_INT,
    "MAGIC": MAGIC,
}
"""What the compiled checkers and parsers refer to, besides a parser's frame class (and their
module, for tracebacks and introspection)."""


def _check(condition: str, what: str) -> _Check:
    """The checker of a condition on ``value``, a Python expression written once: the checker
    and every parser that checks such a field compile it (a call per field in a parser cost as
    much again as the checks themselves)."""
    namespace = dict(_NAMESPACE)
    exec(  # the source is this module's constants, not input
        f"def check(value, name):\n    if not ({condition}):\n        raise _fail(name, {what!r}, value)\n"
        "    return value\n",
        namespace,
    )
    check: _Check = namespace["check"]
    _CONDITIONS[check] = (condition, what)
    return check


_uint = _check("type(value) is int and 0 <= value <= MAX_INT", "an integer in 0..2**63-1")
_positive = _check("type(value) is int and 1 <= value <= MAX_INT", "an integer in 1..2**63-1")
# REQUEST's n may be <= 0 on the wire: that is a rule 3.9 stream error, not a malformed frame.
_int64 = _check("type(value) is int and MIN_INT <= value <= MAX_INT", "an integer in -2**63..2**63-1")
_str = _check("type(value) is str", "a string")
_map = _check("type(value) is dict and (not value or all(type(key) is str for key in value))", "a map with string keys")
_array = _check("type(value) is list", "an array")
_magic = _check("value == MAGIC and type(value) is str", repr(MAGIC))
_token = _check("type(value) in (str, bytes)", "a string or binary")


def _any(value: Any, name: str) -> Any:
    return value


def _versions(value: Any, name: str) -> list[int]:
    if type(value) is not list or not 1 <= len(value) <= MAX_VERSIONS:
        raise _fail(name, f"an array of 1..{MAX_VERSIONS} versions", value)
    for version in value:
        if type(version) is not int or not 1 <= version <= MAX_INT:
            raise _fail(name, "versions in 1..2**63-1", value)
    return value


def _bounded(low: int, high: int) -> _Check:
    return _check(f"type(value) is int and {low} <= value <= {high}", f"an integer in {low}..{high}")


_SETTINGS: dict[str, _Check] = {
    "max_frame_size": _bounded(MIN_MAX_FRAME_SIZE, MAX_MAX_FRAME_SIZE),
    "max_streams": _bounded(0, MAX_SETTING),
    "keepalive_interval": _bounded(0, MAX_SETTING),
    "auth_token": _token,
    "metadata": _map,
}


def _settings(value: Any, name: str) -> dict[str, Any]:
    # Unknown keys are kept but not checked: a later v1 peer may send settings we do not know.
    _map(value, name)
    for key, check in _SETTINGS.items():
        if key in value:
            check(value[key], f"{name}.{key}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    """Client → server, first frame: the versions the client speaks and its settings."""

    TYPE: ClassVar[FrameType] = FrameType.HELLO
    CHECKS: ClassVar[tuple[_Check, ...]] = (_magic, _versions, _settings)
    magic: str
    versions: list[int]
    settings: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Welcome:
    """Server → client, first frame: the version chosen and the server's settings."""

    TYPE: ClassVar[FrameType] = FrameType.WELCOME
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive, _settings)
    version: int
    settings: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    """Keepalive probe; the receiver answers with a PONG carrying the same token."""

    TYPE: ClassVar[FrameType] = FrameType.PING
    CHECKS: ClassVar[tuple[_Check, ...]] = (_uint,)
    token: int


@dataclasses.dataclass(frozen=True, slots=True)
class Pong:
    """Answer to a PING."""

    TYPE: ClassVar[FrameType] = FrameType.PONG
    CHECKS: ClassVar[tuple[_Check, ...]] = (_uint,)
    token: int


@dataclasses.dataclass(frozen=True, slots=True)
class GoAway:
    """Graceful shutdown: no new streams in either direction; open streams run to their end."""

    TYPE: ClassVar[FrameType] = FrameType.GO_AWAY
    CHECKS: ClassVar[tuple[_Check, ...]] = (_str,)
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class ConnError:
    """Fatal connection error (or handshake rejection); the sender closes after it."""

    TYPE: ClassVar[FrameType] = FrameType.CONN_ERROR
    CHECKS: ClassVar[tuple[_Check, ...]] = (_uint, _str, _any)
    code: int
    message: str
    data: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Subscribe:
    """Opens a stream: subscribe to the receiver's publisher ``name``."""

    TYPE: ClassVar[FrameType] = FrameType.SUBSCRIBE
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive, _str, _any, _uint, _map)
    stream_id: int
    name: str
    params: Any
    initial_demand: int
    metadata: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Offer:
    """Opens a stream: the sender offers a publisher for the receiver to subscribe to."""

    TYPE: ClassVar[FrameType] = FrameType.OFFER
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive, _str, _any, _map)
    stream_id: int
    name: str
    params: Any
    metadata: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Accept:
    """The receiver of SUBSCRIBE or OFFER accepts the stream (the remote ``on_subscribe``)."""

    TYPE: ClassVar[FrameType] = FrameType.ACCEPT
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive, _map)
    stream_id: int
    metadata: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """Subscriber side grants ``n`` more items (rule 3.8); 2**63-1 means unbounded (rule 3.17)."""

    TYPE: ClassVar[FrameType] = FrameType.REQUEST
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive, _int64)
    stream_id: int
    n: int


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    """Subscriber side stops the stream (rule 3.12); terminal."""

    TYPE: ClassVar[FrameType] = FrameType.CANCEL
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive,)
    stream_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class Next:
    """Publisher side sends one item (any msgpack value but nil, rule 2.13)."""

    TYPE: ClassVar[FrameType] = FrameType.NEXT
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive, _any)
    stream_id: int
    item: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """Publisher side sends several items in one frame, in order."""

    TYPE: ClassVar[FrameType] = FrameType.BATCH
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive, _array)
    stream_id: int
    items: list[Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Complete:
    """Publisher side ends the stream successfully (rule 1.5); terminal."""

    TYPE: ClassVar[FrameType] = FrameType.COMPLETE
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive,)
    stream_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class Error:
    """Ends a stream with an error; terminal. From the publisher side it is ``on_error``; as
    the answer to SUBSCRIBE or OFFER it is the rejection; from the subscriber side it is a
    cancel that says why."""

    TYPE: ClassVar[FrameType] = FrameType.ERROR
    CHECKS: ClassVar[tuple[_Check, ...]] = (_positive, _uint, _str, _any)
    stream_id: int
    code: int
    message: str
    data: Any


Frame = (
    Hello
    | Welcome
    | Ping
    | Pong
    | GoAway
    | ConnError
    | Subscribe
    | Offer
    | Accept
    | Request
    | Cancel
    | Next
    | Batch
    | Complete
    | Error
)

_CLASSES: dict[int, type[Any]] = {
    cls.TYPE.value: cls
    for cls in (
        Hello,
        Welcome,
        Ping,
        Pong,
        GoAway,
        ConnError,
        Subscribe,
        Offer,
        Accept,
        Request,
        Cancel,
        Next,
        Batch,
        Complete,
        Error,
    )
}
_NAMES: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(field.name for field in dataclasses.fields(cls)) for cls in _CLASSES.values()
}
# Per frame class, computed once (an enum member's .name or .value is a Python-level call, and
# these run for every frame): the type number, and each field's name for error messages.
_TYPES: dict[type[Any], int] = {cls: number for number, cls in _CLASSES.items()}
_LABELS: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(f"{cls.TYPE.name}.{name}" for name in names) for cls, names in _NAMES.items()
}


def _init(cls: type[Any]) -> Callable[..., None]:
    """A frame class's ``__init__``, setting each field through its slot's own descriptor.

    The frozen dataclass's sets each with ``object.__setattr__`` (its own ``__setattr__``
    refuses), about 100 ns a field in a warm loop against 50 through the descriptor: SUBSCRIBE
    0.65 against 0.38 us, and a frame object is made for nearly every frame received. The same
    fields are set to the same values: only the path to the slot is shorter.
    """
    names = _NAMES[cls]
    if any(
        f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        for f in dataclasses.fields(cls)
    ):
        raise TypeError(f"{cls.__name__}: a frame field with a default needs it in the generated __init__ too")
    namespace = {"__name__": __name__} | {f"set_{name}": getattr(cls, name).__set__ for name in names}
    exec(  # the source is the class's field names
        f"def __init__(self, {', '.join(names)}):\n" + "".join(f"    set_{name}(self, {name})\n" for name in names),
        namespace,
    )
    init: Callable[..., None] = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = cls.__init__.__annotations__
    return init


for _cls in _CLASSES.values():
    _cls.__init__ = _init(_cls)
del _cls


def parse_frame(fields: Any) -> Frame | None:
    """Validate one decoded msgpack value as a v1 frame and return the frame object.

    Returns ``None`` for an extension frame (type >= 64) this version does not know: the
    spec says to ignore it. Elements after the known fields are ignored (extension rule).
    Raises :class:`RemoteProtocolError` (code ``PROTOCOL_ERROR``) for anything else that is
    not a well-formed v1 frame. Stream-level rules (nil items, demand) are not checked here.
    """
    if type(fields) is not list or not fields:
        raise _fail("a frame", "a non-empty array", fields)
    frame_type = fields[0]
    # The exact type check first: msgpack's true and 16.0 hash as 1 and 16 do.
    parse = PARSERS.get(frame_type) if type(frame_type) is int else None
    if parse is None:
        if type(frame_type) is not int or not 0 <= frame_type <= MAX_INT:
            raise _fail("the frame type", "an integer in 0..2**63-1", frame_type)
        if frame_type >= FIRST_EXTENSION_TYPE:
            return None
        raise RemoteProtocolError(ErrorCode.PROTOCOL_ERROR, f"unknown frame type {frame_type}")
    return parse(fields)


_VALUE = re.compile(r"\bvalue\b")
"""The checked value in a :func:`_check` condition, renamed for a parser's field."""


def _parser(cls: type[Any], *, construct: bool = True) -> Callable[[list[Any]], Any]:
    """The parser of one frame class, compiled as dataclasses compile ``__init__``: its field
    count checked, then each field by its check in ``cls.CHECKS``, the conditions of
    :func:`_check`'s checkers inline, the others (HELLO's versions and settings) called.
    parse_frame or the connection runs one for every frame but the NEXT frames of a run: a
    call per field, or a loop over the checks, cost as much again as the checks (parse_frame
    of a SUBSCRIBE, besides making the frame object: 0.43 us with a call per field, 0.25).

    The field count is checked by taking the last field first (a frame too short fails
    there), and each condition is compiled on the field's own variable (``value`` renamed):
    no len() call and no copy per field: 92 -> 79 bytecodes executed for a SUBSCRIBE, 128 ->
    103 for an ACCEPT, a BATCH and a COMPLETE.

    Without ``construct`` it returns ``fields`` once they are valid, for the connection,
    which takes NEXT's and BATCH's items from the array (those frames are not events)."""
    count = len(cls.CHECKS)
    namespace = dict(_NAMESPACE, cls=cls, too_short=_too_short(cls, count))
    names = _NAMES[cls]
    taken = set(namespace) | {"fields", "type", "all", "key", "value"}  # what the source names besides fields
    if taken.intersection(names):
        raise TypeError(
            f"{cls.__name__}: a field named {sorted(taken.intersection(names))} would shadow the parser's own"
        )
    lines = [
        "def parse(fields):",
        "    try:",
        f"        {names[-1]} = fields[{count}]",
        "    except IndexError:",
        "        raise too_short(fields) from None",
    ]
    for index, (check, label, name) in enumerate(zip(cls.CHECKS, _LABELS[cls], names, strict=True), start=1):
        if index < count:
            lines.append(f"    {name} = fields[{index}]")
        if check in _CONDITIONS:
            condition, what = _CONDITIONS[check]
            condition = _VALUE.sub(name, condition)
            lines += [
                f"    if not ({condition}):",
                f"        raise _fail({label!r}, {what!r}, {name})",
            ]
        elif check is not _any:
            namespace[f"check_{name}"] = check
            lines.append(f"    {name} = check_{name}({name}, {label!r})")
    lines.append(f"    return cls({', '.join(names)})" if construct else "    return fields")
    exec("\n".join(lines), namespace)  # the source is this module's own
    parse: Callable[[list[Any]], Any] = namespace["parse"]
    return parse


def _too_short(cls: type[Any], count: int) -> Callable[[list[Any]], RemoteProtocolError]:
    def too_short(fields: list[Any]) -> RemoteProtocolError:
        return RemoteProtocolError(
            ErrorCode.PROTOCOL_ERROR, f"{cls.TYPE.name} needs {count} fields, got {len(fields) - 1}"
        )

    return too_short


PARSERS: dict[int, Callable[[list[Any]], Any]] = {number: _parser(cls) for number, cls in _CLASSES.items()}
"""The parser of each frame type number: the frame object from a decoded array whose first
element is that number, or :class:`RemoteProtocolError`. parse_frame dispatches to these; the
connection, once open, looks its parser up itself."""

VALIDATE_NEXT = _parser(Next, construct=False)
VALIDATE_BATCH = _parser(Batch, construct=False)
"""NEXT's and BATCH's parsers without the frame object (the array back, valid): the connection
takes the items from the array, and the frame object would have cost more than the checks."""


def frame_fields(frame: Frame) -> list[Any]:
    """The msgpack array for ``frame``: ``[type, field1, field2, ...]``."""
    cls = type(frame)
    return [_TYPES[cls], *[getattr(frame, name) for name in _NAMES[cls]]]
