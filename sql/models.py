"""SQLAlchemy 2.0 models of the lineage catalog (schema history in `sql/migrations/versions`).

The catalog is derived from the checkpoint location (DESIGN invariant 6): every row except the
maintenance runs and the leases can be rebuilt by a full catalog sync. Times are stored as naive UTC
and returned as timezone-aware UTC datetimes on every backend (`UTCDateTime`).

Tables (one checkpoint root per streaming query):

- ``checkpoint_roots``   a root URI, its last sync times
- ``sync_cursors``       per root and listing prefix, the last name an incremental sync listed
- ``stores``             (root, operator, partition)
- ``commits``            per root and version: the commit record (when the driver committed it)
- ``versions``           per store and committed version: checkpoint id, parent id (version - 1)
- ``attempts``           every changelog attempt seen: committed, losing or pending
- ``snapshots``          per store, version and id: SST count, bytes, keys; ``snapshot_ssts`` lists its SSTs
- ``files``              every file under a root: kind, size, mtime, state, first seen, deleted at
- ``maintenance_runs``   one row per maintenance run, with counts, bytes, errors
- ``maintenance_leases`` who maintains which store (or the whole root, ``'*'``) until when
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

# File kinds.
KIND_COMMIT = "commit"
KIND_CHANGELOG = "changelog"
KIND_MANIFEST = "manifest"
KIND_SST = "sst"
KIND_TEMP = "temp"
KIND_FOREIGN = "foreign"
KIND_BATCH = "batch"
"""The Spark driver's per-batch file (`spark/<operator>/batches/`); its version is the one the batch commits."""
KIND_HEARTBEAT = "heartbeat"
"""The Spark driver's heartbeat (`spark/<operator>/heartbeats/`)."""
FILE_KINDS = (KIND_COMMIT, KIND_CHANGELOG, KIND_MANIFEST, KIND_SST, KIND_TEMP, KIND_FOREIGN, KIND_BATCH, KIND_HEARTBEAT)

# File states.
STATE_LIVE = "live"
STATE_EXPIRED = "expired"
STATE_ORPHAN = "orphan"
STATE_DELETED = "deleted"
FILE_STATES = (STATE_LIVE, STATE_EXPIRED, STATE_ORPHAN, STATE_DELETED)

# Attempt outcomes.
OUTCOME_COMMITTED = "committed"
OUTCOME_LOSING = "losing"
OUTCOME_PENDING = "pending"
OUTCOMES = (OUTCOME_COMMITTED, OUTCOME_LOSING, OUTCOME_PENDING)

# Maintenance run statuses.
RUN_RUNNING = "running"
RUN_SUCCEEDED = "succeeded"
RUN_FAILED = "failed"
RUN_STATUSES = (RUN_RUNNING, RUN_SUCCEEDED, RUN_FAILED)

ROOT_SCOPE = "*"
"""Lease scope meaning the whole checkpoint root."""

URI_LEN = 1024
PATH_LEN = 1024


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Naive UTC in the database, aware UTC in Python; refuses naive datetimes on the way in."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware datetime")
        return value.astimezone(dt.UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        assert isinstance(value, dt.datetime)
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dt.datetime: UTCDateTime()}


