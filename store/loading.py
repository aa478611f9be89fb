"""Executing a `LoadPlan` on a store's local RocksDB: restore the base, replay the changelogs.

This is the one route every load takes (`StateStore.load` resolves a plan and hands it here). It is
also where snapshot repair happens (DESIGN invariant 10): when the base snapshot cannot be restored
(missing or corrupt SST, bad or truncated manifest), the executor logs a warning naming the file,
takes the plan's next fallback (an older snapshot, or replay from version 0) and counts the repair
in the load metrics. Only when no base can be reached through committed changelogs does the load
raise, naming the bad snapshot.

It is also where a load survives expiry running beside it (docs/maintenance.md, "Why that is safe"):
expiry deletes a snapshot, or changelogs after it, only once a newer snapshot exists. So when a file
the plan names is missing and a fresh listing finds a newer base than the plan's, the load was racing
expiry, not reading a broken checkpoint: it starts over from the newer base (at most
`MAX_REPLANS` times) instead of repairing.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import TYPE_CHECKING, Any, Protocol

import rocksdict as rd

from statekeeper.store.errors import (
    CheckpointError,
    ConfigurationError,
    CorruptFileError,
    LineageError,
    UnsupportedFormatError,
    VersionExpiredError,
)
from statekeeper.store.files.read_ahead import ReadAhead
from statekeeper.store.formats.changelog import ChangelogReader, Lineage, RangeDelete, SstFile
from statekeeper.store.load_plan import (
    CheckpointPlanSource,
    LoadPlan,
    LoadSource,
    Ref,
    SkippedSnapshot,
    check_full_state,
    check_header,
    fall_back,
    resolve_load_plan,
)
from statekeeper.store.rocks import db_options, flush_all, ingest_sst, open_db, relieve_memory_pressure
from statekeeper.store.snapshot import read_manifest, restore_snapshot

if TYPE_CHECKING:
    from statekeeper.store.files import CheckpointFileManager
    from statekeeper.store.layout import StoreId

log = logging.getLogger(__name__)

_UNREADABLE_SNAPSHOT = (CorruptFileError, UnsupportedFormatError, FileNotFoundError)
"""What restoring a snapshot raises when one of its files is missing, truncated or corrupt (not a
transient or permission error of the storage: those propagate, a fallback would not help)."""

MAX_REPLANS = 3
"""How often one load starts over from a newer snapshot after expiry removed a file it was about to
read. Each start is from a strictly newer base at or below the target, and expiry removes a snapshot
of a retained version only once a newer one is the base: one start is the rule (a writer's head does
not move while its own task loads), the bound only guards against a store changing under the load."""


@dataclass(frozen=True)
class LoadMetrics:
    load_ms: float
    reused_local: bool
    snapshot_version: int | None
    replayed_changelogs: int
    replayed_records: int
    repaired_snapshots: int = 0
    """Unreadable snapshots the load passed over (each logged as a warning naming the file)."""
    replans: int = 0
    """Times the load started over from a newer snapshot because expiry removed a file it needed."""


class LoadSettings(Protocol):
    """The settings a load reads (`StoreConfig` has them)."""

    @property
    def max_lineage(self) -> int: ...

    @property
    def replay_batch_bytes(self) -> int: ...

    @property
    def read_ahead(self) -> int: ...

    @property
    def bulk_replay(self) -> bool: ...


class PlanExecution:
    """The load half of `StateStore` (a mixin): executes plans on the local DB it owns."""

    fm: CheckpointFileManager
    store_id: StoreId
    config: LoadSettings
    plan_source: CheckpointPlanSource
    _db: rd.Rdict | None
    _db_dir: str
    _work: str
    _cfs: Mapping[str, object]
    _lineage: Lineage

    def _make_cf(self, name: str) -> object:
        raise NotImplementedError

    def _handle_of(self, cf_name: str) -> Any:
        """The handle of column family `cf_name`, created on first use."""
        raise NotImplementedError

    def _discard_local(self) -> None:
        raise NotImplementedError

    def plan_load(self, version: int, checkpoint_id: str | None = None, *, use_local: bool = True) -> LoadPlan:
        raise NotImplementedError

    def _load(self, version: int, checkpoint_id: str | None) -> tuple[LoadPlan, LoadMetrics]:
        """Plan and execute a load; returns the plan taken (after any fallback or replan)."""
        replans = 0
        try:
            plan = self.plan_load(version, checkpoint_id)
        except FileNotFoundError as e:  # expiry removed a changelog the walk reached after the listing
            self._log_replan(e, version, "planning again")
            plan, replans = self.plan_load(version, checkpoint_id, use_local=False), 1  # lists the newer base
        while True:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s", plan.describe())
            try:
                plan, metrics = self._execute(plan)
                return plan, replace(metrics, replans=replans) if replans else metrics
            except VersionExpiredError:
                raise
            except FileNotFoundError as e:
                newer = self._newer_plan(plan) if replans < MAX_REPLANS else None
                if newer is None:
                    if (expired := self._base_expired(plan, e)) is not None:
                        raise expired from e
                    if plan.lineage_repairs:
                        raise LineageError(
                            f"the lineage named by {plan.lineage_repairs[0]} is not committed, and the committed "
                            f"path of version {version} of store {self.store_id} is not there either ({e})"
                        ) from e
                    raise
                self._log_replan(
                    e, version, f"loading from the snapshot of version {newer.base[0] if newer.base else 0}"
                )
                plan, replans = newer, replans + 1

    def _log_replan(self, e: FileNotFoundError, version: int, then: str) -> None:
        log.info(
            "store %s: %s was expired while loading version %d; %s",
            self.store_id,
            getattr(e, "path", None) or e,
            version,
            then,
        )

    def _execute(self, plan: LoadPlan) -> tuple[LoadPlan, LoadMetrics]:
        """Make the local DB hold the plan's target; returns the plan taken (after any fallback)."""
        if plan.source is LoadSource.REUSE:
            return plan, LoadMetrics(0.0, True, None, 0, 0)
        if plan.source is LoadSource.CATCH_UP:
            records = self._replay_all(plan)
            self._lineage = plan.lineage
            return plan, LoadMetrics(0.0, True, None, len(plan.replay), records)
        plan = self._restore_base(plan)
        try:
            records = self._replay_all(plan)
        except _UNREADABLE_SNAPSHOT as e:
            if not plan.skipped or (isinstance(e, FileNotFoundError) and self._newer_plan(plan)):
                raise
            raise _no_intact_path(plan, e) from e
        self._lineage = plan.store_lineage[: self.config.max_lineage]
        snapshot = plan.base[0] if plan.base is not None else None
        return plan, LoadMetrics(0.0, False, snapshot, len(plan.replay), records, plan.repairs)

    def _newer_plan(self, plan: LoadPlan) -> LoadPlan | None:
        """A fresh plan from the checkpoint as it is now, if it starts from a newer base than `plan`
        (a catch-up's base is the local version) and than every snapshot `plan` passed over as
        unreadable: then expiry removed what `plan` read, else None."""
        try:
            fresh = resolve_load_plan(self.plan_source, plan.version, plan.checkpoint_id, verify_commit=False)
        except (CheckpointError, LineageError):
            return None
        old = max([plan.base[0] if plan.base is not None else 0, *(s.version for s in plan.skipped)])
        return fresh if fresh.base is not None and fresh.base[0] > old else None

    def _base_expired(self, plan: LoadPlan, e: Exception) -> VersionExpiredError | None:
        """What a file of `plan` found missing means when no newer base is left to start over from, if the plan's
        base manifest is gone too: expiry deleted them beside this load (it deletes a snapshot's manifest first,
        then its SSTs, then the changelogs), so the version left retention; not a broken snapshot."""
        manifest = plan.manifest_path()
        if not isinstance(e, FileNotFoundError) or manifest is None or self.fm.exists(manifest):
            return None
        base = plan.base[0] if plan.base is not None else 0
        return VersionExpiredError(
            f"version {plan.version} of store {plan.store} left retention while it loaded: maintenance expired "
            f"the snapshot of version {base} it was loading from, and no newer base at or below it exists; load "
            "a newer version",
            f"{self.fm.root_uri}/{manifest}",
        )

    def _restore_base(self, plan: LoadPlan) -> LoadPlan:
        """Restore the plan's base (falling back past unreadable snapshots) and open the DB."""
        while True:
            self._discard_local()
            manifest_path = plan.manifest_path()
            if manifest_path is None or plan.base is None:
                break
            try:
                manifest = read_manifest(self.fm, self.store_id, *plan.base)
                restore_snapshot(self.fm, self.store_id, manifest, self._db_dir, manifest_path=manifest_path)
                self._open_restored(f"{self.fm.root_uri}/{manifest_path}")
                return plan
            except _UNREADABLE_SNAPSHOT as e:
                if isinstance(e, FileNotFoundError) and self._newer_plan(plan) is not None:
                    raise  # expired beside this load, not broken: `_load` starts over from the newer base
                bad = getattr(e, "path", None) or f"{self.fm.root_uri}/{manifest_path}"
                try:
                    older = fall_back(self.plan_source, plan, bad, str(e))
                except (*_UNREADABLE_SNAPSHOT, LineageError) as why:
                    if (expired := self._base_expired(plan, e)) is not None:
                        raise expired from e
                    self._warn_unreadable(plan, bad, e)
                    base = plan.base or (0, "")
                    skipped = replace(plan, skipped=(*plan.skipped, SkippedSnapshot(*base, bad, str(e))))
                    raise _no_intact_path(skipped, why) from e
                self._warn_unreadable(plan, bad, e)
                plan = older
                log.debug("%s", plan.describe())
        self._db = open_db(self._db_dir, self._cfs, bulk_replay=self.config.bulk_replay)  # handles stay valid
        for name in rd.Rdict.list_cf(self._db_dir, db_options()):
            self._make_cf(name)
        return plan

    def _open_restored(self, name: str) -> None:
        """Open the restored snapshot: a snapshot is a base only once it opened (DESIGN invariant 14).

        Whatever RocksDB refuses (rocksdict raises a bare `Exception`) or a missing CURRENT (RocksDB would
        create an empty DB instead) is a `CorruptFileError` naming the manifest, so the load repairs around it
        (invariant 10). What it holds once open is maintenance's check (the manifest's key count and digest):
        a load only pays for the open."""
        if not os.path.exists(os.path.join(self._db_dir, "CURRENT")):
            raise CorruptFileError("the snapshot has no CURRENT file, so RocksDB would open an empty DB", name)
        try:
            self._db = open_db(self._db_dir, self._cfs, bulk_replay=self.config.bulk_replay)  # handles stay valid
            for cf in rd.Rdict.list_cf(self._db_dir, db_options()):
                self._make_cf(cf)
        except Exception as e:  # rocksdict has no exception classes: anything is a bad snapshot
            self._discard_local()
            raise CorruptFileError(f"RocksDB cannot open the restored snapshot ({e})", name) from None

    def _warn_unreadable(self, plan: LoadPlan, bad: str, e: Exception) -> None:
        log.warning(
            "store %s: the snapshot of version %d is unreadable (%s); loading version %d without it",
            self.store_id,
            plan.base[0] if plan.base else 0,
            e if bad in str(e) else f"{bad}: {e}",
            plan.version,
        )

    def _replay_all(self, plan: LoadPlan) -> int:
        """Replay the plan's changelogs onto the open DB as one (`ChangelogReplay`); returns the record count."""
        assert self._db is not None
        bulk = self.config.bulk_replay
        replay = ChangelogReplay(self._db, self._handle_of, self._work, self.config.replay_batch_bytes, merge=not bulk)
        records = 0
        # a chain from the empty state above version 1 starts at a full-state changelog (`_check_lineage` holds its
        # commit record to that): its header must say so too, or it holds changes, not the state before them
        from_empty = plan.source is LoadSource.EMPTY and bool(plan.replay) and plan.replay[0][0] > 1
        for reader in read_changelogs(self.fm, self.store_id, plan.replay, self._work, self.config.read_ahead):
            if from_empty:
                try:
                    check_full_state(self.store_id, reader.header, reader.name)
                except LineageError as e:  # the load's error for a file that is not what it claims
                    raise CorruptFileError(str(e), reader.name) from None
                from_empty = False
            records += replay.add(reader)
        replay.write()
        if bulk and records:
            flush_all(self._db, self._cfs)  # sorts the vector memtables now, outside the GIL, not at each read
        return records


