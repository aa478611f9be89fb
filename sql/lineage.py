"""Lineage queries: which stores, versions, attempts, snapshots and files a checkpoint root holds.

What users and maintenance ask of the catalog about one root: its files (`Catalog.files`), a summary,
the committed lineage of a store, losing attempts, the files a load of one version reads
(`files_for_version`) and how many changelogs a load of each store's latest version replays
(`chain_lengths`, which drives snapshot creation). Read-only; the sync (`statekeeper.sql.ingest`) fills what they
read. `base_snapshot` is shared with retention planning (`statekeeper.sql.retention`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Connection, Subquery, and_, func, select
from sqlalchemy.orm import aliased

from statekeeper.sql.base import CatalogBase
from statekeeper.sql.errors import CatalogConfigError, NotInCatalogError
from statekeeper.sql.models import (
    KIND_CHANGELOG,
    OUTCOME_LOSING,
    STATE_DELETED,
    Attempt,
    CheckpointRoot,
    Commit,
    File,
    Snapshot,
    SnapshotSst,
    Store,
    Version,
)

FILE_RECORD_COLUMNS = (File.path, File.kind, File.size, File.mtime, File.state, File.version, File.checkpoint_id)
"""The columns of a `FileRecord`, in its field order."""

SNAPSHOT_OF_VERSION = and_(
    Version.store_id == Snapshot.store_id,
    Version.version == Snapshot.version,
    Version.checkpoint_id == Snapshot.checkpoint_id,
)
"""Joins a snapshot to the committed version it is of (a snapshot of a losing attempt joins none)."""


@dataclass(frozen=True, slots=True)
class FileRecord:
    path: str
    kind: str
    size: int
    mtime: dt.datetime
    state: str
    version: int | None = None
    checkpoint_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "size": self.size,
            "mtime": self.mtime.isoformat(),
            "state": self.state,
            "version": self.version,
            "checkpoint_id": self.checkpoint_id,
        }


@dataclass(frozen=True, slots=True)
class StoreInfo:
    operator: str
    partition: int

    @property
    def scope(self) -> str:
        return f"{self.operator}/{self.partition}"


@dataclass(frozen=True)
class VersionFiles:
    """The files that make up version `version` of a store: base snapshot + changelogs after it."""

    root: str
    operator: str
    partition: int
    version: int
    checkpoint_id: str | None
    snapshot_version: int | None
    changelogs: list[FileRecord] = field(default_factory=list)
    manifest: FileRecord | None = None
    ssts: list[FileRecord] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Needed files that are deleted or were never seen (a path, or a description when unknown)."""

    @property
    def files(self) -> list[FileRecord]:
        return [*self.ssts, *([self.manifest] if self.manifest else []), *self.changelogs]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def loadable(self) -> bool:
        """Every needed file is present (as far as the catalog knows)."""
        return not self.missing

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "operator": self.operator,
            "partition": self.partition,
            "version": self.version,
            "checkpoint_id": self.checkpoint_id,
            "snapshot_version": self.snapshot_version,
            "files": [f.to_json() for f in self.files],
            "total_bytes": self.total_bytes,
            "missing": list(self.missing),
        }


@dataclass(frozen=True, slots=True)
class StoreChain:
    operator: str
    partition: int
    latest_version: int
    latest_checkpoint_id: str
    snapshot_version: int | None
    chain_length: int
    """Changelogs a load of the latest version replays: latest - snapshot version (or latest)."""
    pending_since: dt.datetime | None = None
    """When the oldest version no snapshot covers (snapshot version + 1) was committed; None when
    the latest version has a snapshot. Now minus this is the store's snapshot lag."""

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        row["pending_since"] = None if self.pending_since is None else self.pending_since.isoformat()
        return row


