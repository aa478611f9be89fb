"""A canonical export of what the catalog derived from one checkpoint root: sorted plain tuples.

Invariant 6 (the checkpoint location is the source of truth) is tested by comparing exports: a full
rebuild into an empty database must export the same as any sequence of incremental syncs (tests/sql,
tests/maintenance, tests/reliability). Bookkeeping times (first seen, last sync) are left out on purpose, so
that such exports compare equal. A test helper, not a product query: it reads the catalog's tables directly
and no command or operation of the product needs it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, select

from statekeeper.sql.base import CatalogBase
from statekeeper.sql.models import (
    KIND_CHANGELOG,
    KIND_COMMIT,
    STATE_DELETED,
    Attempt,
    Commit,
    File,
    Snapshot,
    SnapshotSst,
    Store,
    Version,
)


def catalog_export(
    catalog: CatalogBase, uri: str, *, include_history: bool = False
) -> dict[str, list[tuple[Any, ...]]]:
    """Everything `catalog` derived from root `uri`, as sorted tuples without bookkeeping times.

    Without `include_history` only what is present now: a full rebuild into an empty database
    gives the same export as any sequence of syncs of the same checkpoint location.
    """
    rid = catalog.root_id(uri)
    present = File.state != STATE_DELETED
    with catalog.read() as conn:
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
