"""Broker records to Arrow record batches (the reader), Arrow record batches to record values
(the writer).

Reading builds Arrow columns straight from the decoded records: handing PySpark Python tuples
costs about 4x more (it converts them to Arrow itself, row by row).

msgpack to Spark, with the default schema ``topic string, offset long, timestamp timestamp,
value string``: the value is JSON text (binary as base64, a map's binary keys too, NaN and
infinities as null). With a user schema, each field is
read from the value map by name: nil -> null, bool -> boolean, int -> long/int/short/byte (or
timestamp: milliseconds since the epoch), float -> double/float, str -> string, bin -> binary,
array -> array, map -> struct or map; any other value in a string field is its JSON text (a
number, a map: as Spark's JSON reader gives it); a value that does not fit its field reads as
null, as Spark's JSON reader does in PERMISSIVE mode; a record whose value is not a map reads
as a row of nulls.
"""

from __future__ import annotations

import base64
import datetime
import decimal
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type information
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from ..protocol import text_keys

DEFAULT_SCHEMA = "topic string, offset long, timestamp timestamp, value string"
DEFAULT_FIELDS = ("topic", "offset", "timestamp", "value")

ROWS_PER_BATCH = 10_000
"""Rows per Arrow record batch handed to Spark (Spark's own default for Arrow batches)."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not a msgpack type")


def _json_text(value: Any) -> str:
    """Compact JSON text of a value: UTF-8 kept, bin as base64 (a map's binary keys too), NaN
    and infinities as null (JSON has no such numbers)."""
    try:
        return orjson.dumps(value, default=_jsonable).decode()
    except TypeError:  # a map with a binary key, the rare case
        return orjson.dumps(text_keys(value), default=_jsonable).decode()


def _json_texts(values: list[Any]) -> list[str]:
    """:func:`_json_text` of each value. orjson (in the ``spark`` extra) writes it in a quarter
    of the time the standard library's encoder takes, which was most of this schema's cost a
    record."""
    dumps, jsonable = orjson.dumps, _jsonable
    try:
        return [dumps(value, default=jsonable).decode() for value in values]
    except TypeError:
        return list(map(_json_text, values))


class RecordBatches:
    """Builds Arrow record batches of ``schema`` (Spark's) from broker records."""

    def __init__(self, schema: StructType) -> None:
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.default = tuple(schema.fieldNames()) == DEFAULT_FIELDS and schema.simpleString() == (
            "struct<topic:string,offset:bigint,timestamp:timestamp,value:string>"
        )

    def build(self, topic: str, records: list[list[Any]]) -> pa.RecordBatch:
        """The batch of ``records`` of ``topic``, each ``[offset, timestamp, value, ...]`` (a
        subscription with ``items: "stored"`` or ``"arrays"``)."""
        if self.default:
            return self._default(topic, records)
        return self._fields(records)

    def _default(self, topic: str, records: list[list[Any]]) -> pa.RecordBatch:
        schema = self.arrow_schema
        # Three passes of one index each: a fifth of the cost of transposing with zip(*records).
        offsets = [record[0] for record in records]
        values = [record[2] for record in records]
        stamps = [record[1] for record in records]
        columns = [
            pa.array([topic] * len(records), schema.field("topic").type),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.timestamp("ms", tz="UTC")).cast(schema.field("timestamp").type),
            pa.array(_json_texts(values), pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def _fields(self, records: list[list[Any]]) -> pa.RecordBatch:
        values = [record[2] for record in records]
        maps = [value if type(value) is dict else {} for value in values]
        columns = []
        for field in self.arrow_schema:
            column = [value.get(field.name) for value in maps]
            columns.append(_column(column, field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)


def _column(values: list[Any], arrow_type: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array of ``arrow_type``; a value that does not fit is null."""
    if pa.types.is_timestamp(arrow_type):
        values = [value * 1000 if type(value) is int else None for value in values]  # ms -> µs
        return pa.array(values, pa.int64()).cast(arrow_type)
    if arrow_type.num_fields:  # nested: Arrow would take a str as a list of characters
        return pa.array([_nested(value, arrow_type) for value in values], arrow_type)
    if pa.types.is_string(arrow_type):
        values = [_text(value) for value in values]
    elif pa.types.is_integer(arrow_type):  # Arrow would truncate a float
        values = [value if type(value) is int else None for value in values]
    elif pa.types.is_floating(arrow_type):
        values = [value if type(value) is float or type(value) is int else None for value in values]
    try:
        return pa.array(values, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return pa.array([_fitting(value, arrow_type) for value in values], arrow_type)


def _nested(value: Any, arrow_type: pa.DataType) -> Any:
    """``value`` with every part that does not fit ``arrow_type`` replaced by null."""
    if value is None:
        return None
    if pa.types.is_struct(arrow_type):
        if type(value) is not dict:
            return None
        return {field.name: _nested(value.get(field.name), field.type) for field in arrow_type}
    if pa.types.is_map(arrow_type):
        if type(value) is not dict:
            return None
        return {key: _nested(item, arrow_type.item_type) for key, item in value.items() if type(key) is str}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        if type(value) is not list:
            return None
        return [_nested(item, arrow_type.value_type) for item in value]
    if pa.types.is_timestamp(arrow_type):
        return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC) if type(value) is int else None
    if pa.types.is_integer(arrow_type) and type(value) is not int:
        return None
    if pa.types.is_string(arrow_type):
        return _text(value)
    return _fitting(value, arrow_type)


def _text(value: Any) -> str | None:
    """A string field's text: a str as it is, bin as base64 (as in JSON text), anything else
    as its JSON text (null for NaN and infinities)."""
    if value is None or type(value) is str:
        return value
    if type(value) is bytes:
        return _jsonable(value)  # base64 text
    text = _json_text(value)
    return None if text == "null" else text


def _fitting(value: Any, arrow_type: pa.DataType) -> Any:
    try:
        pa.array([value], arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None
    return value


# -- the writer's side ---------------------------------------------------------------------------


def needs_plain_values(arrow_type: pa.DataType) -> bool:
    """Whether values of this type come out of Arrow as Python objects msgpack cannot encode
    as the record should hold them (datetime, date, Decimal, a map's (key, value) pairs),
    anywhere inside it."""
    if pa.types.is_temporal(arrow_type) or pa.types.is_decimal(arrow_type) or pa.types.is_map(arrow_type):
        return True
    return any(needs_plain_values(arrow_type.field(i).type) for i in range(arrow_type.num_fields))


def plain(value: Any, arrow_type: pa.DataType) -> Any:
    """``value`` (of ``arrow_type``, from ``to_pylist``) as msgpack can encode it: timestamps
    as milliseconds since the epoch (as the broker's own timestamps), dates and times as ISO
    text, decimals as their exact text, maps as maps."""
    if value is None:
        return None
    if pa.types.is_struct(arrow_type):
        return {field.name: plain(value.get(field.name), field.type) for field in arrow_type}
    if pa.types.is_map(arrow_type):
        return {key: plain(item, arrow_type.item_type) for key, item in value}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return [plain(item, arrow_type.value_type) for item in value]
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return int(value.timestamp() * 1000)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return value