def file_record(conn: Connection, rid: int, path: str) -> FileRecord | None:
    """The present (not deleted) file `path` of root `rid`, if the catalog holds it."""
    row = conn.execute(
        select(*FILE_RECORD_COLUMNS).where(File.root_id == rid, File.path == path, File.state != STATE_DELETED)
    ).one_or_none()
    return None if row is None else FileRecord(*row)


def base_snapshot(conn: Connection, sid: int, version: int) -> tuple[int, int, str] | None:
    """(snapshot id, version, manifest path) of the newest present committed snapshot <= version."""
    row = conn.execute(
        select(Snapshot.id, Snapshot.version, Snapshot.manifest_path)
        .join(Version, SNAPSHOT_OF_VERSION)
        .where(Snapshot.store_id == sid, Snapshot.version <= version, Snapshot.deleted_at.is_(None))
        .order_by(Snapshot.version.desc())
        .limit(1)
    ).one_or_none()
    return None if row is None else (int(row[0]), int(row[1]), str(row[2]))


def _latest_versions(rid: int) -> Subquery:
    """Per store of root `rid`: its newest committed version (columns ``sid``, ``v``)."""
    return (
        select(Version.store_id.label("sid"), func.max(Version.version).label("v"))
        .join(Store, Store.id == Version.store_id)
        .where(Store.root_id == rid)
        .group_by(Version.store_id)
        .subquery()
    )


