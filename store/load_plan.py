"""The load plan: how one committed (version, checkpoint id) of a store is rebuilt, as a value.

Loading a version means answering three questions before touching data: which lineage (the committed
ancestors of the version), which base (the local DB, a snapshot, or the empty version 0) and which
changelogs to replay on top of it. `resolve_load_plan` answers them once, from the commit record,
one snapshot listing and the changelog headers (a changelog carries the lineage it extends, so a
plan costs O(1) metadata reads unless the lineage was capped); `StateStore.load` executes the
result (`statekeeper.store.loading`). The plan is a frozen dataclass, so tests, the state reader and
maintenance's verify inspect the same decision the loader takes.

Snapshot repair (DESIGN invariant 10): when the base snapshot turns out unreadable, `fall_back`
resolves the next plan along the same lineage, passing over the bad snapshot to an older one or to
the empty version 0, as long as the committed changelogs are there. Only the healthy path is
resolved eagerly; a fallback reads the extra headers it needs when it is taken.

Lineage check (DESIGN invariant 13): a changelog header is checkpoint content, not truth. Every changelog
a plan replays and the snapshot it starts from must be the attempt the commit record of its version names
for this (operator, partition), and a chain may start from empty below version 1 only at a full-state
changelog the commit record declares. A plan that breaks this is resolved again from the commit records
alone (a lineage repair, counted with the snapshot repairs); when that path is not there either, the load
raises `LineageError` naming the changelog whose header was wrong. The records of a chain are fetched
with the read-ahead, so the check costs about one round trip per few records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import CheckpointFileNotFoundError, CorruptFileError, LineageError
from statekeeper.store.files.base import CheckpointFileManager
from statekeeper.store.formats.changelog import ChangelogHeader, Lineage, read_header
from statekeeper.store.layout import MANIFEST_SUFFIX, StoreId, commit_path, parse_versioned_name

log = logging.getLogger(__name__)

Ref = tuple[int, str]
"""(version, checkpoint id) of a committed state."""


class LoadSource(Enum):
    """Where the state of a plan starts from."""

    REUSE = "reuse"
    """The local DB holds the target already: nothing to read."""
    CATCH_UP = "catch_up"
    """The local DB holds an older version on the target's lineage: replay only the gap."""
    SNAPSHOT = "snapshot"
    """Restore the base snapshot, then replay."""
    EMPTY = "empty"
    """Start from the empty state, then replay every changelog from version 1, or from the newest
    full-state changelog on the lineage (one with an empty lineage, written by a rescale or rollback)."""


@dataclass(frozen=True)
class SkippedSnapshot:
    """A snapshot a plan passed over because it could not be restored (a repair)."""

    version: int
    checkpoint_id: str
    path: str
    reason: str


@dataclass(frozen=True)
class LoadPlan:
    """One resolved load: target, lineage, base, changelogs to replay, fallbacks."""

    store: StoreId
    version: int
    checkpoint_id: str
    source: LoadSource
    base: Ref | None
    """The local version (CATCH_UP/REUSE) or snapshot (SNAPSHOT) the replay starts from; None: version 0."""
    replay: tuple[Ref, ...]
    """Committed changelogs to replay on the base, oldest first; the last one is the target."""
    lineage: Lineage
    """The committed ancestors of the target this plan read, newest first (version - 1 downwards)."""
    fallbacks: tuple[Ref | None, ...] = ()
    """Older listed snapshots below the base, newest first, then None (replay from version 0): the
    bases `fall_back` tries, in order, if the base cannot be restored."""
    skipped: tuple[SkippedSnapshot, ...] = ()
    """Snapshots passed over as unreadable to reach this plan (each one is a repair)."""
    key_ranges: tuple[tuple[bytes, bytes | None], ...] | None = None
    """Key ranges to load (None: every key); reserved for rescale."""
    lineage_repairs: tuple[str, ...] = ()
    """Changelogs whose header named an attempt the commit records do not: the plan follows the commit
    records instead (each one is a repair)."""
    lineage_from: tuple[tuple[int, Ref], ...] = ()
    """(index into `lineage`, changelog whose header it was read from), in order: which file named an entry."""

    @property
    def repairs(self) -> int:
        return len(self.skipped) + len(self.lineage_repairs)

    @property
    def store_lineage(self) -> Lineage:
        """The lineage the loaded store extends: ancestors of the target down to the base (inclusive)."""
        if self.base is None:
            return self.lineage
        return tuple(e for e in self.lineage if e[0] >= self.base[0])

    def manifest_path(self) -> str | None:
        """Path of the base snapshot's manifest (None unless the plan restores a snapshot)."""
        if self.source is not LoadSource.SNAPSHOT or self.base is None:
            return None
        return self.store.manifest(*self.base)

    def describe(self) -> str:
        base = "version 0" if self.base is None else f"version {self.base[0]} ({self.base[1]})"
        replay = f"{self.replay[0][0]}..{self.replay[-1][0]}" if self.replay else "nothing"
        text = f"load {self.store} version {self.version} ({self.checkpoint_id}): {self.source.value} from {base}"
        text += f", replay {replay}"
        if self.fallbacks:
            text += ", fallbacks " + ", ".join("0" if f is None else str(f[0]) for f in self.fallbacks)
        if self.skipped:
            text += ", skipped bad snapshots " + ", ".join(s.path for s in self.skipped)
        if self.lineage_repairs:
            text += ", followed the commit records past the lineage of " + ", ".join(self.lineage_repairs)
        return text


