"""Recovery: what opening a segment directory keeps, and the repairs that make the files say so.

The rules are in the package docstring ("Recovery"). :func:`recover` runs them in four steps,
each a function below:

1. :func:`_list` sorts the directory's names: segments, sidecars, temporaries.
2. :func:`_plan` reads every segment (or its trusted sidecar) and decides what is kept and
   what goes, changing nothing: a format version this code does not know stops the open here
   (unless a later segment shows it is a damaged version field, or ``unclean``).
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

from . import segment_file, sidecars, synced_mark
from .files import FileOps, unlink_if_present
from .log import DamagedRange, ProducerState, StorageError, UncleanRecoveryNeeded
from .segment_file import (
    FORMAT_VERSION,
    MAGIC,
    NO_TIMESTAMP,
    PREAMBLE,
    SCAN_CHUNK,
    SEGMENT_NAME,
    Damage,
    Scan,
    Segment,
    file_crc,
)
from .sidecars import SIDECAR_NAME, sidecar_name

TEMPORARY_NAME = re.compile(r"\d{20}\.(log|idx)\.tmp")
QUARANTINE = "quarantine"
"""Where recovery keeps a copy of damaged bytes, and the segments an unclean recovery cut."""


@dataclasses.dataclass
class RecoveryReport:
    """What opening a :class:`SegmentLog` found and did."""

    segments: int
    """Segment files the log has after recovery."""
    records: int
    """Records kept (readable)."""
    truncated_bytes: int
    """Bytes removed because they were damaged or followed damage (0 after a clean shutdown)."""
    damaged: list[str] = dataclasses.field(default_factory=list)
    """One line per problem: which segment, at which byte and offset, what was wrong, what was removed."""
    damaged_ranges: list[DamagedRange] = dataclasses.field(default_factory=list)
    """Offsets whose records are unreadable, kept as gaps between intact records (never reused)."""
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
    producers: dict[str, ProducerState]
    first_offset: int
    next_offset: int
    active_fd: int
    """Open for appending to the last segment."""
    directory_synced: bool
    """False if a segment was created and its directory entry not yet synced (NEVER)."""
    damaged: list[DamagedRange]
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
    missing: list[DamagedRange] = dataclasses.field(default_factory=list)  # offsets no segment file holds
    after_damage: list[str] = dataclasses.field(default_factory=list)  # unclean only: moved to quarantine
    after_damage_bytes: int = 0
    restart_at: int = 0  # where the log starts if nothing is kept (unclean, or every segment file gone)
    first_offset: int | None = None  # where the log starts if not at its first segment (see _check_synced_mark)
    roll_at: int | None = None  # a new active segment starts here, after a damaged end (see _check_synced_mark)
    unplaced: str | None = None  # damage only the synced mark can place: why, for the refusal without one
    damaged: list[str] = dataclasses.field(default_factory=list)
    ignored: list[str] = dataclasses.field(default_factory=list)  # sealed segments scanned despite a sidecar
    trusted: int = 0

    @property
    def removed_bytes(self) -> int:
        return sum(found.file_bytes - found.valid_bytes for found in self.kept[-1:]) + self.after_damage_bytes


def recover(ops: FileOps, directory: str, durable: bool, unclean: bool = False) -> Recovered:
    """Scan every segment in ``directory``, decide what to keep, then (and only then) change
    the files; everything kept is synced if ``durable``. Raises StorageError, changing
    nothing, for a segment format version this code does not know, and
    :class:`UncleanRecoveryNeeded` for damage it cannot place unless ``unclean``."""
    listing = _list(directory)
    plan = _plan(directory, listing.segments, unclean)
    mark = synced_mark.read(directory) if durable else synced_mark.Mark(None)
    if durable:
        _check_synced_mark(plan, directory, mark, unclean)
    if plan.unplaced is not None and (mark.offset is None or mark.damaged):
        # Without a mark to say which of its records were acknowledged (those below it are
        # then a damaged range, _check_synced_mark; the rest a torn write), it cannot be placed.
        _cannot_place(directory, unclean, plan.unplaced)
    _repair(ops, directory, listing, plan, durable)
    return _rebuild(ops, directory, plan, durable)


def _list(directory: str) -> _Listing:
    names = sorted(os.listdir(directory))
    return _Listing(
        segments=[name for name in names if SEGMENT_NAME.fullmatch(name)],
        sidecars=[name for name in names if SIDECAR_NAME.fullmatch(name)],
        temporaries=[name for name in names if TEMPORARY_NAME.fullmatch(name)],
    )


def _plan(directory: str, names: list[str], unclean: bool) -> _Plan:
    """Read the segments in order and place every damage (see the package docstring): inside
    a segment or a whole sealed segment, it becomes a damaged range between intact records;
    at the end of the active segment it is a torn write, cut. What cannot be placed stops the
    open unless ``unclean``; then the log ends there, as it did before damaged ranges."""
    plan = _Plan(restart_at=int(names[0][:20]) if names else 0)
    kept = plan.kept
    for index, name in enumerate(names):
        base = int(name[:20])
        if kept and not _follows(plan, directory, name, base, unclean):
            plan.after_damage = names[index:]
            break
        path = os.path.join(directory, name)
        found = _read_segment(plan, path, base, sealed=index < len(names) - 1)
        if found.unknown_version is not None:
            _check_version(directory, names, index, found, unclean)
        if found.header_problem is not None:
            active = index == len(names) - 1
            # The active segment's records end where its intact ones do, as always: only if
            # none follows its header is how many it held unknown. (A format version this
            # code does not know gets here only with ``unclean``, which treats it as damage.)
            if active and not segment_file.intact_past_header(found):
                # How many records it held is unknown: the synced mark may tell (recover).
                plan.unplaced = (
                    f"{name}: {found.header_problem}: the active segment's header is unreadable, so how many "
                    "records it held is unknown"
                )
                plan.damaged.append(f"{name}: {found.header_problem}")
                plan.after_damage = names[index:]
                if not kept:
                    plan.restart_at = base
                break
            note = segment_file.scan_past_header(found, None if active else int(names[index + 1][:20]))
            if note is not None:
                plan.damaged.append(note)
        kept.append(found)
    plan.after_damage_bytes = sum(os.stat(os.path.join(directory, name)).st_size for name in plan.after_damage)
    if plan.after_damage:
        plan.damaged.append(
            f"removed {len(plan.after_damage)} segment file(s), {plan.after_damage_bytes} bytes, from the damage on "
            f"(moved to {QUARANTINE}/): " + ", ".join(plan.after_damage)
        )
    return plan


def _follows(plan: _Plan, directory: str, name: str, base: int, unclean: bool) -> bool:
    """Whether the segment starting at ``base`` can follow the last one kept. Damage that ran
    to the end of the previous (sealed) segment, and offsets no file holds, become damaged
    ranges. False (unclean only) if the segments overlap: the log then ends before ``name``."""
    previous = plan.kept[-1]
    end = previous.segment.next_offset
    if base < end:
        _cannot_place(
            directory,
            unclean,
            f"{name}: starts at offset {base}, inside the previous segment (which ends before {end})",
        )
        plan.damaged.append(f"{name}: starts at offset {base}, inside the previous segment (which ends before {end})")
        return False
    if previous.problem is not None:  # damage ran to the end of a sealed segment: a later one exists
        if base > end:
            previous.segment.skip_damage(Damage(end, base, previous.valid_bytes, previous.file_bytes, previous.problem))
        else:  # no offset is missing: bytes after its last record that are not one
            plan.damaged.append(
                f"{previous.name}: bytes {previous.valid_bytes} to {previous.file_bytes - 1} after its last record "
                f"are not a record ({previous.problem}); no offset is missing, the bytes are left in place"
            )
        previous.problem = None
    elif base > end:
        problem = f"no segment file holds offsets {end} to {base - 1} (before {name}): deleted by hand, or lost"
        plan.missing.append(DamagedRange(end, base, problem))
        plan.damaged.append(problem)  # reported (log, /health) as any other damage is
    return True


def _check_version(directory: str, names: list[str], index: int, found: Scan, unclean: bool) -> None:
    """A segment whose preamble names a format version this code does not know: written by
    another rsnet, or its version field is damaged. If a later segment is in this code's
    version, the field is damaged (each rsnet writes its own version, and an older one never
    went on past a newer segment: this check stopped it), and the segment is a damaged header
    like any other. Otherwise the open stops, changing nothing, unless ``unclean`` (then it
    is damage too)."""
    for later in names[index + 1 :]:
        try:
            with open(os.path.join(directory, later), "rb") as file:
                preamble = file.read(PREAMBLE.size)
        except OSError:
            continue
        if len(preamble) == PREAMBLE.size and PREAMBLE.unpack(preamble) == (MAGIC, FORMAT_VERSION):
            found.header_problem = (
                f"format version field reads {found.unknown_version}, damaged (a later segment, {later}, is "
                f"version {FORMAT_VERSION})"
            )
            return
    if not unclean:
        raise StorageError(
            f"{found.path}: segment format version {found.unknown_version}, but this rsnet reads version "
            f"{FORMAT_VERSION}: written by a newer rsnet (run that one), or its header is damaged (then start once "
            "with unclean_recovery = true, which treats it as damage); nothing was changed"
        )


def _check_synced_mark(plan: _Plan, directory: str, mark: synced_mark.Mark, unclean: bool) -> None:
    """The log must not end before the offset its last sync reported (``synced_mark.py``):
    records below it were synced, so acknowledged, and cutting or missing them is damage.
    Without a mark that checks, a partial last record may be cut only if the mark was never
    there (or blank): a damaged mark may have covered it. Records missing before the first
    segment, after where retention last cut, are a damaged range as missing segments between
    others are."""
    if mark.problem is not None:
        plan.damaged.append(f"{mark.problem}; not used (the log writes a new one as it syncs)")
    last = plan.kept[-1] if plan.kept else None
    if mark.damaged and last is not None and last.valid_bytes < last.file_bytes:
        problem = (
            f"{last.name} ends in bytes that are not a whole record ({last.problem}), and the synced mark that "
            "would tell a torn write never acknowledged from an acknowledged record damaged on disk is itself "
            "damaged"
        )
        _cannot_place(directory, unclean, problem)
        plan.damaged.append(problem)
    first = plan.kept[0].base_offset if plan.kept else None
    if mark.first is not None and first is not None and mark.first < first:
        problem = (
            f"no segment file holds offsets {mark.first} to {first - 1} (the oldest, which retention had not "
            "deleted): deleted by hand, or lost"
        )
        plan.missing.insert(0, DamagedRange(mark.first, first, problem))
        plan.damaged.append(problem)
        plan.first_offset = mark.first
    end = last.segment.next_offset if last is not None else plan.restart_at
    if mark.offset is None or mark.offset <= end:
        return
    missing = (
        f"records up to offset {mark.offset - 1} were synced (so acknowledged), but the log's intact records end "
        f"before offset {end}: the newest records are damaged or their segment file is missing"
    )
    if last is None:  # no segment file is left (deleted, or cut by an unclean recovery)
        start = min(mark.offset, plan.restart_at if mark.first is None else mark.first)
        plan.missing.append(DamagedRange(start, mark.offset, missing))
        plan.damaged.append(missing)
        plan.first_offset, plan.restart_at = start, mark.offset  # the new segment starts at the mark
        return
    # The synced records are damaged (what follows the last intact one is not a torn write)
    # or gone: their offsets are a damaged range, and a new segment holds what comes next, so
    # that the range is found again at every open (as damage before a later segment, or as
    # offsets no file holds) and its offsets are never given to other records.
    if last.problem is not None:
        last.segment.skip_damage(Damage(end, mark.offset, last.valid_bytes, last.file_bytes, last.problem))
        last.problem, last.valid_bytes = None, last.file_bytes  # kept as it is: no torn write to cut
    else:
        plan.missing.append(DamagedRange(end, mark.offset, missing))
        plan.damaged.append(missing)
    plan.roll_at = mark.offset


def _cannot_place(directory: str, unclean: bool, problem: str) -> None:
    if not unclean:
        raise UncleanRecoveryNeeded(
            f"{directory}: {problem}. Recovery cannot tell whether acknowledged records are lost with it, so "
            "nothing was changed. To start anyway, keeping the records before the damage and moving the rest "
            f"to {QUARANTINE}/ (their offsets may then be given to new records), set unclean_recovery = true "
            "in the broker's configuration for one start."
        )


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


def _repair(ops: FileOps, directory: str, listing: _Listing, plan: _Plan, durable: bool) -> None:
    """Change the files as planned. Keep a copy of every damaged byte range in ``quarantine/``
    (best effort), move segments cut by an unclean recovery there (newest first, before the
    damaged segment is cut, so a crash in between cannot leave a cut segment followed by stale
    ones), cut a torn tail, remove temporaries and sidecars that belong to no clean sealed segment."""
    for found in plan.kept:
        for damage in found.segment.damage:
            if damage.stop > damage.start:
                plan.damaged.append(
                    _describe(found, damage, _keep_copy(ops, directory, found.path, damage.start, damage.stop, durable))
                )
    last = plan.kept[-1] if plan.kept else None
    if last is not None and last.problem is not None:
        copy = _keep_copy(ops, directory, last.path, last.valid_bytes, last.file_bytes, durable)
        plan.damaged.append(
            f"{last.name}: at byte {last.valid_bytes} (offset {last.segment.next_offset}): {last.problem}; "
            f"removed {last.file_bytes - last.valid_bytes} bytes from there to the end of the segment "
            f"(a torn last write){copy}"
        )
    if plan.after_damage:
        quarantine = _quarantine_directory(ops, directory)
        for name in reversed(plan.after_damage):
            target = os.path.join(quarantine, name)
            while os.path.exists(target):  # an earlier unclean recovery's: keep both
                target += "~"
            ops.replace(os.path.join(directory, name), target)
    for name in listing.temporaries:
        ops.unlink(os.path.join(directory, name))
    # Only clean sealed segments that are kept may have a sidecar: not the active one (its
    # sidecar is from a roll cut short, or stale), nor damaged or removed segments.
    sealed = {found.base_offset for found in plan.kept[:-1] if _clean(found)}
    stale = [name for name in listing.sidecars if int(name[:20]) not in sealed]
    for name in stale:
        ops.unlink(os.path.join(directory, name))
    if plan.after_damage or listing.temporaries or stale:
        ops.sync_directory(directory)
    if last is not None and last.valid_bytes < last.file_bytes:
        fd = ops.open(last.path, os.O_WRONLY)
        try:
            ops.truncate(fd, last.valid_bytes)
            ops.datasync(fd)
        finally:
            os.close(fd)


def _describe(found: Scan, damage: Damage, copy: str) -> str:
    return (
        f"{found.name}: offsets {damage.first} to {damage.end - 1} are damaged (bytes {damage.start} to "
        f"{damage.stop - 1}: {damage.problem}); the records before and after are kept and those offsets are "
        f"never reused{copy}"
    )


def _quarantine_directory(ops: FileOps, directory: str) -> str:
    path = os.path.join(directory, QUARANTINE)
    if not os.path.isdir(path):
        ops.makedirs(path)
        ops.sync_directory(directory)
    return path


def _keep_copy(ops: FileOps, directory: str, path: str, start: int, stop: int, durable: bool) -> str:
    """Copy bytes ``start`` .. ``stop - 1`` of ``path`` to ``quarantine/`` (once: damage in the
    middle is found again at every open); the words for the report saying where, or why not."""
    name = f"{os.path.basename(path)}.bytes-{start}-{stop - 1}"
    target = os.path.join(directory, QUARANTINE, name)
    if os.path.exists(target) and os.path.getsize(target) == stop - start:
        return f"; a copy of the bytes is in {QUARANTINE}/{name}"
    try:
        quarantine = _quarantine_directory(ops, directory)
        source = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fd = ops.open(target + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                position = start
                while position < stop:
                    chunk = os.pread(source, min(SCAN_CHUNK, stop - position), position)
                    if not chunk:
                        break
                    ops.write_all(fd, chunk)
                    position += len(chunk)
                if durable:
                    ops.datasync(fd)
            finally:
                os.close(fd)
        finally:
            os.close(source)
        ops.replace(target + ".tmp", target)
        if durable:
            ops.sync_directory(quarantine)
    except OSError as exc:
        unlink_if_present(ops, target + ".tmp", quiet=True)
        return f"; no copy of the bytes could be kept ({exc})"
    return f"; a copy of the bytes is in {QUARANTINE}/{name}"


def _rebuild(ops: FileOps, directory: str, plan: _Plan, durable: bool) -> Recovered:
    """The log's state from what is kept; a log with nothing kept restarts with one empty segment."""
    kept = plan.kept
    directory_synced = True
    if kept:
        segments = [found.segment for found in kept]
        producers = _producers(kept)
        first_offset, next_offset = kept[0].base_offset, kept[-1].segment.next_offset
        if plan.first_offset is not None:
            first_offset = plan.first_offset
        if durable:
            for segment in segments:  # what a killed process left in the page cache
                fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    ops.datasync(fd)
                finally:
                    os.close(fd)
        if plan.roll_at is not None:  # the last segment ends in damage: records to come go in a new one
            segments.append(segment_file.create(ops, directory, plan.roll_at, producers, durable))
            if durable:
                ops.sync_directory(directory)
            next_offset = plan.roll_at
        active_fd = ops.open(segments[-1].path, os.O_RDWR | os.O_APPEND)
        try:
            for found in kept:
                segment = found.segment
                if found.from_sidecar:
                    continue
                if not _clean(found):
                    segment.crc = None  # never given a sidecar: its damage must be found again at every open
                    continue
                # its CRC, for the sidecar written when it is sealed
                segment.crc = file_crc(active_fd if segment is segments[-1] else None, found.path, found.valid_bytes)
            if plan.roll_at is None:
                segments[-1].sequences = dict(kept[-1].sequences)
            for found in kept[:-1]:
                if not found.from_sidecar and found.segment.crc is not None:  # scanned: a sidecar for next time
                    found.segment.sequences = found.sequences
                    sidecars.write(ops, found.segment, durable)
                    found.segment.sequences = {}
        except BaseException:
            os.close(active_fd)
            raise
    else:
        if plan.after_damage or plan.missing:  # there was a log: what it stored is gone
            plan.damaged.append(
                f"the log restarts empty at offset {plan.restart_at}; the producers' sequences stored before it are lost"
            )
        producers = {}
        first_offset = next_offset = plan.restart_at
        if plan.first_offset is not None:  # offsets up to the restart are a damaged range
            first_offset = plan.first_offset
        segment = segment_file.create(ops, directory, plan.restart_at, producers, durable)
        if durable:
            ops.sync_directory(directory)
        directory_synced = durable
        segments = [segment]
        active_fd = ops.open(segment.path, os.O_RDWR | os.O_APPEND)
    damaged = sorted(
        plan.missing
        + [
            DamagedRange(damage.first, damage.end, _describe(found, damage, ""))
            for found in kept
            for damage in found.segment.damage
        ],
        key=lambda damage: damage.first,
    )
    report = RecoveryReport(
        segments=len(segments),
        records=next_offset - first_offset - sum(damage.end - damage.first for damage in damaged),
        truncated_bytes=plan.removed_bytes,
        damaged=plan.damaged,
        damaged_ranges=damaged,
        sidecars_used=plan.trusted,
        sidecars_ignored=plan.ignored,
    )
    return Recovered(segments, producers, first_offset, next_offset, active_fd, directory_synced, damaged, report)


