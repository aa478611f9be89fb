"""File states and attempt outcomes: derived from the catalog's rows, never set by hand.

A file is ``live``, ``orphan``, ``expired`` or ``deleted`` (see `statekeeper.sql.models`); an attempt is
``pending``, ``committed`` or ``losing``. Both follow from the versions, snapshots and files the catalog
holds, deterministically, so an incremental and a full sync of the same checkpoint location agree.
Used by the sync (`statekeeper.sql.ingest.SyncWriter`) and by maintenance reporting what it is about to delete and
what it deleted (`Catalog.mark_expired`, `Catalog.mark_deleted`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

from sqlalchemy import Connection, case, exists, select, update

from statekeeper.sql.base import CatalogBase, chunks
from statekeeper.sql.models import (
    KIND_CHANGELOG,
    KIND_MANIFEST,
    KIND_SST,
    OUTCOME_COMMITTED,
    OUTCOME_LOSING,
    OUTCOME_PENDING,
    STATE_DELETED,
    STATE_EXPIRED,
    STATE_LIVE,
    STATE_ORPHAN,
    Attempt,
    File,
    Snapshot,
    SnapshotSst,
    Store,
    Version,
    utcnow,
)


def mark_paths_deleted(
    conn: Connection, rid: int, paths: Sequence[str], at: dt.datetime, frozen: AbstractSet[int] = frozenset()
) -> int:
    """Mark `paths` deleted; close their snapshots; re-derive SST states of the stores concerned."""
    n = 0
    stores: set[int] = set()
    manifests: list[str] = []
    for chunk in chunks(paths):
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
    for chunk in chunks(manifests):
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
        derive_sst_states(conn, rid, stores - frozen)
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
        derive_sst_states(conn, rid, None, frozen)
    elif sst_stores - (frozen or set()):
        derive_sst_states(conn, rid, sst_stores - (frozen or set()))


def derive_sst_states(conn: Connection, rid: int, stores: set[int] | None, exclude: set[int] | None = None) -> None:
    """SSTs of `stores` (None: every store but `exclude`): live when a present manifest of their store
    references them, else orphan."""
    referenced = exists().where(
        SnapshotSst.sst_path == File.path,
        Snapshot.id == SnapshotSst.snapshot_id,
        Snapshot.store_id == File.store_id,
        Snapshot.deleted_at.is_(None),
    )
    cond = [File.root_id == rid, File.kind == KIND_SST, File.state.in_((STATE_LIVE, STATE_ORPHAN))]
    if exclude:
        cond.append(File.store_id.not_in(sorted(exclude)))
    groups: list[Sequence[int] | None] = [None] if stores is None else list(chunks(sorted(stores)))
    for group in groups:
        where = [*cond, File.store_id.in_(group)] if group is not None else cond
        conn.execute(
            update(File)
            .where(*where)
            .values(state=case((referenced, STATE_LIVE), else_=STATE_ORPHAN))
            .execution_options(synchronize_session=False)
        )


class FileStateUpdates(CatalogBase):
    """What maintenance reports about files it expires and deletes."""

    def mark_deleted(self, uri: str, paths: Iterable[str], *, at: dt.datetime | None = None) -> int:
        """Record that `paths` are gone from the checkpoint location (maintenance deleted them)."""
        with self.write() as conn:
            return mark_paths_deleted(conn, self.root_in(conn, uri), list(paths), at or utcnow())

    def mark_expired(self, uri: str, paths: Iterable[str]) -> int:
        """Record that expiry is about to delete `paths` (live or orphan files only)."""
        n = 0
        with self.write() as conn:
            rid = self.root_in(conn, uri)
            for chunk in chunks(list(paths)):
                n += conn.execute(
                    update(File)
                    .where(File.root_id == rid, File.path.in_(chunk), File.state.in_((STATE_LIVE, STATE_ORPHAN)))
                    .values(state=STATE_EXPIRED)
                ).rowcount
        return n