class PlanSource(Protocol):
    """The metadata a plan is resolved from (the checkpoint location, or maintenance's inventory)."""

    store: StoreId

    def committed_id(self, version: int) -> str:
        """The committed checkpoint id of `version` (raises `LineageError` if not committed)."""
        ...

    def read_lineage(self, version: int, checkpoint_id: str) -> Lineage:
        """The lineage the changelog of (version, checkpoint_id) extends, newest first."""
        ...

    def list_snapshots(self) -> set[Ref]:
        """Every (version, id) with a snapshot manifest in the store."""
        ...


def resolve_load_plan(
    source: PlanSource,
    version: int,
    checkpoint_id: str,
    *,
    local: Ref | None = None,
    verify_commit: bool = True,
) -> LoadPlan:
    """Resolve how to load committed (version, checkpoint_id); `local` is what the local DB holds."""
    store = source.store
    target = (version, checkpoint_id)
    if version == 0:
        return LoadPlan(store, 0, checkpoint_id, LoadSource.EMPTY, None, (), ())
    if local == target:
        return LoadPlan(store, version, checkpoint_id, LoadSource.REUSE, local, (), ())
    if verify_commit:
        committed = source.committed_id(version)
        if committed != checkpoint_id:
            raise LineageError(
                f"checkpoint id {checkpoint_id} of version {version} of store {store} is not the committed "
                f"one ({committed}); only committed lineage is loaded"
            )
    head: Lineage = ()
    origins: tuple[tuple[int, Ref], ...] = ()
    if local is not None and local[0] < version:
        head = source.read_lineage(version, checkpoint_id)  # one header read, reused by the walk
        origins = ((0, target),)
        gap = version - 1 - local[0]
        # a header is a claim: replayed as it stands only if its entries are the versions below, one by one
        # (entries naming committed attempts of other versions would replay them out of order or skip one)
        consecutive = all(v == version - 1 - i for i, (v, _) in enumerate(head))
        on_lineage = consecutive and (
            len(head) == version - 1 if local[0] == 0 else gap < len(head) and head[gap] == local
        )
        if on_lineage:
            replay = (*reversed(head[:gap]), target)
            plan = LoadPlan(
                store, version, checkpoint_id, LoadSource.CATCH_UP, local, replay, head, lineage_from=origins
            )
            try:
                _check_lineage(source, plan)
                return plan
            except (_MismatchError, CheckpointFileNotFoundError):
                pass  # rebuild from a committed base: the lineage differs, or its records expired (a newer base)
    snaps = source.list_snapshots()
    return _resolved(source, target, head, origins, snaps.__contains__, (*sorted(snaps, reverse=True), None), ())


def fall_back(source: PlanSource, plan: LoadPlan, path: str, reason: str) -> LoadPlan:
    """The next plan after the base snapshot of `plan` proved unreadable (`path` names the bad file).

    Raises `LineageError` when no older base can be reached through committed changelogs.
    """
    if plan.source is not LoadSource.SNAPSHOT or plan.base is None:
        raise LineageError(f"load of {plan.store} version {plan.version} has no base snapshot to fall back from")
    bad = SkippedSnapshot(plan.base[0], plan.base[1], path, reason)
    skipped = (*plan.skipped, bad)
    excluded = {(s.version, s.checkpoint_id) for s in skipped}
    fallbacks = tuple(f for f in plan.fallbacks if f is None or f not in excluded)
    allowed = {f for f in fallbacks if f is not None}
    target = (plan.version, plan.checkpoint_id)
    if plan.lineage_repairs and isinstance(source, CheckpointPlanSource):  # the commit records are the lineage
        older = _walk(_Committed(source), target, plan.lineage, (), allowed.__contains__, fallbacks, skipped)
        return replace(older, lineage_repairs=plan.lineage_repairs)
    return _resolved(source, target, plan.lineage, plan.lineage_from, allowed.__contains__, fallbacks, skipped)