def _producers(kept: list[Scan]) -> dict[str, ProducerState]:
    """The producers the log remembered, from the kept segments (in order): each header is a
    snapshot of the producers remembered when its segment was created (so those forgotten
    before are not in it), and each segment's records update it, the later record winning (a
    forgotten producer may have started its sequences again).

    Last-write times come from the header and from scanned records. Where one is unknown (a
    segment taken from its sidecar: at most its newest record's; a header written before
    rsnet stored times: the newest record's in the log), the latest it can be is taken: a
    producer may be remembered a little longer than its bound, never forgotten early. The
    log keeps the most recent ``max_producers`` (``TopicLog._adopt_producers``).
    """
    newest = max(found.segment.max_timestamp for found in kept)
    unknown = 0 if newest == NO_TIMESTAMP else newest
    producers: dict[str, ProducerState] = {}
    for found in kept:
        if found.header_producers is not None:  # else a sealed segment that lost its header: go on
            written = found.header_written
            producers = {
                producer: ProducerState(sequence, written.get(producer, unknown))
                for producer, sequence in found.header_producers.items()
            }
        for producer, sequence in found.sequences.items():
            producers[producer] = ProducerState(sequence, found.written.get(producer, found.segment.max_timestamp))
    return producers


def _clean(found: Scan) -> bool:
    """Whether the segment holds nothing but its header and intact records (after a torn
    tail is cut, for the active one)."""
    return not found.segment.damage and (found.problem is not None or found.valid_bytes == found.file_bytes)
