"""Recovery: what opening a segment directory keeps, and the repairs that make the files say so.

The rules are in the package docstring ("Recovery"). :func:`recover` runs them in four steps,
each a function below:

1. :func:`_list` sorts the directory's names: segments, sidecars, temporaries.
2. :func:`_plan` reads every segment (or its trusted sidecar) and decides what is kept and
   what goes, changing nothing: a format version this code does not know stops the open here.
3. :func:`_repair` changes the files as planned: what follows damage goes before the damaged
   segment is cut, so a crash in between cannot leave a cut segment followed by stale ones.
4. :func:`_rebuild` turns what is kept into the log's state (segments, producers' sequences,
   offsets), makes it durable, and gives sealed segments scanned at open their sidecar.

This module imports msgpack, the standard library and this package only.
"""

from __future__ import annotations

import dataclasses
import os
import re

from . import segment_file, sidecars
from .files import FileOps
from .segment_file import SEGMENT_NAME, Scan, Segment, file_crc
from .sidecars import SIDECAR_NAME, sidecar_name

TEMPORARY_NAME = re.compile(r"\d{20}\.(log|idx)\.tmp")


@dataclasses.dataclass
class RecoveryReport:
    """What opening a :class:`SegmentLog` found and did."""

    segments: int
    """Segment files the log has after recovery."""
    records: int
    """Records kept."""
    truncated_bytes: int
    """Bytes removed because they were damaged or followed damage (0 after a clean shutdown)."""
    damaged: list[str] = dataclasses.field(default_factory=list)
    """One line per problem: which segment, at which byte and offset, what was wrong, what was removed."""
    sidecars_used: int = 0
    """Sealed segments taken from their sidecar (``.idx``) after checking, instead of scanned."""
    sidecars_ignored: list[str] = dataclasses.field(default_factory=list)
    """One line per sealed segment scanned because its sidecar was missing or unusable, and why.
    Not damage: the segment was scanned as it would have been without sidecars."""

    @property
    def clean(self) -> bool:
        return not self.damaged


@dataclasses.dataclass
class Recovered:
    """The state of a recovered log, for :class:`SegmentLog` to take over."""

    segments: list[Segment]
    producers: dict[str, int]
    first_offset: int
    next_offset: int
    active_fd: int
    """Open for appending to the last segment."""
    directory_synced: bool
    """False if a segment was created and its directory entry not yet synced (NEVER)."""
    report: RecoveryReport


@dataclasses.dataclass
class _Listing:
    segments: list[str]
    sidecars: list[str]
    temporaries: list[str]


@dataclasses.dataclass
class _Plan:
    """What :func:`_plan` decided; nothing is changed yet."""

    kept: list[Scan] = dataclasses.field(default_factory=list)
    before_gap: list[Scan] = dataclasses.field(default_factory=list)  # dropped: offsets are missing after them
    after_damage: list[str] = dataclasses.field(default_factory=list)  # dropped: they follow (or are) the damage
    after_damage_bytes: int = 0
    restart_at: int = 0  # where the log starts if nothing is kept
    damaged: list[str] = dataclasses.field(default_factory=list)
    ignored: list[str] = dataclasses.field(default_factory=list)  # sealed segments scanned despite a sidecar
    trusted: int = 0

    @property
    def removed_bytes(self) -> int:
        return (
            sum(found.file_bytes for found in self.before_gap)
            + sum(found.file_bytes - found.valid_bytes for found in self.kept)
            + self.after_damage_bytes
        )


def recover(ops: FileOps, directory: str, durable: bool) -> Recovered:
    """Scan every segment in ``directory``, decide what to keep, then (and only then) change
    the files; everything kept is synced if ``durable``. Raises StorageError, changing
    nothing, for a segment format version this code does not know."""
    listing = _list(directory)
    plan = _plan(directory, listing.segments)
    _repair(ops, directory, listing, plan)
    return _rebuild(ops, directory, plan, durable)


def _list(directory: str) -> _Listing:
    names = sorted(os.listdir(directory))
    return _Listing(
        segments=[name for name in names if SEGMENT_NAME.fullmatch(name)],
        sidecars=[name for name in names if SIDECAR_NAME.fullmatch(name)],
        temporaries=[name for name in names if TEMPORARY_NAME.fullmatch(name)],
    )


