"""The ``rsnet`` data source's options, checked once where Spark hands them over.

Names follow Spark's Kafka source where they mean the same thing. Spark passes option names
case-insensitively and every value as a string; a bad value raises ValueError naming the
option, the value and what is accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from typing import Any

OFFSET_WORDS = ("earliest", "latest")

NAMES = {
    name.lower(): name
    for name in (
        "url",
        "topic",
        "token",
        "startingOffsets",
        "endingOffsets",
        "maxRecordsPerBatch",
        "minPartitions",
        "failOnDataLoss",
        "cursor",
    )
}
"""Every option, by the lowercase name Spark hands over."""

APPLIES = {
    "batch read": {"url", "topic", "token", "startingoffsets", "endingoffsets", "minpartitions", "failondataloss"},
    "stream read": {
        "url",
        "topic",
        "token",
        "startingoffsets",
        "maxrecordsperbatch",
        "minpartitions",
        "failondataloss",
        "cursor",
    },
    "write": {"url", "topic", "token"},
}
"""The options each use takes: one given where it means nothing is refused, not ignored."""


@dataclasses.dataclass(frozen=True)
class Options:
    url: str
    topics: tuple[str, ...]  # names and patterns; empty for a writer that takes a `topic` column
    token: str | None
    starting: str | dict[str, int] | None  # "earliest" | "latest" | {topic: offset}; None: the default
    ending: str | dict[str, int]  # batch reads: "latest" | {topic: offset}
    max_records_per_batch: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    cursor: str | None
    given: frozenset[str] = frozenset()  # the options given, by lowercase name

    def check_applies(self, use: str) -> None:
        """Refuse an option ``use`` (a key of :data:`APPLIES`) does not take: an endingOffsets
        on a stream, a maxRecordsPerBatch on a batch read, a reading option on a writer."""
        stray = sorted(NAMES[name] for name in self.given - APPLIES[use])
        if stray:
            takes = ", ".join(sorted(NAMES[name] for name in APPLIES[use]))
            raise ValueError(f"rsnet: option(s) {', '.join(stray)} mean nothing for a {use} (it takes {takes})")


def parse(options: Mapping[str, str], *, need_topic: bool = True) -> Options:
    """The options Spark passed to ``format("rsnet")``; ValueError for a missing or bad one."""
    opts = {key.lower(): value for key, value in options.items()}
    known = set(NAMES)
    spark_own = {"path", "checkpointlocation"}  # Spark passes them along; unused here
    unknown = sorted(set(opts) - known - spark_own)
    if unknown:  # a typo, or a Kafka option that means something else here (maxOffsetsPerTrigger)
        # Spark hands the names over lowercased: the closest known one, spelt as documented.
        guesses = {NAMES[close[0]] for name in unknown if (close := difflib.get_close_matches(name, NAMES, 1))}
        hint = f" (did you mean {', '.join(sorted(guesses))}?)" if guesses else ""
        names = ", ".join(sorted(NAMES.values(), key=str.lower))
        raise ValueError(f"rsnet: unknown option(s) {', '.join(unknown)}{hint}; known: {names}")
    url = opts.get("url")
    if not url:
        raise ValueError("rsnet: option url is required, e.g. .option('url', 'tcp://127.0.0.1:7600')")
    topics = _topics(opts.get("topic"))
    if need_topic and not topics:
        raise ValueError("rsnet: option topic is required: a topic, a comma-separated list, or a pattern (orders.*)")
    cursor = opts.get("cursor")
    if cursor is not None and not cursor.strip():
        raise ValueError("rsnet: option cursor must not be empty")
    return Options(
        url=url,
        topics=topics,
        token=opts.get("token"),
        starting=_offsets("startingOffsets", opts.get("startingoffsets"), OFFSET_WORDS),
        ending=_offsets("endingOffsets", opts.get("endingoffsets"), ("latest",)) or "latest",
        max_records_per_batch=_positive("maxRecordsPerBatch", opts.get("maxrecordsperbatch")),
        min_partitions=_positive("minPartitions", opts.get("minpartitions")),
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss"), default=True),
        cursor=cursor,
        given=frozenset(opts) & known,
    )


def _topics(value: str | None) -> tuple[str, ...]:
    if value is None or not value.strip():
        return ()
    if value.lstrip().startswith("["):
        try:
            names = json.loads(value)
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ValueError(f"rsnet: option topic {value!r} is not a JSON list of names")
    else:
        names = value.split(",")
    if any(not name.strip() for name in names):  # "a,,b", "a,": a name left out by mistake?
        raise ValueError(f"rsnet: option topic {value!r} has an empty name")
    return tuple(name.strip() for name in names)


def _offsets(option: str, value: str | None, words: tuple[str, ...]) -> str | dict[str, int] | None:
    if value is None:
        return None
    if value.strip().lower() in words:  # as Spark's Kafka source, whatever the case
        return value.strip().lower()
    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0 for offset in parsed.values()
    ):
        accepted = " or ".join(repr(word) for word in words)
        raise ValueError(
            f"rsnet: option {option} must be {accepted} or JSON per topic like "
            f'{{"orders": 42}} (offsets >= 0), got {value!r}'
        )
    return parsed


def _positive(option: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"rsnet: option {option} must be a positive integer, got {value!r}")
    return number


def _bool(option: str, value: str | None, *, default: bool) -> bool:
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"rsnet: option {option} must be true or false, got {value!r}")