class _MismatchError(LineageError):
    """A plan names an attempt the commit records do not (internal: the caller repairs or re-raises)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(f"{message}: {path}")
        self.path = path


def _resolved(
    source: PlanSource,
    target: Ref,
    known: Lineage,
    origins: tuple[tuple[int, Ref], ...],
    usable: Callable[[Ref], bool],
    candidates: tuple[Ref | None, ...],
    skipped: tuple[SkippedSnapshot, ...],
) -> LoadPlan:
    """`_walk`, checked against the commit records; a plan that names an uncommitted attempt is walked again
    along the commit records alone (a lineage repair), or raises `LineageError` naming the changelog."""
    try:
        plan = _walk(source, target, known, origins, usable, candidates, skipped)
        _check_lineage(source, plan)
        return plan
    except _MismatchError as bad:
        if not isinstance(source, CheckpointPlanSource):
            raise LineageError(str(bad)) from None
        try:
            plan = _walk(_Committed(source), target, (), (), usable, candidates, skipped)
            _check_lineage(source, plan)
        except (LineageError, FileNotFoundError) as e:
            raise LineageError(f"{bad}; and no committed path is readable ({e})") from None
        log.warning("store %s: %s; loading version %d along the commit records instead", source.store, bad, target[0])
        return replace(plan, lineage_repairs=(bad.path,))


def _check_lineage(source: PlanSource, plan: LoadPlan) -> None:
    """Raise `_MismatchError` unless every changelog `plan` replays and the snapshot it starts from are the attempts
    the commit records name, and a chain that starts from empty above version 1 starts at a full-state changelog."""
    refs = list(plan.replay[:-1])
    if plan.source is LoadSource.SNAPSHOT and plan.base is not None:
        refs.append(plan.base)
    if not refs and not (plan.source is LoadSource.EMPTY and plan.replay and plan.replay[0][0] > 1):
        return
    committed = _committed_ids(source, [v for v, _ in refs])
    for v, cid in refs:
        if committed[v] != cid:
            raise _MismatchError(
                f"the lineage of store {plan.store} names ({v}, {cid}) but the commit record of version {v} names "
                f"{committed[v]}",
                _origin(source, plan, v),
            )
    if plan.source is LoadSource.EMPTY and plan.replay and plan.replay[0][0] > 1:
        first = plan.replay[0]
        if isinstance(source, CheckpointPlanSource) and not source.full_state(first[0]):
            raise _MismatchError(
                f"the changelog of version {first[0]} of store {plan.store} has an empty lineage, but the commit "
                "record of its version declares no full-state changelog",
                source.name_of(source.store.changelog(*first)),
            )


def _committed_ids(source: PlanSource, versions: list[int]) -> dict[int, str]:
    if isinstance(source, CheckpointPlanSource):
        return source.committed_ids(versions)
    return {v: source.committed_id(v) for v in versions}


def _origin(source: PlanSource, plan: LoadPlan, version: int) -> str:
    """The changelog whose header named `version`'s entry in the plan's lineage."""
    return _named_by(source, plan.lineage_from, plan.version - 1 - version, (plan.version, plan.checkpoint_id))


def _walk(
    source: PlanSource,
    target: Ref,
    known: Lineage,
    origins: tuple[tuple[int, Ref], ...],
    usable: Callable[[Ref], bool],
    candidates: tuple[Ref | None, ...],
    skipped: tuple[SkippedSnapshot, ...],
) -> LoadPlan:
    """Follow the lineage of `target` down to the newest usable snapshot on it (or version 1).

    `known` is the lineage read so far (newest first); a capped lineage costs one more header read.
    """
    store = source.store
    lineage = list(known)
    read_from = list(origins)
    chain: list[Ref] = [target]  # newest first, down to the version above the base
    base: Ref | None = None
    while True:
        top = chain[-1]
        if usable(top):
            base = chain.pop()
            break
        if top[0] == 1:
            break  # the base is the empty version 0
        entry = _entry_below(source, target, top, lineage, read_from)
        if entry is None:
            break  # a full-state changelog (written by a rescale or a rollback): replay from empty
        chain.append(entry)
    tail = tuple(f for f in candidates if base is not None and (f is None or f[0] < base[0]))
    source_kind = LoadSource.SNAPSHOT if base is not None else LoadSource.EMPTY
    return LoadPlan(
        store,
        target[0],
        target[1],
        source_kind,
        base,
        tuple(reversed(chain)),
        tuple(lineage),
        tail,
        skipped,
        lineage_from=tuple(read_from),
    )


def _entry_below(
    source: PlanSource, target: Ref, top: Ref, lineage: list[Ref], read_from: list[tuple[int, Ref]] | None = None
) -> Ref | None:
    """The committed version below `top` on the lineage of `target` (None: `top` is a full-state changelog).

    `lineage` is what was read so far, newest first; a capped lineage costs one more header read, noted in
    `read_from` as (where its entries start in `lineage`, `top`).
    """
    depth = target[0] - top[0]  # lineage[depth] is the entry below top
    if depth >= len(lineage):
        try:
            more = source.read_lineage(*top)
        except FileNotFoundError:
            if top != target and _is_uncommitted(source, top):  # a header named an attempt that is not there
                raise _MismatchError(
                    f"the lineage of store {source.store} names ({top[0]}, {top[1]}), which is not committed",
                    _named_by(source, read_from or (), depth - 1, target),
                ) from None
            raise
        if not more:
            return None
        if read_from is not None:
            read_from.append((len(lineage), top))
        lineage.extend(more)
    entry = lineage[depth]
    if entry[0] != top[0] - 1:
        raise _MismatchError(
            f"lineage of store {source.store} jumps from version {top[0]} to {entry[0]}",
            _named_by(source, read_from or (), depth, target),
        )
    return entry


def _is_uncommitted(source: PlanSource, ref: Ref) -> bool:
    try:
        return source.committed_id(ref[0]) != ref[1]
    except (LineageError, FileNotFoundError):
        return False  # no record to tell: the missing file is what the caller reports


def _named_by(source: PlanSource, read_from: Iterable[tuple[int, Ref]], depth: int, target: Ref) -> str:
    """The changelog whose header holds entry `depth` of a lineage read as `read_from` says."""
    found = target
    for start, ref in read_from:
        if start <= depth:
            found = ref
    path = source.store.changelog(*found)
    return source.name_of(path) if isinstance(source, CheckpointPlanSource) else path


def committed_range(source: PlanSource, plan: LoadPlan, first: int) -> tuple[Ref, ...]:
    """The committed (version, id) of every version from `first` to the plan's target, oldest first.

    Read from the lineage the plan already holds (the target's changelog names its committed
    ancestors), extended by one changelog header read each time that lineage was capped; so a range
    of N versions costs no commit record, where asking the commit log costs N. Below a full-state
    changelog (a rescale or a rollback: its lineage is empty) the commit records name the rest.
    """
    if not 1 <= first <= plan.version:
        raise LineageError(
            f"versions {first}..{plan.version} of store {plan.store}: the range starts below 1 or is empty"
        )
    refs: list[Ref] = [(plan.version, plan.checkpoint_id)]
    lineage = list(plan.lineage)
    while refs[-1][0] > first:
        entry = _entry_below(source, refs[0], refs[-1], lineage)
        if entry is None:
            break
        refs.append(entry)
    refs.extend((v, source.committed_id(v)) for v in range(refs[-1][0] - 1, first - 1, -1))
    return tuple(reversed(refs))


class CheckpointPlanSource:
    """`PlanSource` on the checkpoint location: commit records, changelog headers, one listing."""

    def __init__(self, fm: CheckpointFileManager, store: StoreId, commit_log: CommitLog | None = None) -> None:
        self.fm = fm
        self.store = store
        self.commit_log = commit_log or CommitLog(fm)
        self.newest_listed = ""
        """Newest manifest name listed so far (a later listing can start after it)."""

    def committed_id(self, version: int) -> str:
        return self.commit_log.committed_id(version, self.store.operator, self.store.partition)

    def committed_ids(self, versions: list[int]) -> dict[int, str]:
        """The committed id of each of `versions` for this store, the records fetched ahead in parallel.

        A missing record raises `CheckpointFileNotFoundError` (expiry removed it beside this load: a plan
        made again starts from the newer base); a record without this store, `LineageError`."""
        records = self.commit_log.records(versions)
        out: dict[int, str] = {}
        for v in versions:
            record = records.get(v)
            if record is None:
                raise CheckpointFileNotFoundError(
                    f"version {v} of store {self.store} has no commit record", self.name_of(commit_path(v))
                )
            cid = record.checkpoint_id(self.store.operator, self.store.partition)
            if cid is None:
                raise LineageError(f"the commit of version {v} names no attempt of store {self.store}")
            out[v] = cid
        return out

    def full_state(self, version: int) -> bool:
        """Whether the commit record of `version` declares this store's changelog full-state (a rescale or rollback)."""
        record = self.commit_log.get(version)
        return record is not None and record.full_state(self.store.operator, self.store.partition)

    def name_of(self, path: str) -> str:
        return f"{self.fm.root_uri}/{path}"

    def read_lineage(self, version: int, checkpoint_id: str) -> Lineage:
        path = self.store.changelog(version, checkpoint_id)
        name = f"{self.fm.root_uri}/{path}"
        with self.fm.open(path) as f:
            header = read_header(f, name)
        check_header(self.store, header, version, checkpoint_id, name)
        return header.lineage

    def list_snapshots(self, start_after: str = "") -> set[Ref]:
        found: set[Ref] = set()
        for info in self.fm.list(self.store.snapshot_dir(), start_after=start_after or None):
            parsed = parse_versioned_name(info.path)
            if parsed is not None and parsed[2] == MANIFEST_SUFFIX:
                found.add((parsed[0], parsed[1]))
                self.newest_listed = max(self.newest_listed, info.path)
        return found


