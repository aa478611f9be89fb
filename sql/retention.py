"""Retention planning: which files keeping the newest N committed versions of each store would delete.

Expiry (`statekeeper.maintenance.expiry`) asks for a `RetentionPlan`, marks its files expired, deletes them and
reports them deleted. The plan keeps every retained version loadable: its base snapshot (the newest
present committed snapshot at or below the oldest retained version) and everything after it stay.
Losing attempts and unreferenced files are orphan cleanup's, not expiry's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, exists, func, select

from statekeeper.sql.base import CatalogBase, chunks
from statekeeper.sql.errors import CatalogConfigError
from statekeeper.sql.lineage import FILE_RECORD_COLUMNS, FileRecord, base_snapshot
from statekeeper.sql.models import (
    KIND_CHANGELOG,
    KIND_COMMIT,
    KIND_MANIFEST,
    KIND_SST,
    STATE_EXPIRED,
    STATE_LIVE,
    File,
    Snapshot,
    SnapshotSst,
    Store,
    Version,
)


@dataclass(frozen=True)
class StoreRetention:
    operator: str
    partition: int
    latest_version: int
    retain_from: int
    """Oldest version kept loadable."""
    base_snapshot_version: int | None
    """The snapshot the oldest retained version loads from (None: replays from version 1)."""
    files: list[FileRecord]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class RetentionPlan:
    """What keeping the newest `min_versions_to_retain` versions of each store would delete."""

    root: str
    min_versions_to_retain: int
    stores: list[StoreRetention]
    commit_records: list[FileRecord] = field(default_factory=list)

    @property
    def files(self) -> list[FileRecord]:
        return [f for s in self.stores for f in s.files] + self.commit_records

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    @property
    def total_files(self) -> int:
        return len(self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "min_versions_to_retain": self.min_versions_to_retain,
            "total_files": self.total_files,
            "total_bytes": self.total_bytes,
            "stores": [
                {
                    "operator": s.operator,
                    "partition": s.partition,
                    "latest_version": s.latest_version,
                    "retain_from": s.retain_from,
                    "base_snapshot_version": s.base_snapshot_version,
                    "files": [f.to_json() for f in s.files],
                    "bytes": s.bytes,
                }
                for s in self.stores
            ],
            "commit_records": [f.to_json() for f in self.commit_records],
        }


class RetentionPlanning(CatalogBase):
    """`Catalog.retention_plan`: what expiry may delete (read-only)."""

    def retention_plan(
        self,
        uri: str,
        min_versions_to_retain: int,
        *,
        operator: str | None = None,
        partition: int | None = None,
        commit_records: bool = False,
    ) -> RetentionPlan:
        """What keeping the newest `min_versions_to_retain` committed versions of each store would delete.

        Per store with latest committed version L, versions max(1, L - N + 1)..L stay loadable: their
        base snapshot (the newest present committed snapshot at or below the oldest retained version)
        and everything after it stay. Deleted: committed changelogs at or below that base, older
        committed snapshots' manifests, and SSTs only those manifests reference. Losing attempts and
        unreferenced files are orphan cleanup's, not expiry's. With `commit_records`, also the commit
        records below the oldest version any store retains.
        """
        if not isinstance(min_versions_to_retain, int) or min_versions_to_retain < 1:
            raise CatalogConfigError(
                f"min_versions_to_retain={min_versions_to_retain!r}: at least 1 version must be retained"
            )
        rid = self.root_id(uri)
        stores: list[StoreRetention] = []
        oldest_retained: int | None = None
        with self.read() as conn:
            q = select(Store.id, Store.operator, Store.partition).where(Store.root_id == rid)
            if operator is not None:
                q = q.where(Store.operator == operator)
            if partition is not None:
                q = q.where(Store.partition == partition)
            for sid, op, part in conn.execute(q.order_by(Store.operator, Store.partition)).all():
                latest = conn.execute(select(func.max(Version.version)).where(Version.store_id == sid)).scalar()
                if latest is None:
                    continue
                retain_from = max(1, int(latest) - min_versions_to_retain + 1)
                oldest_retained = retain_from if oldest_retained is None else min(oldest_retained, retain_from)
                snap = base_snapshot(conn, sid, retain_from)
                files: list[FileRecord] = []
                if snap is not None:
                    _, base, _ = snap
                    files = _expired_files(conn, rid, sid, base)
                stores.append(StoreRetention(op, int(part), int(latest), retain_from, snap[1] if snap else None, files))
            commits: list[FileRecord] = []
            if commit_records and oldest_retained is not None and operator is None and partition is None:
                commits = [
                    FileRecord(*row)
                    for row in conn.execute(
                        select(*FILE_RECORD_COLUMNS)
                        .where(
                            File.root_id == rid,
                            File.kind == KIND_COMMIT,
                            File.version < oldest_retained,
                            File.state.in_((STATE_LIVE, STATE_EXPIRED)),
                        )
                        .order_by(File.path)
                    )
                ]
        return RetentionPlan(uri, min_versions_to_retain, stores, commits)


def _expired_files(conn: Connection, rid: int, sid: int, base: int) -> list[FileRecord]:
    """What expiry deletes of store `sid` when its oldest retained version loads from snapshot `base`."""
    cols = FILE_RECORD_COLUMNS
    present = File.state.in_((STATE_LIVE, STATE_EXPIRED))
    committed = exists().where(
        Version.store_id == File.store_id,
        Version.version == File.version,
        Version.checkpoint_id == File.checkpoint_id,
    )
    changelogs = conn.execute(
        select(*cols)
        .where(File.store_id == sid, File.kind == KIND_CHANGELOG, File.version <= base, present, committed)
        .order_by(File.path)
    ).all()
    manifests = conn.execute(
        select(*cols)
        .where(File.store_id == sid, File.kind == KIND_MANIFEST, File.version < base, present, committed)
        .order_by(File.path)
    ).all()
    doomed = {row[0] for row in manifests}
    # SSTs referenced by a doomed manifest and by no other present manifest of the store.
    sst_refs = conn.execute(
        select(SnapshotSst.sst_path, Snapshot.manifest_path)
        .join(Snapshot, Snapshot.id == SnapshotSst.snapshot_id)
        .where(Snapshot.store_id == sid, Snapshot.deleted_at.is_(None))
    ).all()
    keep: set[str] = set()
    candidates: set[str] = set()
    for sst_path, manifest_path in sst_refs:
        (candidates if manifest_path in doomed else keep).add(sst_path)
    candidates -= keep
    ssts: list[Any] = []
    for chunk in chunks(sorted(candidates)):
        ssts.extend(
            conn.execute(
                select(*cols).where(File.root_id == rid, File.path.in_(chunk), File.kind == KIND_SST, present)
            ).all()
        )
    rows = [*changelogs, *manifests, *sorted(ssts, key=lambda r: r[0])]
    return [FileRecord(*row) for row in rows]
