"""Ingest: what a catalog sync listed in the checkpoint location goes into the catalog here.

`statekeeper.maintenance.catalog_sync` reads the location (it knows the file layout; `statekeeper.sql` does not)
and feeds plain observations (`FileObservation`, `CommitObservation`, `SnapshotObservation`) through the `SyncWriter`
that `Catalog.sync_writer` returns. The writer records commits, versions, attempts, snapshots and files,
keeps the incremental listing cursors, and at `finish` derives attempt outcomes and file states
(`statekeeper.sql.file_states`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, case, func, select, update

from statekeeper.sql.base import CatalogBase, chunks, from_timestamp, table_of
from statekeeper.sql.file_states import derive_states, mark_paths_deleted
from statekeeper.sql.layouts import LayoutRow
from statekeeper.sql.models import (
    KIND_CHANGELOG,
    KIND_MANIFEST,
    KIND_SST,
    KIND_TEMP,
    OUTCOME_PENDING,
    STATE_DELETED,
    STATE_LIVE,
    STATE_ORPHAN,
    Attempt,
    CheckpointRoot,
    Commit,
    File,
    Layout,
    Snapshot,
    SnapshotSst,
    Store,
    SyncCursor,
    Version,
    utcnow,
)


@dataclass(frozen=True, slots=True)
class FileObservation:
    """One listed file; operator/partition/version/checkpoint_id as parsed from its name, if any."""

    path: str
    kind: str
    size: int
    mtime: float
    operator: str | None = None
    partition: int | None = None
    version: int | None = None
    checkpoint_id: str | None = None


@dataclass(frozen=True, slots=True)
class CommitObservation:
    """A commit record: the winning checkpoint id of every partition of every operator."""

    version: int
    committed_at: float
    checkpoint_ids: Mapping[str, Sequence[str]]
    layouts: Sequence[LayoutRow] = ()
    """Each operator's layout at this version (`statekeeper.sql.layouts.layout_rows`; an operator without
    a row: as many partitions as ids, legacy)."""
    batch_id: int | None = None
    """The batch this version follows (None: ``version - 1``)."""


@dataclass(frozen=True, slots=True)
class SnapshotObservation:
    operator: str
    partition: int
    version: int
    checkpoint_id: str
    manifest_path: str
    sst_files: Sequence[tuple[str, int]]
    """(path relative to the root, size) of every SST the manifest references."""
    num_keys: int
    created_at: float


@dataclass
class SyncStats:
    commits: int = 0
    files_seen: int = 0
    files_new: int = 0
    files_deleted: int = 0
    snapshots: int = 0


class SyncWriter:
    """Feeds what a sync listed into the catalog, then derives attempt outcomes and file states.

    Each `add_*` call is its own transaction and idempotent, so a sync that dies half way is simply
    run again. `finish()` derives states for what changed and, for a full pass, marks every file
    that was not listed as deleted.
    """

    def __init__(self, catalog: CatalogBase, uri: str, *, full: bool) -> None:
        self.catalog = catalog
        self.uri = uri
        self.full = full
        self.root_id = catalog.ensure_root(uri)
        self.stats = SyncStats()
        self._store_ids: dict[tuple[str, int], int] = {}
        self._seen: set[str] = set()
        self._min_version: int | None = None  # lowest version whose attempts/files need re-deriving
        self._sst_stores: set[int] = set()  # stores whose SST states need re-deriving
        self._frozen: set[int] = set()  # stores whose SST states must not be re-derived now
        with catalog.read() as conn:
            for sid, op, part in conn.execute(
                select(Store.id, Store.operator, Store.partition).where(Store.root_id == self.root_id)
            ):
                self._store_ids[(op, int(part))] = int(sid)
            self._cursors = {
                p: s
                for p, s in conn.execute(
                    select(SyncCursor.prefix, SyncCursor.start_after).where(SyncCursor.root_id == self.root_id)
                )
            }

    # cursors
    def cursor(self, prefix: str) -> str | None:
        """Where the last incremental listing of `prefix` ended (None: list from the start)."""
        return self._cursors.get(prefix)

    def set_cursors(self, cursors: Mapping[str, str]) -> None:
        changed = {p: s for p, s in cursors.items() if self._cursors.get(p) != s}
        if not changed:
            return
        rows = [{"root_id": self.root_id, "prefix": p, "start_after": s} for p, s in sorted(changed.items())]
        with self.catalog.write() as conn:
            for chunk in chunks(rows):
                ins = self.catalog.insert(SyncCursor)
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["root_id", "prefix"], set_={"start_after": ins.excluded.start_after}
                    ),
                    list(chunk),
                )
        self._cursors.update(changed)

    def freeze_store(self, operator: str, partition: int) -> None:
        """Leave the SST states of a store as they are in `finish` (a manifest of it could not be read)."""
        sid = self._store_ids.get((operator, partition))
        if sid is not None:
            self._frozen.add(sid)

    def known_commit_versions(self, versions: Iterable[int | None]) -> set[int]:
        """Which of `versions` have their commit record in the catalog already."""
        wanted = sorted({v for v in versions if v is not None})
        found: set[int] = set()
        with self.catalog.read() as conn:
            for chunk in chunks(wanted):
                found.update(
                    int(v)
                    for v in conn.execute(
                        select(Commit.version).where(Commit.root_id == self.root_id, Commit.version.in_(chunk))
                    ).scalars()
                )
        return found

    def known_stores(self) -> list[tuple[str, int]]:
        return sorted(self._store_ids)

    def latest_versions(self) -> dict[tuple[str, int], int]:
        """Latest committed version per store, as the catalog knows it now."""
        with self.catalog.read() as conn:
            rows = conn.execute(
                select(Store.operator, Store.partition, func.max(Version.version))
                .join(Version, Version.store_id == Store.id)
                .where(Store.root_id == self.root_id)
                .group_by(Store.operator, Store.partition)
            ).all()
        return {(op, int(p)): int(v) for op, p, v in rows}

    def _ensure_stores(self, conn: Connection, keys: Iterable[tuple[str, int]]) -> None:
        new = sorted({k for k in keys if k not in self._store_ids})
        if not new:
            return
        for chunk in chunks(new):
            conn.execute(
                self.catalog.insert(Store).on_conflict_do_nothing(index_elements=["root_id", "operator", "partition"]),
                [{"root_id": self.root_id, "operator": op, "partition": p} for op, p in chunk],
            )
        ops = sorted({op for op, _ in new})
        for sid, op, part in conn.execute(
            select(Store.id, Store.operator, Store.partition).where(
                Store.root_id == self.root_id, Store.operator.in_(ops)
            )
        ):
            self._store_ids[(op, int(part))] = int(sid)

    def _note_version(self, v: int | None) -> None:
        if v is not None and (self._min_version is None or v < self._min_version):
            self._min_version = v

    # commits
    def add_commits(self, commits: Sequence[CommitObservation]) -> list[tuple[str, int, int, str]]:
        """Record commit records (any order); returns (operator, partition, version, id) of the versions
        whose parent id is unknown because no record of version - 1 of that store is left; pass their
        changelog header's parent to `set_parents`.
        """
        if not commits:
            return []
        commits = sorted(commits, key=lambda c: c.version)
        unknown: list[tuple[str, int, int, str]] = []
        with self.catalog.write() as conn:
            self._ensure_stores(
                conn, ((op, p) for c in commits for op, ids in c.checkpoint_ids.items() for p in range(len(ids)))
            )
            ids_of: dict[tuple[int, int], str] = {}  # (store id, version) -> committed id, this batch
            for c in commits:
                for op, ids in c.checkpoint_ids.items():
                    for p, cid in enumerate(ids):
                        ids_of[(self._store_ids[(op, p)], c.version)] = cid
            need = {(sid, v - 1) for sid, v in ids_of if v > 1 and (sid, v - 1) not in ids_of}
            if need:
                need_versions = sorted({v for _, v in need})
                need_stores = sorted({s for s, _ in need})
                for vchunk in chunks(need_versions):
                    for schunk in chunks(need_stores):
                        for sid, v, cid in conn.execute(
                            select(Version.store_id, Version.version, Version.checkpoint_id).where(
                                Version.store_id.in_(schunk), Version.version.in_(vchunk)
                            )
                        ):
                            ids_of.setdefault((int(sid), int(v)), cid)
            commit_rows = []
            version_rows = []
            layout_rows = []
            by_sid = {sid: key for key, sid in self._store_ids.items()}
            for c in commits:
                at = from_timestamp(c.committed_at)
                commit_rows.append(
                    {
                        "root_id": self.root_id,
                        "version": c.version,
                        "committed_at": at,
                        "operators": len(c.checkpoint_ids),
                        "partitions": sum(len(ids) for ids in c.checkpoint_ids.values()),
                    }
                )
                named = {r.operator: r for r in c.layouts}
                for op, ids in sorted(c.checkpoint_ids.items()):
                    lay = named.get(op) or LayoutRow(op, c.version, len(ids), None)
                    layout_rows.append(
                        {
                            "root_id": self.root_id,
                            "operator": op,
                            "version": c.version,
                            "partitions": len(ids),
                            "max_key_groups": lay.max_key_groups,
                            "change": lay.change,
                            "batch_id": c.version - 1 if c.batch_id is None else c.batch_id,
                        }
                    )
                    for p, cid in enumerate(ids):
                        sid = self._store_ids[(op, p)]
                        parent = ids_of.get((sid, c.version - 1)) if c.version > 1 else None
                        if parent is None and c.version > 1:
                            unknown.append((*by_sid[sid], c.version, cid))
                        version_rows.append(
                            {
                                "store_id": sid,
                                "version": c.version,
                                "checkpoint_id": cid,
                                "parent_id": parent,
                                "committed_at": at,
                            }
                        )
            for chunk in chunks(commit_rows):
                ins = self.catalog.insert(Commit)
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["root_id", "version"],
                        set_={k: ins.excluded[k] for k in ("committed_at", "operators", "partitions")},
                    ),
                    list(chunk),
                )
            for chunk in chunks(layout_rows):
                ins = self.catalog.insert(Layout)
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["root_id", "operator", "version"],
                        set_={k: ins.excluded[k] for k in ("partitions", "max_key_groups", "change", "batch_id")},
                    ),
                    list(chunk),
                )
            vt = table_of(Version)
            for chunk in chunks(version_rows):
                ins = self.catalog.insert(Version)
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["store_id", "version"],
                        set_={
                            "checkpoint_id": ins.excluded.checkpoint_id,
                            "committed_at": ins.excluded.committed_at,
                            "parent_id": func.coalesce(ins.excluded.parent_id, vt.c.parent_id),
                        },
                    ),
                    list(chunk),
                )
        self.stats.commits += len(commits)
        self._note_version(commits[0].version)
        return unknown

    def set_parents(self, parents: Iterable[tuple[str, int, int, str]]) -> None:
        """(operator, partition, version, parent id) for versions `add_commits` could not link."""
        rows = [(self._store_ids[(op, p)], v, parent) for op, p, v, parent in parents if (op, p) in self._store_ids]
        if not rows:
            return
        with self.catalog.write() as conn:
            for sid, v, parent in rows:
                conn.execute(
                    update(Version)
                    .where(Version.store_id == sid, Version.version == v, Version.parent_id.is_(None))
                    .values(parent_id=parent)
                )

    # files
    def add_files(self, observations: Sequence[FileObservation]) -> None:
        if not observations:
            return
        now = utcnow()
        with self.catalog.write() as conn:
            self._ensure_stores(
                conn,
                ((o.operator, o.partition) for o in observations if o.operator is not None and o.partition is not None),
            )
            existing: dict[str, tuple[int, dt.datetime]] = {}
            for chunk in chunks([o.path for o in observations]):
                found = conn.execute(
                    select(File.path, File.size, File.mtime).where(
                        File.root_id == self.root_id, File.path.in_(chunk), File.state != STATE_DELETED
                    )
                )
                existing.update((path, (size, mtime)) for path, size, mtime in found)
            self.stats.files_seen += len(observations)
            self.stats.files_new += sum(1 for o in observations if o.path not in existing)
            rows = []
            attempts = []
            for o in observations:
                self._seen.add(o.path)
                sid = (
                    self._store_ids[(o.operator, o.partition)]
                    if o.operator is not None and o.partition is not None
                    else None
                )
                mtime = from_timestamp(o.mtime)
                # A listing repeats what an earlier sync recorded (a cursor lists its own start again):
                # that file and its attempt are in the catalog already, so nothing is written for it.
                written = existing.get(o.path) != (o.size, mtime)
                if written:
                    rows.append(
                        {
                            "root_id": self.root_id,
                            "path": o.path,
                            "kind": o.kind,
                            "store_id": sid,
                            "version": o.version,
                            "checkpoint_id": o.checkpoint_id,
                            "size": o.size,
                            "mtime": mtime,
                            "state": STATE_ORPHAN if o.kind == KIND_TEMP else STATE_LIVE,
                            "first_seen": now,
                            "deleted_at": None,
                        }
                    )
                is_attempt = o.kind == KIND_CHANGELOG and o.version is not None and bool(o.checkpoint_id)
                if written and is_attempt and sid is not None:
                    attempts.append(
                        {
                            "store_id": sid,
                            "version": o.version,
                            "checkpoint_id": o.checkpoint_id,
                            "outcome": OUTCOME_PENDING,
                            "first_seen": now,
                        }
                    )
                if o.kind in (KIND_CHANGELOG, KIND_MANIFEST):
                    self._note_version(o.version)
                if o.kind == KIND_SST and sid is not None:
                    self._sst_stores.add(sid)
            ft = table_of(File)
            for chunk in chunks(rows):
                ins = self.catalog.insert(File)
                revived = ft.c.state == STATE_DELETED
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["root_id", "path"],
                        set_={
                            "size": ins.excluded.size,
                            "mtime": ins.excluded.mtime,
                            "state": case((revived, ins.excluded.state), else_=ft.c.state),
                            "first_seen": case((revived, ins.excluded.first_seen), else_=ft.c.first_seen),
                            "deleted_at": None,
                        },
                    ),
                    list(chunk),
                )
            for chunk in chunks(attempts):
                conn.execute(
                    self.catalog.insert(Attempt).on_conflict_do_nothing(
                        index_elements=["store_id", "version", "checkpoint_id"]
                    ),
                    list(chunk),
                )

    # snapshots
    def add_snapshots(self, snapshots: Sequence[SnapshotObservation]) -> None:
        """Record `snapshots` (present) and the SSTs each references, in three statements per chunk."""
        if not snapshots:
            return
        with self.catalog.write() as conn:
            self._ensure_stores(conn, ((s.operator, s.partition) for s in snapshots))
            keyed = {(self._store_ids[(s.operator, s.partition)], s.version, s.checkpoint_id): s for s in snapshots}
            for chunk in chunks(list(keyed.items())):
                ins = self.catalog.insert(Snapshot)
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["store_id", "version", "checkpoint_id"], set_={"deleted_at": None}
                    ),
                    [
                        {
                            "store_id": sid,
                            "version": v,
                            "checkpoint_id": cid,
                            "manifest_path": s.manifest_path,
                            "sst_count": len(s.sst_files),
                            "sst_bytes": sum(size for _, size in s.sst_files),
                            "num_keys": s.num_keys,
                            "created_at": from_timestamp(s.created_at),
                            "deleted_at": None,
                        }
                        for (sid, v, cid), s in chunk
                    ],
                )
                found = conn.execute(
                    select(Snapshot.id, Snapshot.store_id, Snapshot.version, Snapshot.checkpoint_id).where(
                        Snapshot.store_id.in_(sorted({sid for (sid, _, _), _ in chunk})),
                        Snapshot.version.in_(sorted({v for (_, v, _), _ in chunk})),
                    )
                ).all()
                ids = {(int(sid), int(v), cid): int(snap_id) for snap_id, sid, v, cid in found}
                refs = [
                    {"snapshot_id": ids[key], "sst_path": path, "size": size}
                    for key, s in chunk
                    for path, size in sorted(dict(s.sst_files).items())
                ]
                for refs_chunk in chunks(refs):
                    conn.execute(
                        self.catalog.insert(SnapshotSst).on_conflict_do_nothing(
                            index_elements=["snapshot_id", "sst_path"]
                        ),
                        list(refs_chunk),
                    )
            for (sid, v, _), _ in keyed.items():
                self._sst_stores.add(sid)
                self._note_version(v)
        self.stats.snapshots += len(snapshots)

    def known_snapshots(self, keys: Iterable[tuple[str, int, int, str]]) -> set[tuple[str, int, int, str]]:
        """Which (operator, partition, version, id) snapshots the catalog holds with their manifest present."""
        wanted = set(keys)
        by_store: dict[int, tuple[str, int]] = {}
        for op, part, _, _ in wanted:
            sid = self._store_ids.get((op, part))
            if sid is not None:
                by_store[sid] = (op, part)
        versions = sorted({v for _, _, v, _ in wanted})
        found: set[tuple[str, int, int, str]] = set()
        with self.catalog.read() as conn:
            for schunk in chunks(sorted(by_store)):
                for vchunk in chunks(versions):
                    for sid, v, cid in conn.execute(
                        select(Snapshot.store_id, Snapshot.version, Snapshot.checkpoint_id).where(
                            Snapshot.store_id.in_(schunk), Snapshot.version.in_(vchunk), Snapshot.deleted_at.is_(None)
                        )
                    ):
                        key = (*by_store[int(sid)], int(v), cid)
                        if key in wanted:
                            found.add(key)
        return found

    def finish(self) -> SyncStats:
        """Derive states for what changed (a full pass: for everything) and record the sync time."""
        now = utcnow()
        with self.catalog.write() as conn:
            if self.full:
                present = set(
                    conn.execute(
                        select(File.path).where(File.root_id == self.root_id, File.state != STATE_DELETED)
                    ).scalars()
                )
                gone = sorted(present - self._seen)
                self.stats.files_deleted = mark_paths_deleted(conn, self.root_id, gone, now, self._frozen)
                derive_states(conn, self.root_id, None, None, self._frozen)
            else:
                derive_states(conn, self.root_id, self._min_version, self._sst_stores, self._frozen)
            values: dict[str, Any] = {"last_sync_at": now}
            if self.full:
                values["last_full_sync_at"] = now
            conn.execute(update(CheckpointRoot).where(CheckpointRoot.id == self.root_id).values(**values))
        return self.stats


class CatalogIngest(CatalogBase):
    """`Catalog.sync_writer`: the entry point of a sync (called by `statekeeper.maintenance.catalog_sync`)."""

    def sync_writer(self, uri: str, *, full: bool) -> SyncWriter:
        """A writer for one sync of root `uri` (`full`: every file is listed; unlisted ones are gone)."""
        return SyncWriter(self, uri, full=full)