class CheckpointRoot(Base):
    __tablename__ = "checkpoint_roots"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uri: Mapped[str] = mapped_column(String(URI_LEN), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_sync_at: Mapped[dt.datetime | None]
    last_full_sync_at: Mapped[dt.datetime | None]

    stores: Mapped[list[Store]] = relationship(back_populates="root", cascade="all, delete-orphan", lazy="raise")


class SyncCursor(Base):
    """Where the next incremental listing of `prefix` starts (S3 StartAfter / local start_after)."""

    __tablename__ = "sync_cursors"

    root_id: Mapped[int] = mapped_column(ForeignKey("checkpoint_roots.id", ondelete="CASCADE"), primary_key=True)
    prefix: Mapped[str] = mapped_column(String(PATH_LEN), primary_key=True)
    start_after: Mapped[str] = mapped_column(String(PATH_LEN))


class Store(Base):
    __tablename__ = "stores"
    __table_args__ = (UniqueConstraint("root_id", "operator", "partition"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    root_id: Mapped[int] = mapped_column(ForeignKey("checkpoint_roots.id", ondelete="CASCADE"))
    operator: Mapped[str] = mapped_column(String(200))
    partition: Mapped[int] = mapped_column(Integer)

    root: Mapped[CheckpointRoot] = relationship(back_populates="stores", lazy="raise")


class Commit(Base):
    """A commit record: version `version` of the root is committed (the state after batch version - 1)."""

    __tablename__ = "commits"

    root_id: Mapped[int] = mapped_column(ForeignKey("checkpoint_roots.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    committed_at: Mapped[dt.datetime]
    operators: Mapped[int] = mapped_column(Integer)
    partitions: Mapped[int] = mapped_column(Integer)


class Layout(Base):
    """An operator's layout at one committed version: its partition count and key groups (None: a
    legacy layout without key groups), and ``change`` when this version rescaled or rolled it back."""

    __tablename__ = "layouts"

    root_id: Mapped[int] = mapped_column(ForeignKey("checkpoint_roots.id", ondelete="CASCADE"), primary_key=True)
    operator: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    partitions: Mapped[int] = mapped_column(Integer)
    max_key_groups: Mapped[int | None] = mapped_column(Integer)
    change: Mapped[str | None] = mapped_column(String(16))
    batch_id: Mapped[int] = mapped_column(BigInteger)


class Version(Base):
    """A committed version of one store: the winning checkpoint id and the id it was built on."""

    __tablename__ = "versions"

    store_id: Mapped[int] = mapped_column(ForeignKey("stores.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    checkpoint_id: Mapped[str] = mapped_column(String(32))
    parent_id: Mapped[str | None] = mapped_column(String(32))
    """Checkpoint id of version - 1 (None for version 1, or when no record of it is left)."""
    committed_at: Mapped[dt.datetime]


class Attempt(Base):
    """One commit attempt (a changelog) of a store version; `losing` once another id won."""

    __tablename__ = "attempts"
    __table_args__ = (
        CheckConstraint(_in("outcome", OUTCOMES), name="outcome"),
        Index(None, "outcome"),
    )

    store_id: Mapped[int] = mapped_column(ForeignKey("stores.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    checkpoint_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16))
    first_seen: Mapped[dt.datetime]


class Snapshot(Base):
    __tablename__ = "snapshots"
    __table_args__ = (UniqueConstraint("store_id", "version", "checkpoint_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    store_id: Mapped[int] = mapped_column(ForeignKey("stores.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(BigInteger)
    checkpoint_id: Mapped[str] = mapped_column(String(32))
    manifest_path: Mapped[str] = mapped_column(String(PATH_LEN))
    sst_count: Mapped[int] = mapped_column(Integer)
    sst_bytes: Mapped[int] = mapped_column(BigInteger)
    num_keys: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime]
    deleted_at: Mapped[dt.datetime | None]
    """Set when its manifest is gone from the checkpoint location."""


class SnapshotSst(Base):
    """An SST file a snapshot's manifest references (SSTs are shared between snapshots)."""

    __tablename__ = "snapshot_ssts"
    __table_args__ = (Index(None, "sst_path"),)

    snapshot_id: Mapped[int] = mapped_column(ForeignKey("snapshots.id", ondelete="CASCADE"), primary_key=True)
    sst_path: Mapped[str] = mapped_column(String(PATH_LEN), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)


class File(Base):
    """Every file seen under a root; `deleted` rows are kept as history (until `Catalog.prune_history`)."""

    __tablename__ = "files"
    __table_args__ = (
        UniqueConstraint("root_id", "path"),
        CheckConstraint(_in("kind", FILE_KINDS), name="kind"),
        CheckConstraint(_in("state", FILE_STATES), name="state"),
        Index(None, "store_id", "kind", "version"),
        Index(None, "root_id", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    root_id: Mapped[int] = mapped_column(ForeignKey("checkpoint_roots.id", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(String(PATH_LEN))
    kind: Mapped[str] = mapped_column(String(16))
    store_id: Mapped[int | None] = mapped_column(ForeignKey("stores.id", ondelete="CASCADE"))
    version: Mapped[int | None] = mapped_column(BigInteger)
    checkpoint_id: Mapped[str | None] = mapped_column(String(32))
    size: Mapped[int] = mapped_column(BigInteger)
    mtime: Mapped[dt.datetime]
    state: Mapped[str] = mapped_column(String(16))
    first_seen: Mapped[dt.datetime]
    deleted_at: Mapped[dt.datetime | None]


class MaintenanceRun(Base):
    __tablename__ = "maintenance_runs"
    __table_args__ = (
        CheckConstraint(_in("status", RUN_STATUSES), name="status"),
        Index(None, "root_id", "started_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    root_id: Mapped[int] = mapped_column(ForeignKey("checkpoint_roots.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[dt.datetime]
    ended_at: Mapped[dt.datetime | None]
    status: Mapped[str] = mapped_column(String(16))
    dry_run: Mapped[bool] = mapped_column(Boolean)
    orchestrator_run_id: Mapped[str | None] = mapped_column(String(200))
    store_count: Mapped[int] = mapped_column(Integer, default=0)
    file_count: Mapped[int] = mapped_column(BigInteger, default=0)
    byte_count: Mapped[int] = mapped_column(BigInteger, default=0)
    error_count: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class MaintenanceLease(Base):
    """One maintainer per store (DESIGN invariant 5); scope is 'operator/partition' or '*' (whole root)."""

    __tablename__ = "maintenance_leases"

    root_id: Mapped[int] = mapped_column(ForeignKey("checkpoint_roots.id", ondelete="CASCADE"), primary_key=True)
    scope: Mapped[str] = mapped_column(String(220), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    token: Mapped[str] = mapped_column(String(32))
    acquired_at: Mapped[dt.datetime]
    expires_at: Mapped[dt.datetime]


__all__ = [
    "FILE_KINDS",
    "FILE_STATES",
    "OUTCOMES",
    "ROOT_SCOPE",
    "RUN_STATUSES",
    "Attempt",
    "Base",
    "CheckpointRoot",
    "Commit",
    "File",
    "MaintenanceLease",
    "MaintenanceRun",
    "Snapshot",
    "SnapshotSst",
    "Store",
    "SyncCursor",
    "UTCDateTime",
    "Version",
]