def _plan(directory: str, names: list[str]) -> _Plan:
    """Read the segments in order: the log kept is the longest contiguous run of intact
    records from the start of the first segment (see the package docstring)."""
    plan = _Plan(restart_at=int(names[0][:20]) if names else 0)
    damaged, kept = plan.damaged, plan.kept
    for index, name in enumerate(names):
        base = int(name[:20])
        if kept and base != kept[-1].segment.next_offset:
            end = kept[-1].segment.next_offset
            if base < end:
                damaged.append(
                    f"{name}: starts at offset {base}, inside the previous segment (which ends before {end})"
                )
                plan.after_damage = names[index:]
                break
            damaged.append(
                f"{_names(kept)}: removed (offsets {kept[0].base_offset} to {end - 1}) because offsets {end} "
                f"to {base - 1} are missing before {name}: an interrupted retention, or a segment deleted by hand"
            )
            plan.before_gap.extend(kept)
            kept.clear()
        found = _read_segment(plan, os.path.join(directory, name), base, sealed=index < len(names) - 1)
        if found.header_problem is not None:
            damaged.append(f"{name}: {found.header_problem}")
            plan.after_damage = names[index:]
            if not kept:
                plan.restart_at = base
            break
        kept.append(found)
        if found.problem is not None:
            damaged.append(
                f"{name}: at byte {found.valid_bytes} (offset {found.segment.next_offset}): {found.problem}; "
                f"removed {found.file_bytes - found.valid_bytes} bytes from there to the end of the segment"
            )
            plan.after_damage = names[index + 1 :]
            break
    plan.after_damage_bytes = sum(os.stat(os.path.join(directory, name)).st_size for name in plan.after_damage)
    if plan.after_damage:
        damaged.append(
            f"removed {len(plan.after_damage)} segment file(s), {plan.after_damage_bytes} bytes, from the damage on: "
            + ", ".join(plan.after_damage)
        )
    if not kept and names:
        damaged.append(
            f"the log restarts empty at offset {plan.restart_at}; the producers' sequences stored before it are lost"
        )
    return plan


def _read_segment(plan: _Plan, path: str, base: int, *, sealed: bool) -> Scan:
    """A sealed segment from its sidecar if that can be trusted, else (and the active segment
    always) scanned."""
    if sealed:
        found, why = sidecars.trust(path, base)
        if found is not None:
            plan.trusted += 1
            return found
        plan.ignored.append(f"{sidecar_name(base)}: {why}; scanned {os.path.basename(path)} instead")
    return segment_file.scan(path, base)


def _repair(ops: FileOps, directory: str, listing: _Listing, plan: _Plan) -> None:
    """Change the files as planned: drop what follows damage (newest first) before cutting the
    damaged segment, so that a crash in between cannot leave a cut segment followed by stale ones."""
    for name in reversed(plan.after_damage):
        ops.unlink(os.path.join(directory, name))
    for found in plan.before_gap:
        ops.unlink(found.path)
    for name in listing.temporaries:
        ops.unlink(os.path.join(directory, name))
    # Only sealed segments that are kept may have a sidecar: not the active one (its sidecar
    # is from a roll cut short, or stale), nor removed segments, nor ones already gone.
    sealed = {found.base_offset for found in plan.kept[:-1]}
    stale = [name for name in listing.sidecars if int(name[:20]) not in sealed]
    for name in stale:
        ops.unlink(os.path.join(directory, name))
    if plan.after_damage or plan.before_gap or listing.temporaries or stale:
        ops.sync_directory(directory)
    last = plan.kept[-1] if plan.kept else None
    if last is not None and last.valid_bytes < last.file_bytes:
        fd = ops.open(last.path, os.O_WRONLY)
        try:
            ops.truncate(fd, last.valid_bytes)
            ops.datasync(fd)
        finally:
            os.close(fd)


def _rebuild(ops: FileOps, directory: str, plan: _Plan, durable: bool) -> Recovered:
    """The log's state from what is kept; a log with nothing kept restarts with one empty segment."""
    kept = plan.kept
    directory_synced = True
    if kept:
        segments = [found.segment for found in kept]
        producers = dict(kept[0].header_producers)
        for found in kept:
            producers.update(found.sequences)
        first_offset, next_offset = kept[0].base_offset, kept[-1].segment.next_offset
        if durable:
            for segment in segments:  # what a killed process left in the page cache
                fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    ops.datasync(fd)
                finally:
                    os.close(fd)
        active_fd = ops.open(kept[-1].path, os.O_RDWR | os.O_APPEND)
        try:
            for found in kept:
                if not found.from_sidecar:  # its CRC, for the sidecar written when it is sealed
                    found.segment.crc = file_crc(
                        active_fd if found is kept[-1] else None, found.path, found.valid_bytes
                    )
            segments[-1].sequences = dict(kept[-1].sequences)
            for found in kept[:-1]:
                if not found.from_sidecar:  # sealed but scanned: give it a sidecar for next time
                    found.segment.sequences = found.sequences
                    sidecars.write(ops, found.segment, durable)
                    found.segment.sequences = {}
        except BaseException:
            os.close(active_fd)
            raise
    else:
        producers = {}
        first_offset = next_offset = plan.restart_at
        segment = segment_file.create(ops, directory, plan.restart_at, producers, durable)
        if durable:
            ops.sync_directory(directory)
        directory_synced = durable
        segments = [segment]
        active_fd = ops.open(segment.path, os.O_RDWR | os.O_APPEND)
    report = RecoveryReport(
        segments=len(segments),
        records=next_offset - first_offset,
        truncated_bytes=plan.removed_bytes,
        damaged=plan.damaged,
        sidecars_used=plan.trusted,
        sidecars_ignored=plan.ignored,
    )
    return Recovered(segments, producers, first_offset, next_offset, active_fd, directory_synced, report)


def _names(scans: list[Scan]) -> str:
    return ", ".join(found.name for found in scans)
