"""The lineage catalog: what is in each checkpoint root, derived from it, and the queries users need.

`Catalog` wraps an engine on a migrated database. It knows nothing of the checkpoint file layout:
`maintenance.catalog_sync` reads the checkpoint location and feeds plain observations in through
`Catalog.sync_writer`; maintenance operations report what they delete (`mark_deleted`), record their
runs (`record_run`) and take leases (`acquire_lease`, in `sql.leases`).

File states: ``live`` (part of a committed version, a pending attempt, or a foreign file),
``orphan`` (a losing attempt's changelog or manifest, an SST no present manifest references, a temp
file of an unfinished write; orphan cleanup applies its own grace period), ``expired`` (set by the
expiry operation for files it is about to delete), ``deleted`` (gone; kept as history).
Roots are identified by the URI string callers pass; use the file manager's normalised ``root_uri``.
"""

from __future__ import annotations

import datetime as dt
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Engine, Table, and_, case, delete, exists, func, select, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from sql.db import check_current, make_engine, read_only
from sql.db import upgrade as upgrade_db
from sql.errors import CatalogConfigError, CatalogError, NotInCatalogError
from sql.models import (
    KIND_CHANGELOG,
    KIND_COMMIT,
    KIND_MANIFEST,
    KIND_SST,
    KIND_TEMP,
    OUTCOME_COMMITTED,
    OUTCOME_LOSING,
    OUTCOME_PENDING,
    RUN_FAILED,
    RUN_RUNNING,
    RUN_STATUSES,
    RUN_SUCCEEDED,
    STATE_DELETED,
    STATE_EXPIRED,
    STATE_LIVE,
    STATE_ORPHAN,
    Attempt,
    CheckpointRoot,
    Commit,
    File,
    MaintenanceLease,
    MaintenanceRun,
    Snapshot,
    SnapshotSst,
    Store,
    SyncCursor,
    Version,
    utcnow,
)

if TYPE_CHECKING:
    from sql.leases import Lease, LeaseInfo

CHUNK = 500
"""Rows per statement in bulk writes (keeps SQLite under its bound-parameter limit)."""


def _t(model: type[Any]) -> Table:
    return cast(Table, model.__table__)