class LineageQueries(CatalogBase):
    """The read-only lineage queries of `Catalog` (one root per call, identified by its URI)."""

    def stores(self, uri: str) -> list[StoreInfo]:
        rid = self.root_id(uri)
        with self.read() as conn:
            rows = conn.execute(
                select(Store.operator, Store.partition)
                .where(Store.root_id == rid)
                .order_by(Store.operator, Store.partition)
            ).all()
        return [StoreInfo(op, part) for op, part in rows]

    def files(
        self,
        uri: str,
        *,
        kinds: Sequence[str] | None = None,
        states: Sequence[str] | None = None,
        operator: str | None = None,
        partition: int | None = None,
    ) -> list[FileRecord]:
        """Files of root `uri` (default: every file not deleted), in path order."""
        rid = self.root_id(uri)
        q = select(*FILE_RECORD_COLUMNS).where(File.root_id == rid)
        q = q.where(File.state.in_(states)) if states else q.where(File.state != STATE_DELETED)
        if kinds:
            q = q.where(File.kind.in_(kinds))
        if operator is not None or partition is not None:
            q = q.join(Store, Store.id == File.store_id)
            if operator is not None:
                q = q.where(Store.operator == operator)
            if partition is not None:
                q = q.where(Store.partition == partition)
        with self.read() as conn:
            return [FileRecord(*row) for row in conn.execute(q.order_by(File.path))]

    def summary(self, uri: str) -> dict[str, Any]:
        """Counts and bytes of root `uri` (JSON-ready): stores, versions, files by kind and state, syncs."""
        rid = self.root_id(uri)
        with self.read() as conn:
            stores = conn.execute(select(func.count()).select_from(Store).where(Store.root_id == rid)).scalar_one()
            latest = conn.execute(select(func.max(Commit.version)).where(Commit.root_id == rid)).scalar()
            losing = conn.execute(
                select(func.count())
                .select_from(Attempt)
                .join(Store, Store.id == Attempt.store_id)
                .where(Store.root_id == rid, Attempt.outcome == OUTCOME_LOSING)
            ).scalar_one()
            snapshots = conn.execute(
                select(func.count())
                .select_from(Snapshot)
                .join(Store, Store.id == Snapshot.store_id)
                .where(Store.root_id == rid, Snapshot.deleted_at.is_(None))
            ).scalar_one()
            by_kind = conn.execute(
                select(File.kind, File.state, func.count(), func.coalesce(func.sum(File.size), 0))
                .where(File.root_id == rid)
                .group_by(File.kind, File.state)
                .order_by(File.kind, File.state)
            ).all()
            synced = conn.execute(
                select(CheckpointRoot.last_sync_at, CheckpointRoot.last_full_sync_at).where(CheckpointRoot.id == rid)
            ).one()
        files: dict[str, dict[str, dict[str, int]]] = {}
        for kind, state, count, size in by_kind:
            files.setdefault(kind, {})[state] = {"files": int(count), "bytes": int(size)}
        present_files = present_bytes = 0
        for _kind, state, count, size in by_kind:
            if state != STATE_DELETED:
                present_files += int(count)
                present_bytes += int(size)
        return {
            "root": uri,
            "stores": int(stores),
            "latest_version": None if latest is None else int(latest),
            "snapshots": int(snapshots),
            "losing_attempts": int(losing),
            "files": files,
            "present_files": present_files,
            "present_bytes": present_bytes,
            "last_sync_at": synced[0].isoformat() if synced[0] else None,
            "last_full_sync_at": synced[1].isoformat() if synced[1] else None,
        }

    def committed_versions(self, uri: str, operator: str, partition: int) -> list[tuple[int, str, str | None]]:
        """(version, checkpoint id, parent id) of every committed version of a store, ascending."""
        rid = self.root_id(uri)
        with self.read() as conn:
            sid = self.store_id(conn, rid, operator, partition)
            rows = conn.execute(
                select(Version.version, Version.checkpoint_id, Version.parent_id)
                .where(Version.store_id == sid)
                .order_by(Version.version)
            ).all()
        return [(int(v), c, p) for v, c, p in rows]

    def losing_attempts(self, uri: str) -> list[tuple[str, int, int, str]]:
        """(operator, partition, version, checkpoint id) of every losing attempt seen."""
        rid = self.root_id(uri)
        with self.read() as conn:
            rows = conn.execute(
                select(Store.operator, Store.partition, Attempt.version, Attempt.checkpoint_id)
                .join(Store, Store.id == Attempt.store_id)
                .where(Store.root_id == rid, Attempt.outcome == OUTCOME_LOSING)
                .order_by(Store.operator, Store.partition, Attempt.version, Attempt.checkpoint_id)
            ).all()
        return [(op, int(p), int(v), c) for op, p, v, c in rows]

    def files_for_version(self, uri: str, operator: str, partition: int, version: int) -> VersionFiles:
        """The files a load of committed `version` of store (operator, partition) reads.

        The newest present snapshot of a committed (v, id) with v <= version, its SSTs, and the
        committed changelogs after it (back to version 1 when there is no snapshot).
        """
        if version < 0:
            raise CatalogConfigError(f"invalid version {version}: expected an integer >= 0")
        rid = self.root_id(uri)
        with self.read() as conn:
            sid = self.store_id(conn, rid, operator, partition)
            if version == 0:
                return VersionFiles(uri, operator, partition, 0, None, None)
            ckpt = conn.execute(
                select(Version.checkpoint_id).where(Version.store_id == sid, Version.version == version)
            ).scalar_one_or_none()
            if ckpt is None:
                raise NotInCatalogError(
                    f"version {version} of store {operator}/{partition} of {uri} is not committed "
                    "(or the catalog has not synced it)"
                )
            snap = base_snapshot(conn, sid, version)
            missing: list[str] = []
            manifest: FileRecord | None = None
            ssts: list[FileRecord] = []
            base = 0
            if snap is not None:
                snap_id, base, manifest_path = snap
                manifest = file_record(conn, rid, manifest_path)
                if manifest is None:
                    missing.append(manifest_path)
                sst_rows = conn.execute(
                    select(
                        SnapshotSst.sst_path, SnapshotSst.size, File.path, File.kind, File.size, File.mtime, File.state
                    )
                    .outerjoin(File, and_(File.root_id == rid, File.path == SnapshotSst.sst_path))
                    .where(SnapshotSst.snapshot_id == snap_id)
                    .order_by(SnapshotSst.sst_path)
                ).all()
                for sst_path, _size, path, kind, size, mtime, state in sst_rows:
                    if path is None or state == STATE_DELETED:
                        missing.append(sst_path)
                    else:
                        ssts.append(FileRecord(path, kind, size, mtime, state))
            chain = conn.execute(
                select(Version.version, Version.checkpoint_id, File.path, File.size, File.mtime, File.state)
                .outerjoin(
                    File,
                    and_(
                        File.store_id == Version.store_id,
                        File.kind == KIND_CHANGELOG,
                        File.version == Version.version,
                        File.checkpoint_id == Version.checkpoint_id,
                    ),
                )
                .where(Version.store_id == sid, Version.version > base, Version.version <= version)
                .order_by(Version.version)
            ).all()
            changelogs: list[FileRecord] = []
            expected = base + 1
            for v, cid, path, size, mtime, state in chain:
                if v != expected:
                    missing.append(f"versions {expected}..{v - 1} are not in the catalog")
                expected = v + 1
                if path is None or state == STATE_DELETED:
                    missing.append(path or f"changelog of version {v} ({cid})")
                else:
                    changelogs.append(FileRecord(path, KIND_CHANGELOG, size, mtime, state, int(v), cid))
        return VersionFiles(
            uri, operator, partition, version, ckpt, base if snap else None, changelogs, manifest, ssts, missing
        )

    def expiry_bases(self, uri: str, *, retain: int) -> dict[str, int]:
        """Per store ('operator/partition'): the newest snapshot the oldest of its newest `retain`
        committed versions loads from, i.e. the version expiry keeps everything after (stores whose
        retained versions all load from version 0 are left out). A commit moves it, so a sensor that
        sees it grow knows there is something to expire."""
        rid = self.root_id(uri)
        latest = _latest_versions(rid)
        q = (
            select(Store.operator, Store.partition, func.max(Snapshot.version))
            .join(Snapshot, Snapshot.store_id == Store.id)
            .join(Version, SNAPSHOT_OF_VERSION)
            .join(latest, latest.c.sid == Store.id)
            .where(Store.root_id == rid, Snapshot.deleted_at.is_(None), Snapshot.version <= latest.c.v - retain + 1)
            .group_by(Store.operator, Store.partition)
        )
        with self.read() as conn:
            return {f"{op}/{part}": int(v) for op, part, v in conn.execute(q)}

    def chain_lengths(self, uri: str, *, min_length: int = 0) -> list[StoreChain]:
        """Per store: latest committed version, newest snapshot on its lineage, changelogs since it."""
        rid = self.root_id(uri)
        latest = _latest_versions(rid)
        snaps = (
            select(Snapshot.store_id.label("sid"), func.max(Snapshot.version).label("v"))
            .join(Store, Store.id == Snapshot.store_id)
            .join(Version, SNAPSHOT_OF_VERSION)
            .where(Store.root_id == rid, Snapshot.deleted_at.is_(None))
            .group_by(Snapshot.store_id)
            .subquery()
        )
        pending = aliased(Version)
        q = (
            select(Store.operator, Store.partition, latest.c.v, Version.checkpoint_id, snaps.c.v, pending.committed_at)
            .join(latest, latest.c.sid == Store.id)
            .join(Version, and_(Version.store_id == Store.id, Version.version == latest.c.v))
            .outerjoin(snaps, snaps.c.sid == Store.id)
            .outerjoin(pending, and_(pending.store_id == Store.id, pending.version == func.coalesce(snaps.c.v, 0) + 1))
            .order_by(Store.operator, Store.partition)
        )
        out = []
        with self.read() as conn:
            for op, part, v, cid, sv, since in conn.execute(q):
                length = int(v) - (int(sv) if sv is not None else 0)
                if length >= min_length:
                    snap = None if sv is None else int(sv)
                    out.append(StoreChain(op, int(part), int(v), cid, snap, length, since if length else None))
        return out
