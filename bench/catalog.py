"""What does pruning the catalog's history cost on the embedded SQLite catalog?

Catalog history retention: what `Catalog.prune_history` costs on the embedded SQLite catalog.

A catalog filled as a root of S stores that committed V versions leaves it (per store and version a
changelog row, a version row and an attempt row; per version a commit record row and a commit row), the
oldest half older than the horizon, all but the newest 30 versions' files deleted. One pass drops the
history past the horizon; the next pass, with nothing to drop, is what expiry pays every 5 minutes per
root (`statekeeper.maintenance.expiry.PRUNE_EVERY_SECONDS`) over the history it keeps.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
import time
from typing import Any

from sqlalchemy import func, insert, select

from bench.report import Table
from statekeeper.maintenance.expiry import PRUNE_EVERY_SECONDS
from statekeeper.sql import Catalog
from statekeeper.sql.models import Attempt, Base, Commit, File, Store, Version, utcnow

LIVE_VERSIONS = 30
CID = "0" * 32


def _fill(catalog: Catalog, uri: str, stores: int, versions: int, now: dt.datetime) -> None:
    old, recent = now - dt.timedelta(days=2), now - dt.timedelta(hours=1)
    live_from = versions - LIVE_VERSIONS

    def at(v: int) -> dt.datetime:
        return old if v < versions // 2 else recent

    rid = catalog.ensure_root(uri)
    with catalog.write() as conn:
        conn.execute(insert(Store), [{"root_id": rid, "operator": "agg", "partition": p} for p in range(stores)])
        sids = [catalog.store_id(conn, rid, "agg", p) for p in range(stores)]
        for sid in sids:
            rows: list[dict[str, Any]] = []
            for v in range(1, versions + 1):
                gone = v < live_from
                rows.append(
                    {
                        "root_id": rid,
                        "path": f"state/agg/{sid:05d}/changelogs/{v:020d}_{CID}.changelog",
                        "kind": "changelog",
                        "store_id": sid,
                        "version": v,
                        "checkpoint_id": CID,
                        "size": 100,
                        "mtime": at(v),
                        "state": "deleted" if gone else "live",
                        "first_seen": at(v),
                        "deleted_at": at(v) if gone else None,
                    }
                )
            conn.execute(insert(File), rows)
            conn.execute(
                insert(Version),
                [
                    {"store_id": sid, "version": v, "checkpoint_id": CID, "parent_id": CID, "committed_at": at(v)}
                    for v in range(1, versions + 1)
                ],
            )
            conn.execute(
                insert(Attempt),
                [
                    {"store_id": sid, "version": v, "checkpoint_id": CID, "outcome": "committed", "first_seen": at(v)}
                    for v in range(1, versions + 1)
                ],
            )
        conn.execute(
            insert(Commit),
            [
                {"root_id": rid, "version": v, "committed_at": at(v), "operators": 1, "partitions": stores}
                for v in range(1, versions + 1)
            ],
        )
        conn.execute(
            insert(File),
            [
                {
                    "root_id": rid,
                    "path": f"commits/{v:020d}.commit",
                    "kind": "commit",
                    "version": v,
                    "size": 10,
                    "mtime": at(v),
                    "state": "deleted" if v < live_from else "live",
                    "first_seen": at(v),
                    "deleted_at": at(v) if v < live_from else None,
                }
                for v in range(1, versions + 1)
            ],
        )


def _rows(catalog: Catalog) -> int:
    with catalog.read() as conn:
        counts = (conn.execute(select(func.count()).select_from(t)).scalar_one() for t in Base.metadata.sorted_tables)
        return sum(int(n) for n in counts)


def run(quick: bool) -> list[Table]:
    sizes = [(10, 200)] if quick else [(100, 1000), (100, 4000), (400, 4000)]
    table = Table(
        "Catalog history: one prune pass on SQLite",
        [
            "stores x versions",
            "rows",
            "dropped",
            "drop pass (s)",
            "rows left",
            "pass with nothing to drop (s)",
            f"core share at one pass per {PRUNE_EVERY_SECONDS:.0f} s",
        ],
        [],
        [
            "Synthetic rows (`bench/catalog.py`): per store and version a changelog, version and attempt row, "
            "per version a commit and its record's row; the older half past the horizon; files of all but the "
            f"newest {LIVE_VERSIONS} versions deleted. The embedded SQLite catalog on local disk, one process.",
            "A pass runs in short write transactions (at most 20,000 file rows, or 100 stores' versions and "
            "attempts, each), so a first pass over a large catalog does not hold SQLite's write lock throughout.",
        ],
    )
    for stores, versions in sizes:
        work = tempfile.mkdtemp(prefix="bench-catalog-")
        try:
            with Catalog.open(f"sqlite:///{work}/catalog.db", upgrade=True) as catalog:
                now = utcnow()
                _fill(catalog, "file:///bench", stores, versions, now)
                before_rows = _rows(catalog)
                horizon = now - dt.timedelta(days=1)
                t0 = time.perf_counter()
                dropped = catalog.prune_history("file:///bench", horizon).total
                drop_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                again = catalog.prune_history("file:///bench", horizon).total
                idle_s = time.perf_counter() - t0
                assert again == 0
                table.rows.append(
                    [
                        f"{stores} x {versions}",
                        before_rows,
                        dropped,
                        round(drop_s, 3),
                        _rows(catalog),
                        round(idle_s, 3),
                        f"{100 * idle_s / PRUNE_EVERY_SECONDS:.2f}%",
                    ]
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return [table]