def _chunks(items: Sequence[Any], n: int = CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def from_timestamp(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


# -- observations fed in by the sync (plain data, no checkpoint types) -------------------------------


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


# -- query results -----------------------------------------------------------------------------------


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

    def to_json(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "partition": self.partition,
            "latest_version": self.latest_version,
            "latest_checkpoint_id": self.latest_checkpoint_id,
            "snapshot_version": self.snapshot_version,
            "chain_length": self.chain_length,
        }


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


@dataclass(frozen=True, slots=True)
class RunInfo:
    id: int
    root: str
    kind: str
    status: str
    dry_run: bool
    started_at: dt.datetime
    ended_at: dt.datetime | None
    orchestrator_run_id: str | None
    store_count: int
    file_count: int
    byte_count: int
    error_count: int
    errors: str | None
    details: dict[str, Any] | None

    @property
    def seconds(self) -> float | None:
        return (self.ended_at - self.started_at).total_seconds() if self.ended_at else None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "root": self.root,
            "kind": self.kind,
            "status": self.status,
            "dry_run": self.dry_run,
            "started_at": self.started_at.isoformat(),
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "seconds": self.seconds,
            "orchestrator_run_id": self.orchestrator_run_id,
            "stores": self.store_count,
            "files": self.file_count,
            "bytes": self.byte_count,
            "error_count": self.error_count,
            "errors": self.errors,
            "details": self.details,
        }


@dataclass
class RunRecorder:
    """Counters a maintenance operation fills in while it runs (see `Catalog.record_run`)."""

    run_id: int
    stores: int = 0
    files: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    status: str | None = None
    """Leave None for succeeded (failed when `errors` is non-empty or an exception escapes)."""


# -- the catalog -------------------------------------------------------------------------------------


class Catalog:
    """The lineage catalog on one database (thread-safe: every call uses its own connection)."""

    def __init__(self, engine: Engine, *, check_schema: bool = True) -> None:
        self.engine = engine
        self._ro = read_only(engine)
        if check_schema:
            try:
                check_current(engine)
            except DBAPIError as e:
                where = engine.url.render_as_string(hide_password=True)
                raise CatalogError(f"cannot use the catalog database {where}: {e.orig or e}") from e

    @classmethod
    def open(cls, url: str | URL | None = None, *, upgrade: bool = False, **engine_kwargs: Any) -> Catalog:
        """Connect to `url` (default: `sql.db.default_url()`); `upgrade` migrates it to this release first."""
        engine = make_engine(url, **engine_kwargs)
        try:
            if upgrade:
                upgrade_db(engine)
            return cls(engine)
        except BaseException:
            engine.dispose()
            raise

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction (SQLite: BEGIN IMMEDIATE)."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._ro.connect() as conn:
            yield conn

    def insert(self, model: type[Any]) -> Any:
        """A dialect INSERT supporting on_conflict_do_nothing / on_conflict_do_update."""
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(_t(model))
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(_t(model))

    # -- roots and stores -------------------------------------------------------------------------
    def ensure_root(self, uri: str) -> int:
        """The id of root `uri`, created if new (safe when several processes race to create it)."""
        if not isinstance(uri, str) or not uri.strip():
            raise CatalogConfigError("checkpoint root URI is empty")
        found = self.find_root(uri)
        if found is not None:
            return found
        with self.write() as conn:
            conn.execute(
                self.insert(CheckpointRoot)
                .values(uri=uri, created_at=utcnow())
                .on_conflict_do_nothing(index_elements=["uri"])
            )
            return int(conn.execute(select(CheckpointRoot.id).where(CheckpointRoot.uri == uri)).scalar_one())

    def find_root(self, uri: str) -> int | None:
        with self.read() as conn:
            rid = conn.execute(select(CheckpointRoot.id).where(CheckpointRoot.uri == uri)).scalar_one_or_none()
        return None if rid is None else int(rid)

    def root_id(self, uri: str) -> int:
        rid = self.find_root(uri)
        if rid is None:
            raise NotInCatalogError(f"checkpoint root {uri} is not in the catalog: run `statekeeper catalog sync`")
        return rid

    def roots(self) -> list[str]:
        with self.read() as conn:
            return list(conn.execute(select(CheckpointRoot.uri).order_by(CheckpointRoot.uri)).scalars())

    def last_sync(self, uri: str) -> tuple[dt.datetime | None, dt.datetime | None]:
        """(last sync of any kind, last full sync) of root `uri`."""
        with self.read() as conn:
            row = conn.execute(
                select(CheckpointRoot.last_sync_at, CheckpointRoot.last_full_sync_at).where(CheckpointRoot.uri == uri)
            ).one_or_none()
        if row is None:
            raise NotInCatalogError(f"checkpoint root {uri} is not in the catalog")
        return row[0], row[1]

    def stores(self, uri: str) -> list[StoreInfo]:
        rid = self.root_id(uri)
        with self.read() as conn:
            rows = conn.execute(
                select(Store.operator, Store.partition)
                .where(Store.root_id == rid)
                .order_by(Store.operator, Store.partition)
            ).all()
        return [StoreInfo(op, part) for op, part in rows]

    def _store_id(self, conn: Connection, rid: int, operator: str, partition: int) -> int:
        sid = conn.execute(
            select(Store.id).where(Store.root_id == rid, Store.operator == operator, Store.partition == partition)
        ).scalar_one_or_none()
        if sid is None:
            raise NotInCatalogError(f"store {operator}/{partition} of {self._uri(conn, rid)} is not in the catalog")
        return int(sid)

    @staticmethod
    def _uri(conn: Connection, rid: int) -> str:
        return str(conn.execute(select(CheckpointRoot.uri).where(CheckpointRoot.id == rid)).scalar_one())

    def reset_root(self, uri: str) -> None:
        """Forget what the catalog derived from root `uri` (stores, versions, attempts, snapshots, files,
        cursors), so that a full sync rebuilds it from the checkpoint location alone. Maintenance run
        history and leases are not derived from the location and are kept.
        """
        rid = self.find_root(uri)
        if rid is None:
            return
        with self.write() as conn:
            _delete_derived(conn, rid)
            conn.execute(
                update(CheckpointRoot).where(CheckpointRoot.id == rid).values(last_sync_at=None, last_full_sync_at=None)
            )

    def forget_root(self, uri: str) -> None:
        """Remove root `uri` and everything about it, run history and leases included."""
        rid = self.find_root(uri)
        if rid is None:
            return
        with self.write() as conn:
            _delete_derived(conn, rid)
            for by_root in (_t(MaintenanceRun), _t(MaintenanceLease)):
                conn.execute(delete(by_root).where(by_root.c.root_id == rid))
            conn.execute(delete(CheckpointRoot).where(CheckpointRoot.id == rid))

    # -- ingest (called by maintenance.catalog_sync) ----------------------------------------------
    def sync_writer(self, uri: str, *, full: bool) -> SyncWriter:
        return SyncWriter(self, uri, full=full)

    def mark_deleted(self, uri: str, paths: Iterable[str], *, at: dt.datetime | None = None) -> int:
        """Record that `paths` are gone from the checkpoint location (maintenance deleted them)."""
        rid = self.root_id(uri)
        with self.write() as conn:
            return _mark_deleted(conn, rid, list(paths), at or utcnow())

    def mark_expired(self, uri: str, paths: Iterable[str]) -> int:
        """Record that expiry is about to delete `paths` (live or orphan files only)."""
        rid = self.root_id(uri)
        n = 0
        with self.write() as conn:
            for chunk in _chunks(list(paths)):
                n += conn.execute(
                    update(File)
                    .where(File.root_id == rid, File.path.in_(chunk), File.state.in_((STATE_LIVE, STATE_ORPHAN)))
                    .values(state=STATE_EXPIRED)
                ).rowcount
        return n

    # -- queries ----------------------------------------------------------------------------------
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
        q = select(File.path, File.kind, File.size, File.mtime, File.state, File.version, File.checkpoint_id).where(
            File.root_id == rid
        )
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
            sid = self._store_id(conn, rid, operator, partition)
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
            sid = self._store_id(conn, rid, operator, partition)
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
            snap = self._base_snapshot(conn, sid, version)
            missing: list[str] = []
            manifest: FileRecord | None = None
            ssts: list[FileRecord] = []
            base = 0
            if snap is not None:
                snap_id, base, manifest_path = snap
                manifest = self._file(conn, rid, manifest_path)
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

    @staticmethod
    def _file(conn: Connection, rid: int, path: str) -> FileRecord | None:
        row = conn.execute(
            select(File.path, File.kind, File.size, File.mtime, File.state, File.version, File.checkpoint_id).where(
                File.root_id == rid, File.path == path, File.state != STATE_DELETED
            )
        ).one_or_none()
        return None if row is None else FileRecord(*row)

    @staticmethod
    def _base_snapshot(conn: Connection, sid: int, version: int) -> tuple[int, int, str] | None:
        """(snapshot id, version, manifest path) of the newest present committed snapshot <= version."""
        row = conn.execute(
            select(Snapshot.id, Snapshot.version, Snapshot.manifest_path)
            .join(
                Version,
                and_(
                    Version.store_id == Snapshot.store_id,
                    Version.version == Snapshot.version,
                    Version.checkpoint_id == Snapshot.checkpoint_id,
                ),
            )
            .where(Snapshot.store_id == sid, Snapshot.version <= version, Snapshot.deleted_at.is_(None))
            .order_by(Snapshot.version.desc())
            .limit(1)
        ).one_or_none()
        return None if row is None else (int(row[0]), int(row[1]), str(row[2]))

    def chain_lengths(self, uri: str, *, min_length: int = 0) -> list[StoreChain]:
        """Per store: latest committed version, newest snapshot on its lineage, changelogs since it."""
        rid = self.root_id(uri)
        latest = (
            select(Version.store_id.label("sid"), func.max(Version.version).label("v"))
            .join(Store, Store.id == Version.store_id)
            .where(Store.root_id == rid)
            .group_by(Version.store_id)
            .subquery()
        )
        snaps = (
            select(Snapshot.store_id.label("sid"), func.max(Snapshot.version).label("v"))
            .join(Store, Store.id == Snapshot.store_id)
            .join(
                Version,
                and_(
                    Version.store_id == Snapshot.store_id,
                    Version.version == Snapshot.version,
                    Version.checkpoint_id == Snapshot.checkpoint_id,
                ),
            )
            .where(Store.root_id == rid, Snapshot.deleted_at.is_(None))
            .group_by(Snapshot.store_id)
            .subquery()
        )
        q = (
            select(Store.operator, Store.partition, latest.c.v, Version.checkpoint_id, snaps.c.v)
            .join(latest, latest.c.sid == Store.id)
            .join(Version, and_(Version.store_id == Store.id, Version.version == latest.c.v))
            .outerjoin(snaps, snaps.c.sid == Store.id)
            .order_by(Store.operator, Store.partition)
        )
        out = []
        with self.read() as conn:
            for op, part, v, cid, sv in conn.execute(q):
                length = int(v) - (int(sv) if sv is not None else 0)
                if length >= min_length:
                    out.append(StoreChain(op, int(part), int(v), cid, None if sv is None else int(sv), length))
        return out

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
                snap = self._base_snapshot(conn, sid, retain_from)
                files: list[FileRecord] = []
                if snap is not None:
                    _, base, _ = snap
                    files = self._expired_files(conn, rid, sid, base)
                stores.append(StoreRetention(op, int(part), int(latest), retain_from, snap[1] if snap else None, files))
            commits: list[FileRecord] = []
            if commit_records and oldest_retained is not None and operator is None and partition is None:
                commits = [
                    FileRecord(*row)
                    for row in conn.execute(
                        select(
                            File.path, File.kind, File.size, File.mtime, File.state, File.version, File.checkpoint_id
                        )
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

    @staticmethod
    def _expired_files(conn: Connection, rid: int, sid: int, base: int) -> list[FileRecord]:
        cols = (File.path, File.kind, File.size, File.mtime, File.state, File.version, File.checkpoint_id)
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
        for chunk in _chunks(sorted(candidates)):
            ssts.extend(
                conn.execute(
                    select(*cols).where(File.root_id == rid, File.path.in_(chunk), File.kind == KIND_SST, present)
                ).all()
            )
        rows = [*changelogs, *manifests, *sorted(ssts, key=lambda r: r[0])]
        return [FileRecord(*row) for row in rows]

    # -- maintenance runs -------------------------------------------------------------------------
    def start_run(
        self,
        uri: str,
        kind: str,
        *,
        dry_run: bool = False,
        orchestrator_run_id: str | None = None,
        started_at: dt.datetime | None = None,
    ) -> int:
        if not kind or len(kind) > 32:
            raise CatalogConfigError(f"invalid maintenance run kind {kind!r}")
        rid = self.ensure_root(uri)
        with self.write() as conn:
            return int(
                conn.execute(
                    _t(MaintenanceRun)
                    .insert()
                    .values(
                        root_id=rid,
                        kind=kind,
                        started_at=started_at or utcnow(),
                        status=RUN_RUNNING,
                        dry_run=dry_run,
                        orchestrator_run_id=orchestrator_run_id,
                        store_count=0,
                        file_count=0,
                        byte_count=0,
                        error_count=0,
                    )
                    .returning(_t(MaintenanceRun).c.id)
                ).scalar_one()
            )

    def finish_run(
        self,
        run_id: int,
        *,
        status: str = RUN_SUCCEEDED,
        stores: int = 0,
        files: int = 0,
        bytes: int = 0,
        errors: Sequence[str] = (),
        details: Mapping[str, Any] | None = None,
        ended_at: dt.datetime | None = None,
    ) -> None:
        if status not in RUN_STATUSES or status == RUN_RUNNING:
            raise CatalogConfigError(f"invalid final run status {status!r}: use succeeded or failed")
        with self.write() as conn:
            n = conn.execute(
                update(MaintenanceRun)
                .where(MaintenanceRun.id == run_id)
                .values(
                    status=status,
                    ended_at=ended_at or utcnow(),
                    store_count=stores,
                    file_count=files,
                    byte_count=bytes,
                    error_count=len(errors),
                    errors="\n".join(errors) if errors else None,
                    details=dict(details) if details else None,
                )
            ).rowcount
        if n != 1:
            raise NotInCatalogError(f"maintenance run {run_id} is not in the catalog")

    @contextmanager
    def record_run(
        self, uri: str, kind: str, *, dry_run: bool = False, orchestrator_run_id: str | None = None
    ) -> Iterator[RunRecorder]:
        """Record a maintenance run around a block; an escaping exception marks it failed (and propagates)."""
        rec = RunRecorder(self.start_run(uri, kind, dry_run=dry_run, orchestrator_run_id=orchestrator_run_id))
        try:
            yield rec
        except BaseException as e:
            text = "".join(traceback.format_exception_only(type(e), e)).strip()
            self.finish_run(
                rec.run_id,
                status=RUN_FAILED,
                stores=rec.stores,
                files=rec.files,
                bytes=rec.bytes,
                errors=[*rec.errors, text],
                details=rec.details,
            )
            raise
        status = rec.status or (RUN_FAILED if rec.errors else RUN_SUCCEEDED)
        self.finish_run(
            rec.run_id,
            status=status,
            stores=rec.stores,
            files=rec.files,
            bytes=rec.bytes,
            errors=rec.errors,
            details=rec.details,
        )

    def runs(
        self,
        uri: str | None = None,
        *,
        kind: str | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[RunInfo]:
        """Maintenance run history, newest first."""
        q = select(
            MaintenanceRun.id,
            CheckpointRoot.uri,
            MaintenanceRun.kind,
            MaintenanceRun.status,
            MaintenanceRun.dry_run,
            MaintenanceRun.started_at,
            MaintenanceRun.ended_at,
            MaintenanceRun.orchestrator_run_id,
            MaintenanceRun.store_count,
            MaintenanceRun.file_count,
            MaintenanceRun.byte_count,
            MaintenanceRun.error_count,
            MaintenanceRun.errors,
            MaintenanceRun.details,
        ).join(CheckpointRoot, CheckpointRoot.id == MaintenanceRun.root_id)
        if uri is not None:
            q = q.where(CheckpointRoot.uri == uri)
        if kind is not None:
            q = q.where(MaintenanceRun.kind == kind)
        if status is not None:
            q = q.where(MaintenanceRun.status == status)
        q = q.order_by(MaintenanceRun.started_at.desc(), MaintenanceRun.id.desc()).limit(limit)
        with self.read() as conn:
            rows: Sequence[Any] = conn.execute(q).all()
        return [RunInfo(*row) for row in rows]

    # -- leases (sql.leases) ----------------------------------------------------------------------
    def acquire_lease(
        self,
        uri: str,
        store: tuple[str, int] | str | None = None,
        *,
        owner: str | None = None,
        ttl: float = 300.0,
        timeout: float = 0.0,
        poll_interval: float = 0.5,
    ) -> Lease:
        """Take the maintenance lease of one store (or, with `store=None` or '*', of the whole root).

        Waits up to `timeout` seconds for a holder to release or expire, then raises
        `LeaseUnavailableError` naming the holder. Use as a context manager to release on exit.
        """
        from sql.leases import acquire

        return acquire(self, uri, store, owner=owner, ttl=ttl, timeout=timeout, poll_interval=poll_interval)

    def leases(self, uri: str) -> list[LeaseInfo]:
        from sql.leases import list_leases

        return list_leases(self, uri)

    # -- a canonical view (tests, `inspect --json`) -----------------------------------------------
    def export(self, uri: str, *, include_history: bool = False) -> dict[str, list[tuple[Any, ...]]]:
        """Everything the catalog derived from root `uri`, as sorted tuples without bookkeeping times.

        Without `include_history` only what is present now: a full rebuild into an empty database
        gives the same export as any sequence of syncs of the same checkpoint location.
        """
        rid = self.root_id(uri)
        present = File.state != STATE_DELETED
        with self.read() as conn:
            files = conn.execute(
                select(
                    File.path,
                    File.kind,
                    Store.operator,
                    Store.partition,
                    File.version,
                    File.checkpoint_id,
                    File.size,
                    File.mtime,
                    File.state,
                )
                .outerjoin(Store, Store.id == File.store_id)
                .where(File.root_id == rid, *(() if include_history else (present,)))
                .order_by(File.path)
            ).all()
            commit_present = exists().where(
                File.root_id == rid, File.kind == KIND_COMMIT, File.version == Version.version, present
            )
            versions = conn.execute(
                select(
                    Store.operator,
                    Store.partition,
                    Version.version,
                    Version.checkpoint_id,
                    Version.parent_id,
                    Version.committed_at,
                )
                .join(Store, Store.id == Version.store_id)
                .where(Store.root_id == rid, *(() if include_history else (commit_present,)))
                .order_by(Store.operator, Store.partition, Version.version)
            ).all()
            commit_file_present = exists().where(
                File.root_id == rid, File.kind == KIND_COMMIT, File.version == Commit.version, present
            )
            commits = conn.execute(
                select(Commit.version, Commit.committed_at, Commit.operators, Commit.partitions)
                .where(Commit.root_id == rid, *(() if include_history else (commit_file_present,)))
                .order_by(Commit.version)
            ).all()
            changelog_present = exists().where(
                File.store_id == Attempt.store_id,
                File.kind == KIND_CHANGELOG,
                File.version == Attempt.version,
                File.checkpoint_id == Attempt.checkpoint_id,
                present,
            )
            attempts = conn.execute(
                select(Store.operator, Store.partition, Attempt.version, Attempt.checkpoint_id, Attempt.outcome)
                .join(Store, Store.id == Attempt.store_id)
                .where(Store.root_id == rid, *(() if include_history else (changelog_present,)))
                .order_by(Store.operator, Store.partition, Attempt.version, Attempt.checkpoint_id)
            ).all()
            snapshots = conn.execute(
                select(
                    Store.operator,
                    Store.partition,
                    Snapshot.version,
                    Snapshot.checkpoint_id,
                    Snapshot.manifest_path,
                    Snapshot.sst_count,
                    Snapshot.sst_bytes,
                    Snapshot.num_keys,
                    Snapshot.created_at,
                    Snapshot.deleted_at.is_not(None),
                )
                .join(Store, Store.id == Snapshot.store_id)
                .where(Store.root_id == rid, *(() if include_history else (Snapshot.deleted_at.is_(None),)))
                .order_by(Store.operator, Store.partition, Snapshot.version, Snapshot.checkpoint_id)
            ).all()
            snapshot_ssts = conn.execute(
                select(Snapshot.manifest_path, SnapshotSst.sst_path, SnapshotSst.size)
                .join(Snapshot, Snapshot.id == SnapshotSst.snapshot_id)
                .join(Store, Store.id == Snapshot.store_id)
                .where(Store.root_id == rid, *(() if include_history else (Snapshot.deleted_at.is_(None),)))
                .order_by(Snapshot.manifest_path, SnapshotSst.sst_path)
            ).all()
            stores = conn.execute(
                select(Store.operator, Store.partition)
                .where(Store.root_id == rid)
                .order_by(Store.operator, Store.partition)
            ).all()
        return {
            "stores": [tuple(r) for r in stores],
            "commits": [tuple(r) for r in commits],
            "versions": [tuple(r) for r in versions],
            "attempts": [tuple(r) for r in attempts],
            "snapshots": [tuple(r) for r in snapshots],
            "snapshot_ssts": [tuple(r) for r in snapshot_ssts],
            "files": [tuple(r) for r in files],
        }


# -- ingest ------------------------------------------------------------------------------------------


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

    def __init__(self, catalog: Catalog, uri: str, *, full: bool) -> None:
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
            for chunk in _chunks(rows):
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
            for chunk in _chunks(wanted):
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
        for chunk in _chunks(new):
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
                for vchunk in _chunks(need_versions):
                    for schunk in _chunks(need_stores):
                        for sid, v, cid in conn.execute(
                            select(Version.store_id, Version.version, Version.checkpoint_id).where(
                                Version.store_id.in_(schunk), Version.version.in_(vchunk)
                            )
                        ):
                            ids_of.setdefault((int(sid), int(v)), cid)
            commit_rows = []
            version_rows = []
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
                for op, ids in sorted(c.checkpoint_ids.items()):
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
            for chunk in _chunks(commit_rows):
                ins = self.catalog.insert(Commit)
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["root_id", "version"],
                        set_={k: ins.excluded[k] for k in ("committed_at", "operators", "partitions")},
                    ),
                    list(chunk),
                )
            vt = _t(Version)
            for chunk in _chunks(version_rows):
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
            rows = []
            attempts = []
            for o in observations:
                self._seen.add(o.path)
                sid = (
                    self._store_ids[(o.operator, o.partition)]
                    if o.operator is not None and o.partition is not None
                    else None
                )
                rows.append(
                    {
                        "root_id": self.root_id,
                        "path": o.path,
                        "kind": o.kind,
                        "store_id": sid,
                        "version": o.version,
                        "checkpoint_id": o.checkpoint_id,
                        "size": o.size,
                        "mtime": from_timestamp(o.mtime),
                        "state": STATE_ORPHAN if o.kind == KIND_TEMP else STATE_LIVE,
                        "first_seen": now,
                        "deleted_at": None,
                    }
                )
                if o.kind == KIND_CHANGELOG and sid is not None and o.version is not None and o.checkpoint_id:
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
            paths = [r["path"] for r in rows]
            existing: set[str] = set()
            for chunk in _chunks(paths):
                existing.update(
                    conn.execute(
                        select(File.path).where(
                            File.root_id == self.root_id, File.path.in_(chunk), File.state != STATE_DELETED
                        )
                    ).scalars()
                )
            self.stats.files_seen += len(rows)
            self.stats.files_new += len(set(paths) - existing)
            ft = _t(File)
            for chunk in _chunks(rows):
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
            for chunk in _chunks(attempts):
                conn.execute(
                    self.catalog.insert(Attempt).on_conflict_do_nothing(
                        index_elements=["store_id", "version", "checkpoint_id"]
                    ),
                    list(chunk),
                )

    # snapshots
    def add_snapshots(self, snapshots: Sequence[SnapshotObservation]) -> None:
        if not snapshots:
            return
        with self.catalog.write() as conn:
            self._ensure_stores(conn, ((s.operator, s.partition) for s in snapshots))
            for s in snapshots:
                sid = self._store_ids[(s.operator, s.partition)]
                ins = self.catalog.insert(Snapshot)
                conn.execute(
                    ins.values(
                        store_id=sid,
                        version=s.version,
                        checkpoint_id=s.checkpoint_id,
                        manifest_path=s.manifest_path,
                        sst_count=len(s.sst_files),
                        sst_bytes=sum(size for _, size in s.sst_files),
                        num_keys=s.num_keys,
                        created_at=from_timestamp(s.created_at),
                        deleted_at=None,
                    ).on_conflict_do_update(
                        index_elements=["store_id", "version", "checkpoint_id"], set_={"deleted_at": None}
                    )
                )
                snap_id = conn.execute(
                    select(Snapshot.id).where(
                        Snapshot.store_id == sid,
                        Snapshot.version == s.version,
                        Snapshot.checkpoint_id == s.checkpoint_id,
                    )
                ).scalar_one()
                refs = {path: size for path, size in s.sst_files}
                for chunk in _chunks(sorted(refs.items())):
                    conn.execute(
                        self.catalog.insert(SnapshotSst).on_conflict_do_nothing(
                            index_elements=["snapshot_id", "sst_path"]
                        ),
                        [{"snapshot_id": snap_id, "sst_path": p, "size": size} for p, size in chunk],
                    )
                self._sst_stores.add(sid)
                self._note_version(s.version)
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
            for schunk in _chunks(sorted(by_store)):
                for vchunk in _chunks(versions):
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
                self.stats.files_deleted = _mark_deleted(conn, self.root_id, gone, now, self._frozen)
                derive_states(conn, self.root_id, None, None, self._frozen)
            else:
                derive_states(conn, self.root_id, self._min_version, self._sst_stores, self._frozen)
            values: dict[str, Any] = {"last_sync_at": now}
            if self.full:
                values["last_full_sync_at"] = now
            conn.execute(update(CheckpointRoot).where(CheckpointRoot.id == self.root_id).values(**values))
        return self.stats


def _delete_derived(conn: Connection, rid: int) -> None:
    # Explicit deletes, children first (no reliance on ON DELETE CASCADE).
    store_ids = select(Store.id).where(Store.root_id == rid).scalar_subquery()
    snap_ids = select(Snapshot.id).where(Snapshot.store_id.in_(store_ids)).scalar_subquery()
    conn.execute(delete(SnapshotSst).where(SnapshotSst.snapshot_id.in_(snap_ids)))
    for by_store in (_t(Snapshot), _t(Attempt), _t(Version)):
        conn.execute(delete(by_store).where(by_store.c.store_id.in_(store_ids)))
    conn.execute(delete(File).where(File.root_id == rid))
    conn.execute(delete(Store).where(Store.root_id == rid))
    for by_root in (_t(Commit), _t(SyncCursor)):
        conn.execute(delete(by_root).where(by_root.c.root_id == rid))


def _mark_deleted(
    conn: Connection, rid: int, paths: Sequence[str], at: dt.datetime, frozen: AbstractSet[int] = frozenset()
) -> int:
    """Mark `paths` deleted; close their snapshots; re-derive SST states of the stores concerned."""
    n = 0
    stores: set[int] = set()
    manifests: list[str] = []
    for chunk in _chunks(paths):
        rows = conn.execute(
            select(File.path, File.kind, File.store_id).where(
                File.root_id == rid, File.path.in_(chunk), File.state != STATE_DELETED
            )
        ).all()
        for path, kind, sid in rows:
            if kind == KIND_MANIFEST:
                manifests.append(path)
            if sid is not None and kind in (KIND_MANIFEST, KIND_SST):
                stores.add(int(sid))
        n += conn.execute(
            update(File)
            .where(File.root_id == rid, File.path.in_(chunk), File.state != STATE_DELETED)
            .values(state=STATE_DELETED, deleted_at=at)
        ).rowcount
    for chunk in _chunks(manifests):
        conn.execute(
            update(Snapshot)
            .where(
                Snapshot.manifest_path.in_(chunk),
                Snapshot.store_id.in_(select(Store.id).where(Store.root_id == rid)),
                Snapshot.deleted_at.is_(None),
            )
            .values(deleted_at=at)
        )
    if stores - frozen:
        _derive_sst_states(conn, rid, stores - frozen)
    return n


def derive_states(
    conn: Connection, rid: int, min_version: int | None, sst_stores: set[int] | None, frozen: set[int] | None = None
) -> None:
    """Attempt outcomes and file states from versions, snapshots and files.

    Scope: attempts/files of versions >= `min_version` and SSTs of `sst_stores`; None means all.
    Deterministic in the catalog's content, so incremental and full syncs agree.
    """
    root_stores = select(Store.id).where(Store.root_id == rid)
    # 1. Pending attempts of versions now committed: committed or losing.
    committed_same = exists().where(
        Version.store_id == Attempt.store_id,
        Version.version == Attempt.version,
        Version.checkpoint_id == Attempt.checkpoint_id,
    )
    version_committed = exists().where(Version.store_id == Attempt.store_id, Version.version == Attempt.version)
    conn.execute(
        update(Attempt)
        .where(Attempt.store_id.in_(root_stores), Attempt.outcome == OUTCOME_PENDING, version_committed)
        .values(outcome=case((committed_same, OUTCOME_COMMITTED), else_=OUTCOME_LOSING))
        .execution_options(synchronize_session=False)
    )
    # 2. Changelogs and manifests of losing attempts are orphans.
    losing = exists().where(
        Version.store_id == File.store_id,
        Version.version == File.version,
        Version.checkpoint_id != File.checkpoint_id,
    )
    cond = [File.root_id == rid, File.state == STATE_LIVE, File.kind.in_((KIND_CHANGELOG, KIND_MANIFEST)), losing]
    if min_version is not None:
        cond.append(File.version >= min_version)
    if min_version is not None or sst_stores is None:
        conn.execute(update(File).where(*cond).values(state=STATE_ORPHAN).execution_options(synchronize_session=False))
    # 3. SSTs: live when a present manifest of the store references them, else orphan.
    if sst_stores is None:
        _derive_sst_states(conn, rid, None, frozen)
    elif sst_stores - (frozen or set()):
        _derive_sst_states(conn, rid, sst_stores - (frozen or set()))


def _derive_sst_states(conn: Connection, rid: int, stores: set[int] | None, exclude: set[int] | None = None) -> None:
    referenced = exists().where(
        SnapshotSst.sst_path == File.path,
        Snapshot.id == SnapshotSst.snapshot_id,
        Snapshot.store_id == File.store_id,
        Snapshot.deleted_at.is_(None),
    )
    cond = [File.root_id == rid, File.kind == KIND_SST, File.state.in_((STATE_LIVE, STATE_ORPHAN))]
    if exclude:
        cond.append(File.store_id.not_in(sorted(exclude)))
    groups: list[Sequence[int] | None] = [None] if stores is None else list(_chunks(sorted(stores)))
    for group in groups:
        where = [*cond, File.store_id.in_(group)] if group is not None else cond
        conn.execute(
            update(File)
            .where(*where)
            .values(state=case((referenced, STATE_LIVE), else_=STATE_ORPHAN))
            .execution_options(synchronize_session=False)
        )


__all__ = [
    "Catalog",
    "CatalogError",
    "CommitObservation",
    "FileObservation",
    "FileRecord",
    "RetentionPlan",
    "RunInfo",
    "RunRecorder",
    "SnapshotObservation",
    "StoreChain",
    "StoreInfo",
    "StoreRetention",
    "SyncStats",
    "SyncWriter",
    "VersionFiles",
    "derive_states",
]