def read_changelogs(
    fm: CheckpointFileManager, store: StoreId, refs: Sequence[Ref], work_dir: str, read_ahead: int
) -> Iterator[ChangelogReader]:
    """The committed changelogs `refs` of `store` in order, each with its header checked against its name and its
    footer checked, the next `read_ahead` fetched meanwhile (S3 objects spooled under `work_dir`)."""
    paths = [store.changelog(v, c) for v, c in refs]
    with ReadAhead(fm, paths, work_dir, read_ahead) as files:
        for (version, checkpoint_id), path, f in zip(refs, paths, files, strict=True):
            with f:
                name = f"{fm.root_uri}/{path}"
                reader = ChangelogReader(f, name)
                check_header(store, reader.header, version, checkpoint_id, name)
                reader.check_footer()
                yield reader


MERGE_BYTES = 8 << 20
"""A replay buffers at most about this many bytes of decoded record blocks before writing them."""


class ChangelogReplay:
    """Applies consecutive checked changelogs to `db` as one: their record blocks are merged per column
    family (a key's last value wins, a delete is kept as such) and written in one write batch per ~`batch_bytes`
    (at most, and by default, `MERGE_BYTES`) of buffered records, so a key updated in many of them is written once.

    Only the state after the last changelog is ever read, so the versions in between need not exist in the DB:
    RocksDB inserts, sorts and flushes each surviving key once instead of once per update (a snapshot build of
    20 changelogs, each updating a tenth of the keys: its flush ~40% less CPU, the whole build 13-16% less).
    An SST block or a range delete writes what is buffered first (it must apply after it). `handle_of` maps a
    column family name to its handle (creating it if need be); SST blocks are copied into `work_dir` and
    ingested.

    Without `merge` (vector memtables: `StoreConfig.bulk_replay`) the blocks are written as they are: a vector
    memtable appends an update as cheaply as the merge would, and its flush keeps each key's newest."""

    def __init__(
        self,
        db: rd.Rdict,
        handle_of: Callable[[str], Any],
        work_dir: str,
        batch_bytes: int = MERGE_BYTES,
        *,
        merge: bool = True,
    ) -> None:
        self._db, self._handle_of, self._work = db, handle_of, work_dir
        self._limit = min(batch_bytes, MERGE_BYTES)
        self._merge = merge
        self._pending: dict[str, dict[bytes, bytes | None]] = {}
        self._blocks: list[tuple[str, Sequence[bytes], Sequence[bytes | None]]] = []
        self._bytes = 0

    def add(self, reader: ChangelogReader) -> int:
        """Apply the records of `reader` (its header and footer checked); returns how many it holds."""
        records = 0
        for entry in reader.entries(self._work):
            if isinstance(entry, SstFile):
                self.write()  # order matters: the SST's records are newer than those buffered
                self._family(entry.cf, reader)
                try:
                    ingest_sst(self._db.get_column_family(entry.cf), entry.path)
                except Exception as e:  # rocksdict has no exception classes: the block's file is not an SST it takes
                    raise CorruptFileError(f"an SST block does not ingest ({str(e)[:300]})", reader.name) from None
                finally:
                    if os.path.exists(entry.path):
                        os.unlink(entry.path)
                records += entry.records
            elif isinstance(entry, RangeDelete):
                self.write()
                wb = rd.WriteBatch(raw_mode=True)
                wb.delete_range(entry.start, entry.end, self._family(entry.cf, reader))
                self._db.write(wb)
                records += 1
            else:
                cf_name, keys, values = entry
                self._family(cf_name, reader)
                if not self._merge:
                    self._blocks.append((cf_name, keys, values))
                elif (pending := self._pending.get(cf_name)) is not None:
                    pending.update(zip(keys, values, strict=True))  # `decode_block_payload` checked their counts
                else:
                    self._pending[cf_name] = dict(zip(keys, values, strict=True))
                records += len(keys)
                self._bytes += reader.block_bytes
                if self._bytes >= self._limit:
                    self.write()
        return records

    def _family(self, name: str, reader: ChangelogReader) -> Any:
        """The handle of column family `name`, created here on first use: a changelog naming more than a store
        may have (`MAX_COLUMN_FAMILIES`) is corrupt, named."""
        try:
            return self._handle_of(name)
        except ConfigurationError as e:
            raise CorruptFileError(str(e), reader.name) from None

    def write(self) -> None:
        """Write what is buffered (call once after the last `add`)."""
        if not self._pending and not self._blocks:
            return
        wb = rd.WriteBatch(raw_mode=True)
        try:
            for cf_name, pending in self._pending.items():  # once per merged key, not per update
                _batch_updates(wb, self._handle_of(cf_name), pending.keys(), pending.values())
            for cf_name, keys, values in self._blocks:
                _batch_updates(wb, self._handle_of(cf_name), keys, values)
            self._db.write(wb)
        finally:
            # A traceback keeps this frame alive: drop its reference into the DB (the write batch), or closing
            # the DB after a failed replay leaves it locked and the next load of the store fails with "lock hold
            # by current process".
            wb = None  # type: ignore[assignment]
            self._pending, self._blocks, self._bytes = {}, [], 0
        relieve_memory_pressure()


