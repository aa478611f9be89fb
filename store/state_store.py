"""The state store: RocksDB-backed state of one (operator, partition) that commits changelogs.

Per micro-batch: `load(version, checkpoint_id)` -> reads and writes -> `commit()` (or `abort()`).
Updates go straight into the local RocksDB (no WAL) and into a changelog streamed to local disk in
bounded blocks; commit publishes that changelog atomically under a fresh checkpoint id. Commit never
snapshots the state: the maintenance process does that.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import rocksdict as rd

from statekeeper.store.column_family import ColumnFamily
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.config import StoreConfig
from statekeeper.store.errors import StoreStateError
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.formats.changelog import ChangelogHeader, ChangelogWriter, Lineage
from statekeeper.store.formats.names import validate_column_family
from statekeeper.store.layout import StoreId, new_checkpoint_id, validate_checkpoint_id, validate_version
from statekeeper.store.load_plan import CheckpointPlanSource, LoadPlan, resolve_load_plan
from statekeeper.store.loading import LoadMetrics, PlanExecution
from statekeeper.store.rocks import (
    DEFAULT_CF,
    check_family_count,
    db_options,
    open_db,
    relieve_memory_pressure,
    track_memtable,
    untrack_memtables,
    write_options,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitMetrics:
    commit_ms: float
    changelog_bytes: int
    records: int
    num_keys: int


@dataclass(frozen=True)
class CommitResult:
    version: int
    checkpoint_id: str
    metrics: CommitMetrics


class StateStore(PlanExecution):
    """State of one (operator, partition) under a checkpoint root.

    Not thread-safe: one task uses one instance at a time, as in Spark.
    """

    config: StoreConfig
    _cfs: dict[str, ColumnFamily]

    def __init__(
        self,
        root: str | CheckpointFileManager,
        operator: str,
        partition: int,
        *,
        config: StoreConfig | None = None,
    ) -> None:
        self.fm: CheckpointFileManager = open_file_manager(root) if isinstance(root, str) else root
        self.store_id = StoreId(operator, partition)
        self.config = config or StoreConfig()
        self.commit_log = CommitLog(self.fm)
        if self.config.local_dir is not None:
            self._work = os.path.abspath(self.config.local_dir)
            os.makedirs(self._work, exist_ok=True)
            self._owns_work = False
        else:
            self._work = tempfile.mkdtemp(prefix=f"statekeeper-{operator}-{partition}-")
            self._owns_work = True
        self._db_dir = os.path.join(self._work, "db")
        self._db: rd.Rdict | None = None
        self._cfs: dict[str, ColumnFamily] = {}
        self._loaded: tuple[int, str] | None = None  # (version, id) the local DB holds exactly
        self._lineage: Lineage = ()  # lineage of the loaded version, newest first
        self._writer: ChangelogWriter | None = None
        self._before_commit: list[Callable[[], None]] = []
        self._commits_since_check = 0
        self.plan_source = CheckpointPlanSource(self.fm, self.store_id, self.commit_log)
        self.last_load: LoadMetrics | None = None
        self.last_plan: LoadPlan | None = None
        """The plan the last load executed (after any snapshot repair)."""

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def version(self) -> int | None:
        return self._loaded[0] if self._loaded else None

    @property
    def checkpoint_id(self) -> str | None:
        return self._loaded[1] if self._loaded else None

    @property
    def local_dir(self) -> str:
        return self._work

    def load(self, version: int, checkpoint_id: str | None = None) -> StateStore:
        """Make the store hold committed `version` and open it for this batch's updates.

        Reuses the local DB when it holds exactly (version, checkpoint_id); catches it up by replaying
        only the missing changelogs when it holds an older version on the same lineage (a task that
        last ran this partition a few batches ago); otherwise rebuilds it from the newest snapshot on
        the lineage plus changelog replay. Without `checkpoint_id` the committed one is read from the
        commit record.
        """
        validate_version(version)
        if self._writer is not None:
            self.abort()
        t0 = time.perf_counter()
        try:
            plan, metrics = self._load(version, checkpoint_id)
        except BaseException:
            self._discard_local()
            raise
        self._start_attempt(version, plan.checkpoint_id)
        self.last_plan = plan
        self.last_load = replace(metrics, load_ms=(time.perf_counter() - t0) * 1000)
        return self

    def begin_full_state(self, version: int) -> StateStore:
        """Open an empty store whose next commit (``version + 1``) is a full-state changelog.

        Its header has an empty lineage, so a load of it or of any later version on it replays from
        the empty state starting there: a rescale or a rollback writes each new partition this way
        and names the result in a commit record of its own (docs/formats.md, "Full-state changelogs").
        """
        validate_version(version)
        if self._writer is not None:
            self.abort()
        self._discard_local()
        self._db = open_db(self._db_dir, self._cfs, bulk_replay=self.config.bulk_replay)
        for name in rd.Rdict.list_cf(self._db_dir, db_options()):
            self._make_cf(name)
        self._start_attempt(version, "", full_state=True)
        self.last_plan = None
        return self

    def plan_load(self, version: int, checkpoint_id: str | None = None, *, use_local: bool = True) -> LoadPlan:
        """Resolve (without executing) how `load(version, checkpoint_id)` would rebuild the state
        (from the checkpoint alone, not catching up the local copy, unless `use_local`)."""
        validate_version(version)
        if version == 0:
            checkpoint_id = ""
        elif checkpoint_id is None:
            checkpoint_id = self.commit_log.committed_id(version, self.store_id.operator, self.store_id.partition)
        else:
            validate_checkpoint_id(checkpoint_id)
        usable = use_local and self._db is not None
        local = self._loaded if usable and os.path.exists(os.path.join(self._db_dir, "CURRENT")) else None
        return resolve_load_plan(
            self.plan_source, version, checkpoint_id, local=local, verify_commit=self.config.verify_commit
        )

    def commit(self) -> CommitResult:
        """Publish this batch's changelog atomically as version `loaded + 1` under a fresh id."""
        writer = self._writer
        if writer is None or self._loaded is None:
            raise StoreStateError(f"commit() without load() on store {self.store_id}")
        t0 = time.perf_counter()
        hooks, self._before_commit = self._before_commit, []
        for write_held in hooks:
            write_held()
        for cf in self._cfs.values():
            cf._flush()
            cf._close_for_writes()
        self._writer = None
        header = writer.header
        try:
            size = writer.finish()
            self.fm.put_file(writer.path, self.store_id.changelog(header.version, header.checkpoint_id))
        except BaseException:
            writer.abandon()
            self._loaded = None  # local DB holds uncommitted updates: rebuild on next load
            raise
        os.unlink(writer.path)
        self._loaded = (header.version, header.checkpoint_id)
        self._lineage = header.lineage
        self._commits_since_check += 1
        metrics = CommitMetrics(
            commit_ms=(time.perf_counter() - t0) * 1000,
            changelog_bytes=size,
            records=writer.records,
            num_keys=self.estimate_num_keys(),
        )
        log.debug("committed %s version %d (%s): %s", self.store_id, header.version, header.checkpoint_id, metrics)
        return CommitResult(header.version, header.checkpoint_id, metrics)

    def before_commit(self, write_held: Callable[[], None]) -> None:
        """Call `write_held` once, first thing at this batch's commit: writes a caller holds in memory (a list
        state's appends) reach the changelog whichever path commits. Forgotten by `abort` and the next load."""
        self._before_commit.append(write_held)

    def abort(self) -> None:
        """Discard this batch's updates; if there were any, the next load rebuilds the local DB.

        An attempt that wrote nothing (a read-only task, a batch without input) leaves the local DB
        holding the loaded version, so the next load of that version stays warm.
        """
        writer = self._writer
        self._writer = None
        self._before_commit.clear()
        wrote = writer is not None and writer.records > 0
        for cf in self._cfs.values():
            wrote = wrote or bool(cf._keys)
            cf._keys, cf._vals, cf._pending = [], [], 0
            cf._close_for_writes()
        if writer is not None:
            writer.abandon()
            if wrote:
                self._loaded = None

    def close(self, *, discard: bool = False) -> None:
        """Close the store; with `discard` (or a temporary work directory) its local DB is about to be
        deleted, so nothing is flushed."""
        self.abort()
        self._close_db(discard or self._owns_work)
        if self._owns_work:
            shutil.rmtree(self._work, ignore_errors=True)

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- data access ----------------------------------------------------------------------------
    def column_family(self, name: str = DEFAULT_CF) -> ColumnFamily:
        """The handle of column family `name`, created on first use."""
        db = self._db
        if db is None:
            raise StoreStateError(f"store {self.store_id} is not loaded: call load() first")
        cf = self._cfs.get(name)
        if cf is not None:
            return cf
        validate_column_family(name)
        check_family_count(len(self._cfs) + 1, f"store {self.store_id}", name)
        db.create_column_family(name, db_options(bulk_replay=self.config.bulk_replay))
        cf = self._make_cf(name)
        if self._writer is not None:
            cf._open_for_writes()
        return cf

    def column_families(self) -> list[str]:
        return sorted(self._cfs)

    def get(self, key: bytes, cf: str = DEFAULT_CF) -> bytes | None:
        return (self._cfs.get(cf) or self.column_family(cf)).get(key)

    def multi_get(self, keys: Sequence[bytes], cf: str = DEFAULT_CF) -> list[bytes | None]:
        return (self._cfs.get(cf) or self.column_family(cf)).multi_get(keys)

    def put(self, key: bytes, value: bytes, cf: str = DEFAULT_CF) -> None:
        (self._cfs.get(cf) or self.column_family(cf)).put(key, value)

    def delete(self, key: bytes, cf: str = DEFAULT_CF) -> None:
        (self._cfs.get(cf) or self.column_family(cf)).delete(key)

    def put_batch(self, keys: Any, values: Any, cf: str = DEFAULT_CF) -> None:
        self.column_family(cf).put_batch(keys, values)

    def put_sorted(self, items: Iterable[tuple[bytes, bytes]], cf: str = DEFAULT_CF) -> int:
        return self.column_family(cf).put_sorted(items)

    def delete_batch(self, keys: Any, cf: str = DEFAULT_CF) -> None:
        self.column_family(cf).delete_batch(keys)

    def delete_range(self, start: bytes, end: bytes | None = None, cf: str = DEFAULT_CF) -> None:
        self.column_family(cf).delete_range(start, end)

    def items(
        self, start: bytes | None = None, end: bytes | None = None, *, prefix: bytes | None = None, cf: str = DEFAULT_CF
    ) -> Iterator[tuple[bytes, bytes]]:
        return self.column_family(cf).items(start, end, prefix=prefix)

    def chunks(
        self, start: bytes | None = None, end: bytes | None = None, *, size: int = 8192, cf: str = DEFAULT_CF
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        return self.column_family(cf).chunks(start, end, size=size)

    def estimate_num_keys(self) -> int:
        return sum(c._db.property_int_value("rocksdb.estimate-num-keys") or 0 for c in self._cfs.values())

    @property
    def db(self) -> rd.Rdict:
        """The open local RocksDB (for snapshotting by maintenance); holds the loaded version."""
        if self._db is None:
            raise StoreStateError(f"store {self.store_id} is not loaded")
        return self._db

    # -- internals ------------------------------------------------------------------------------
    def _make_cf(self, name: str) -> ColumnFamily:
        assert self._db is not None
        sub = self._db if name == DEFAULT_CF else self._db.get_column_family(name)
        sub.set_write_options(write_options())
        cf = self._cfs.get(name)
        if cf is None:
            cf = self._cfs[name] = ColumnFamily(self, name, self.config.block_bytes)
        cf._bind(sub, self._db.get_column_family_handle(name))
        track_memtable(self, name, sub)
        return cf

    def _handle_of(self, cf_name: str) -> Any:
        return (self._cfs.get(cf_name) or self.column_family(cf_name))._handle

    def _log_block(
        self, cf: str, keys: Sequence[bytes], values: Sequence[bytes | None], parts: tuple[bytes, ...] | None = None
    ) -> None:
        assert self._writer is not None
        self._writer.append_block(cf, keys, values, parts)
        relieve_memory_pressure()

    def _changelog(self) -> ChangelogWriter:
        """The open attempt's changelog (bulk blocks are appended to it directly)."""
        assert self._writer is not None
        return self._writer

    def _start_attempt(self, version: int, checkpoint_id: str, *, full_state: bool = False) -> None:
        self._loaded = (version, checkpoint_id)
        lineage: Lineage = ((version, checkpoint_id), *self._lineage) if version > 0 and not full_state else ()
        if self.config.snapshot_check_interval and self._commits_since_check >= self.config.snapshot_check_interval:
            lineage = self._truncate_at_snapshot(lineage)
            self._commits_since_check = 0
        lineage = lineage[: self.config.max_lineage]
        new_id = new_checkpoint_id()
        header = ChangelogHeader(self.store_id.operator, self.store_id.partition, version + 1, new_id, lineage)
        path = os.path.join(self._work, f"pending-{version + 1:020d}_{new_id}.changelog")
        self._writer = ChangelogWriter(path, header, level=self.config.compression_level)
        self._before_commit.clear()
        for cf in self._cfs.values():
            cf._open_for_writes()

    def _truncate_at_snapshot(self, lineage: Lineage) -> Lineage:
        """Cut the lineage at the newest snapshot on it (listing only manifests newer than seen)."""
        snaps = self.plan_source.list_snapshots(start_after=self.plan_source.newest_listed)
        if not snaps:
            return lineage
        for i, entry in enumerate(lineage):
            if entry in snaps:
                return lineage[: i + 1]
        return lineage

    def _close_db(self, discard: bool = False) -> None:
        if self._db is not None and discard:
            # Dropped before their handles are let go: rocksdict flushes a column family's memtable when
            # the last handle goes (tens of ms per 100k records), a waste for what is deleted next.
            for name in self._cfs:
                if name != DEFAULT_CF:
                    with contextlib.suppress(Exception):  # a failed drop only costs that flush
                        self._db.drop_column_family(name)
        untrack_memtables(self)
        for cf in self._cfs.values():
            cf._unbind()
        if self._db is not None:
            self._db.close()
            self._db = None

    def _discard_local(self) -> None:
        self._close_db(discard=True)
        self._loaded = None
        self._lineage = ()
        shutil.rmtree(self._db_dir, ignore_errors=True)


__all__ = ["ColumnFamily", "CommitMetrics", "CommitResult", "LoadMetrics", "StateStore", "StoreConfig"]