class _Committed:
    """The plan source whose lineages are the commit records' (a lineage repair): no header is trusted."""

    def __init__(self, source: CheckpointPlanSource) -> None:
        self._source = source
        self.store = source.store

    def committed_id(self, version: int) -> str:
        return self._source.committed_id(version)

    def read_lineage(self, version: int, checkpoint_id: str) -> Lineage:
        if self._source.full_state(version):
            return ()
        versions = list(range(version - 1, max(0, version - 1 - _COMMITTED_CHUNK), -1))
        ids = self._source.committed_ids(versions)
        out: list[Ref] = []
        for u in versions:
            out.append((u, ids[u]))
            if self._source.full_state(u):
                break
        return tuple(out)

    def list_snapshots(self) -> set[Ref]:
        return self._source.list_snapshots()


_COMMITTED_CHUNK = 64
"""Versions a lineage repair reads commit records for at a time."""


def check_header(store: StoreId, header: ChangelogHeader, version: int, checkpoint_id: str, name: str) -> None:
    """Raise `CorruptFileError` unless the changelog header names the identity its file name says."""
    expected = (store.operator, store.partition, version, checkpoint_id)
    got = (header.operator, header.partition, header.version, header.checkpoint_id)
    if got != expected:
        raise CorruptFileError(f"changelog header says {got}, its name says {expected}", name)


