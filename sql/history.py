"""Catalog history retention: the rows of what is gone from a root are dropped once older than a horizon.

The catalog keeps a deleted file's row (state ``deleted``), a deleted snapshot's row and the version,
attempt, commit and layout rows of expired versions as history, and one row per maintenance run. A
store committing every second adds a few rows a second for as long as it runs, so without a horizon the
catalog of a fleet grows without bound while its checkpoint stays bounded. `prune_history` drops:

- ``files`` rows in state ``deleted`` whose ``deleted_at`` is before the horizon;
- ``snapshots`` (and their ``snapshot_ssts``) whose ``deleted_at`` is before it;
- ``attempts`` first seen before it whose changelog's row is gone or deleted history;
- per store, ``versions`` below the store's *history floor*, committed before it: the floor is the lowest
  version of the store's changelog and manifest rows and of the root's commit record rows that are not
  deleted history (a store with no such changelog or manifest keeps its rows: the catalog may not have
  listed it yet);
- per root, ``commits`` below the root's floor (the lowest commit record that is not deleted history, and
  no higher than any store's floor), committed before the horizon, and the ``layouts`` rows of those commits;
- ``maintenance_runs`` that ended before the horizon.

What stays is what a full sync of the checkpoint location would rebuild (invariant 6), plus the recent
history, the runs, and the parent id of each store's lowest version. Nothing a retained version needs is
dropped: its changelogs, snapshot and commit record are on the location, so their rows are not deleted
history and they are at or above the floors.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass

from sqlalchemy import ColumnElement, Connection, Executable, and_, delete, exists, func, not_, or_, select

from statekeeper.sql.base import CatalogBase, chunks
from statekeeper.sql.models import (
    KIND_CHANGELOG,
    KIND_COMMIT,
    KIND_MANIFEST,
    RUN_RUNNING,
    STATE_DELETED,
    Attempt,
    Commit,
    File,
    Layout,
    MaintenanceRun,
    Snapshot,
    SnapshotSst,
    Store,
    Version,
)

PRUNE_CHUNK = 20_000
"""Rows of deleted files dropped per transaction."""
STORES_PER_TRANSACTION = 100


@dataclass
class HistoryPruned:
    """Rows `prune_history` dropped, per table."""

    files: int = 0
    snapshots: int = 0
    versions: int = 0
    attempts: int = 0
    commits: int = 0
    layouts: int = 0
    runs: int = 0

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


class HistoryPruning(CatalogBase):
    def prune_history(self, uri: str, before: dt.datetime) -> HistoryPruned:
        """Drop root `uri`'s history older than `before` (see the module docstring).

        In short transactions (a group of stores, or `PRUNE_CHUNK` rows, each), so that a first pass over a
        large catalog never holds SQLite's write lock for long. The floors are read first: a deletion that
        lands meanwhile only raises them, so a stale floor keeps more, never less."""
        out = HistoryPruned()
        rid = self.find_root(uri)
        if rid is None:
            return out
        history = and_(File.state == STATE_DELETED, File.deleted_at < before)
        with self.read() as conn:
            root_floor = _commit_floor(conn, rid, history)
            floors = _store_floors(conn, rid, history)
            store_ids = [int(i) for i in conn.execute(select(Store.id).where(Store.root_id == rid)).scalars()]
        if root_floor is not None:  # a version whose commit record is present keeps its rows
            floors = {sid: min(floor, root_floor) for sid, floor in floors.items()}
            root_floor = min([root_floor, *floors.values()])
        changelog = exists().where(
            File.store_id == Attempt.store_id,
            File.kind == KIND_CHANGELOG,
            File.version == Attempt.version,
            File.checkpoint_id == Attempt.checkpoint_id,
            not_(history),
        )
        for group in chunks(store_ids, STORES_PER_TRANSACTION):
            with self.write() as conn:
                for sid in group:
                    if sid in floors:
                        stmt = delete(Version).where(
                            Version.store_id == sid, Version.version < floors[sid], Version.committed_at < before
                        )
                        out.versions += _deleted(conn, stmt)
                stmt = delete(Attempt).where(Attempt.store_id.in_(group), Attempt.first_seen < before, not_(changelog))
                out.attempts += _deleted(conn, stmt)
        with self.write() as conn:
            if root_floor is not None:
                out.commits += _deleted(
                    conn,
                    delete(Commit).where(
                        Commit.root_id == rid, Commit.version < root_floor, Commit.committed_at < before
                    ),
                )
                out.layouts += _prune_layouts(conn, rid, root_floor)
            of_root = select(Store.id).where(Store.root_id == rid)
            gone = select(Snapshot.id).where(Snapshot.store_id.in_(of_root), Snapshot.deleted_at < before)
            conn.execute(delete(SnapshotSst).where(SnapshotSst.snapshot_id.in_(gone.scalar_subquery())))
            out.snapshots += _deleted(conn, delete(Snapshot).where(Snapshot.id.in_(gone.scalar_subquery())))
            out.runs += _deleted(
                conn,
                delete(MaintenanceRun).where(
                    MaintenanceRun.root_id == rid,
                    MaintenanceRun.status != RUN_RUNNING,
                    MaintenanceRun.ended_at < before,
                ),
            )
        files = select(File.id).where(File.root_id == rid, history).limit(PRUNE_CHUNK).scalar_subquery()
        while True:
            with self.write() as conn:
                n = _deleted(conn, delete(File).where(File.id.in_(files)))
            out.files += n
            if n < PRUNE_CHUNK:
                return out


def _deleted(conn: Connection, statement: Executable) -> int:
    return int(conn.execute(statement).rowcount)


def _store_floors(conn: Connection, rid: int, history: ColumnElement[bool]) -> dict[int, int]:
    """Per store, the lowest version of its changelog and manifest rows that are not deleted history."""
    rows = conn.execute(
        select(File.store_id, func.min(File.version))
        .where(
            File.root_id == rid,
            File.store_id.is_not(None),
            File.version.is_not(None),
            or_(File.kind == KIND_CHANGELOG, File.kind == KIND_MANIFEST),
            not_(history),
        )
        .group_by(File.store_id)
    ).all()
    return {int(sid): int(v) for sid, v in rows if sid is not None and v is not None}


def _commit_floor(conn: Connection, rid: int, history: ColumnElement[bool]) -> int | None:
    v = conn.execute(
        select(func.min(File.version)).where(
            File.root_id == rid, File.kind == KIND_COMMIT, File.version.is_not(None), not_(history)
        )
    ).scalar_one_or_none()
    return None if v is None else int(v)


def _prune_layouts(conn: Connection, rid: int, floor: int) -> int:
    """Layout rows below `floor` whose commit row is gone: a layout row is part of its version's commit."""
    committed = exists().where(Commit.root_id == rid, Commit.version == Layout.version)
    return _deleted(conn, delete(Layout).where(Layout.root_id == rid, Layout.version < floor, not_(committed)))


__all__ = ["HistoryPruned", "HistoryPruning"]