def _batch_updates(wb: rd.WriteBatch, handle: Any, keys: Iterable[bytes], values: Collection[bytes | None]) -> None:
    """Add puts (and deletes: a None value) of `keys` to `wb` in column family `handle`."""
    put, delete = wb.put, wb.delete
    try:
        if None in values:
            for k, val in zip(keys, values, strict=True):
                if val is None:
                    delete(k, handle)
                else:
                    put(k, val, handle)
        else:  # puts only: the loop in C
            deque(map(put, keys, values, repeat(handle, len(values))), maxlen=0)
    finally:
        del wb, handle, put, delete  # as in `ChangelogReplay.write`: a traceback holds this frame


def load_bytes(fm: CheckpointFileManager, plan: LoadPlan | None) -> int:
    """Bytes a load by `plan` read from the checkpoint: its base snapshot (manifest and SSTs) and changelogs."""
    if plan is None or plan.source is LoadSource.REUSE:
        return 0
    total = 0
    manifest = plan.manifest_path()
    if manifest is not None and plan.base is not None:
        total += fm.info(manifest).size + read_manifest(fm, plan.store, *plan.base).total_sst_bytes
    return total + sum(fm.info(plan.store.changelog(v, c)).size for v, c in plan.replay)


def _no_intact_path(plan: LoadPlan, why: BaseException) -> CorruptFileError:
    first = plan.skipped[0]
    return CorruptFileError(
        f"version {plan.version} of store {plan.store} cannot load: its snapshot of version {first.version} is "
        f"unreadable ({first.reason}) and no intact older base is reachable through committed changelogs "
        f"({why})",
        first.path,
    )


__all__ = ["MAX_REPLANS", "ChangelogReplay", "LoadMetrics", "PlanExecution", "load_bytes", "read_changelogs"]