def check_parent(store: StoreId, header: ChangelogHeader, parent_id: str, name: str) -> None:
    """Raise `LineageError` unless the changelog of a committed version extends `parent_id`, the committed
    attempt of the version before it (a well-framed changelog built on a losing attempt holds the wrong
    changes)."""
    version = header.version
    if version > 1 and (not header.lineage or header.lineage[0] != (version - 1, parent_id)):
        raise LineageError(
            f"the changelog of committed version {version} of store {store} extends "
            f"{header.lineage[0] if header.lineage else 'nothing'}, not committed ({version - 1}, {parent_id}): {name}"
        )


def check_full_state(store: StoreId, header: ChangelogHeader, name: str) -> None:
    """Raise `LineageError` unless a changelog its commit record declares full-state (a rescale or rollback wrote
    it: a chain starts there) names no lineage: the record is a claim, and a changelog of changes replayed from the
    empty state builds a state without everything before it (expiry, taking it as a base, deletes what it needs)."""
    if header.lineage:
        raise LineageError(
            f"the commit record of version {header.version} of store {store} declares its changelog full-state, but "
            f"its header extends {header.lineage[0]}: {name}"
        )


__all__ = [
    "CheckpointPlanSource",
    "LoadPlan",
    "LoadSource",
    "PlanSource",
    "Ref",
    "SkippedSnapshot",
    "check_full_state",
    "check_header",
    "check_parent",
    "committed_range",
    "fall_back",
    "resolve_load_plan",
]
