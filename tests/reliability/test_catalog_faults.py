"""Catalog faults in the middle of maintenance (DESIGN invariants 5, 6, 9): the database goes away,
is locked, or is deleted while a catalog sync, snapshot, expiry or orphan run is working.

Each fault is injected at a catalog transaction in the middle of a real run (the fault seam's
"catalog.transaction" point, `scenarios.observed`): PostgreSQL is stopped with `pg_ctl` (and started
again either during the run or after it), another process holds SQLite's write lock, the SQLite file
is deleted, the PostgreSQL database is dropped. Each time: the run either finishes (it waited or
reconnected) or fails with an error that says what went wrong (an exception naming the database, or
a report listing its errors), never anything else; the next run succeeds; `statekeeper catalog
rebuild` restores the catalog from the checkpoint location alone; the catalog then equals a rebuild
into a fresh database; and every retained version still loads with exactly the model's state
(`scenarios.check`: no file a retained version needs was deleted, `verify_root` is clean).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError

from statekeeper.maintenance import cli
from statekeeper.maintenance.catalog_sync import rebuild_catalog, sync_catalog
from statekeeper.maintenance.expiry import expire_versions
from statekeeper.maintenance.orphans import clean_orphans
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.sql import Catalog, upgrade
from statekeeper.sql.errors import CatalogError
from statekeeper.store import faults
from statekeeper.store.errors import StatekeeperError
from statekeeper.store.files import open_file_manager
from tests.catalog_export import catalog_export
from tests.model_steps import INJECTED
from tests.reliability.conftest import RestartablePostgres
from tests.reliability.scenarios import SCENARIOS, check, observed, settings, write_batches

FAULT_AT = 2
"""The fault strikes at this catalog transaction of the run: after it has recorded its start."""
# Another process: takes SQLite's write lock as soon as it can and holds it for 1.5 s.
OTHER_WRITER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(1.5)
conn.execute("ROLLBACK")
print("released", flush=True)
"""


@dataclass(frozen=True)
class Run:
    name: str
    go: Callable[[Catalog, str, str], Any]  # (catalog, root, work) -> report or sync result
    expires: bool  # what it deletes: only the newest versions stay retained


def _sync(catalog: Catalog, root: str, work: str) -> Any:
    return sync_catalog(catalog, open_file_manager(root), workers=1, record_run=True)


def _operation(op: Callable[..., Any]) -> Callable[[Catalog, str, str], Any]:
    return lambda catalog, root, work: op(open_file_manager(root), settings(work), catalog=catalog)


RUNS = [
    Run("sync", _sync, expires=False),
    Run("snapshot", _operation(create_snapshots), expires=False),
    Run("expiry", _operation(expire_versions), expires=True),
    Run("orphans", _operation(clean_orphans), expires=True),
]


def _cases(default: set[str], *extra: str) -> list[Any]:
    """A parameter set per run (after the `extra` values); runs not in `default` are `slow` (each case
    writes, snapshots and checks a small history: several seconds on 2 cores)."""
    return [
        pytest.param(*extra, r, id="-".join([*extra, r.name]), marks=() if r.name in default else pytest.mark.slow)
        for r in RUNS
    ]


def _history(root: str, work: str, catalog: Catalog) -> None:
    """Versions 1-8 of two stores with losing attempts (orphans), a snapshot at 5 and a catalog that
    saw the first five: every run below has work to do."""
    write_batches(root, work, 5, losing=True)
    fm = open_file_manager(root)
    report = create_snapshots(fm, settings(work), catalog=catalog)
    assert report.ok, report.errors
    sync_catalog(catalog, fm, workers=1)
    write_batches(root, work, 3, losing=True)


def _ok(outcome: Any) -> bool:
    return not outcome.errors if hasattr(outcome, "errors") else False


@contextmanager
def fault_at_transaction(n: int, action: Callable[[], None]) -> Iterator[list[int]]:
    """Run `action` (once) when the run reaches its `n`-th catalog transaction; yields [transactions seen]."""
    seen = [0]

    def hook(point: str, subject: str) -> None:
        if point == "catalog.transaction":
            seen[0] += 1
            if seen[0] == n:
                action()

    previous = faults.arm(hook)
    try:
        yield seen
    finally:
        faults.arm(previous)


def _attempt(run: Run, catalog: Catalog, root: str, work: str) -> Any:
    """The run's outcome: its report/result, or the exception it raised."""
    try:
        return run.go(catalog, root, work)
    except (CatalogError, DBAPIError, StatekeeperError) as e:
        return e


def _assert_clear(outcome: Any, database: str) -> None:
    """A failure says what failed: an exception naming the database or its connection, or a report
    whose every error is a sentence."""
    if isinstance(outcome, BaseException):
        text = str(outcome).lower()
        assert any(w in text for w in (database.lower(), "connection", "server", "catalog", "database")), outcome
    elif not _ok(outcome):
        assert outcome.errors and all(len(str(e)) > 10 for e in outcome.errors), outcome.errors


def _assert_recovered(run: Run, catalog: Catalog, url: str, root: str, work: str, fresh_url: str) -> None:
    """The next run succeeds; `statekeeper catalog rebuild` restores the catalog; nothing retained is lost."""
    outcome = run.go(catalog, root, work)
    assert _ok(outcome), outcome.errors
    assert cli.main(["catalog", "rebuild", root, "--db", url]) == 0
    fm = open_file_manager(root)
    sync_catalog(catalog, fm, full=True, workers=1)
    with closing(Catalog.open(fresh_url)) as fresh:
        rebuild_catalog(fresh, fm, workers=1)
        uri = fm.root_uri
        assert _normalised(catalog_export(catalog, uri)) == _normalised(catalog_export(fresh, uri))
    problems = check(root, work, SCENARIOS["expiry" if run.expires else "commit"], committed_before=8)
    assert problems == []


def _normalised(export: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    from tests.maintenance.test_crash import _normalised as normalised

    return normalised(export)


# -- PostgreSQL stopped --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("restart", "run"), _cases({"sync", "expiry"}, "during") + _cases({"snapshot", "orphans"}, "after")
)
def test_postgres_stopped_mid_run(
    restartable_postgres: RestartablePostgres, tmp_path: Path, run: Run, restart: str
) -> None:
    """PostgreSQL stops at the run's second catalog transaction and comes back 0.3 s later (while the
    run goes on) or only after the run ended."""
    pg = restartable_postgres
    url, fresh_url = pg.new_database(), pg.new_database()
    upgrade(url)
    upgrade(fresh_url)
    root, work = str(tmp_path / "root"), str(tmp_path / "work")
    catalog = observed(Catalog.open(url))
    restarted: list[threading.Thread] = []

    def stop() -> None:
        pg.halt()
        INJECTED[f"postgres stopped ({run.name})"] += 1
        if restart == "during":
            t = threading.Timer(0.3, pg.resume)
            t.start()
            restarted.append(t)

    try:
        _history(root, work, catalog)
        with fault_at_transaction(FAULT_AT, stop) as seen:
            outcome = _attempt(run, catalog, root, work)
        assert seen[0] >= FAULT_AT, f"the {run.name} run made only {seen[0]} catalog transaction(s)"
        for t in restarted:
            t.join()
        if restart == "after":
            assert not _ok(outcome), "the run succeeded without its database"
            pg.resume()
        _assert_clear(outcome, "postgres")
        _assert_recovered(run, catalog, url, root, work, fresh_url)
    finally:
        catalog.close()
        pg.drop_database(url)
        pg.drop_database(fresh_url)


# -- SQLite: locked by another writer, deleted -----------------------------------------------------


def _sqlite(tmp_path: Path, name: str) -> str:
    url = f"sqlite:///{tmp_path / name}"
    upgrade(url)
    return url


@pytest.mark.parametrize("run", _cases({"sync", "expiry"}))
def test_sqlite_locked_by_another_writer(tmp_path: Path, run: Run) -> None:
    """Another process takes SQLite's write lock in the middle of the run and holds it for 1.5 s: the
    run waits for it (busy timeout) and finishes."""
    url, path = _sqlite(tmp_path, "catalog.db"), tmp_path / "catalog.db"
    root, work = str(tmp_path / "root"), str(tmp_path / "work")
    catalog = observed(Catalog.open(url))
    writers: list[subprocess.Popen[str]] = []

    def lock() -> None:
        INJECTED[f"SQLite locked ({run.name})"] += 1
        # BEGIN IMMEDIATE waits for the run's transaction to commit, then blocks the run's next one
        writers.append(
            subprocess.Popen([sys.executable, "-c", OTHER_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        )

    try:
        _history(root, work, catalog)
        with fault_at_transaction(FAULT_AT, lock):
            outcome = _attempt(run, catalog, root, work)
        out, _ = writers[0].communicate(timeout=120)
        assert writers[0].returncode == 0 and out.split() == ["locked", "released"], out
        _assert_clear(outcome, str(path))
        assert _ok(outcome), outcome  # a 1.5 s lock is waited for, not an error
        _assert_recovered(run, catalog, url, root, work, _sqlite(tmp_path, "fresh.db"))
    finally:
        catalog.close()


@pytest.mark.parametrize("run", _cases({"snapshot", "orphans"}))
def test_sqlite_catalog_deleted_mid_run(tmp_path: Path, run: Run) -> None:
    """The SQLite catalog file is deleted in the middle of the run: the run finishes or fails clearly,
    opening the catalog again says it is not a catalog, and `statekeeper db upgrade` + `catalog
    rebuild` bring it back from the checkpoint location."""
    url, path = _sqlite(tmp_path, "catalog.db"), tmp_path / "catalog.db"
    root, work = str(tmp_path / "root"), str(tmp_path / "work")
    catalog = observed(Catalog.open(url))

    def delete() -> None:
        INJECTED[f"catalog deleted ({run.name})"] += 1
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(f"{path}{suffix}"):
                os.unlink(f"{path}{suffix}")

    try:
        _history(root, work, catalog)
        with fault_at_transaction(FAULT_AT, delete) as seen:
            outcome = _attempt(run, catalog, root, work)
        assert seen[0] >= FAULT_AT
        _assert_clear(outcome, str(path))
    finally:
        catalog.close()
    with pytest.raises(CatalogError, match="catalog"):
        Catalog.open(url).close()
    assert cli.main(["db", "upgrade", "--db", url]) == 0
    catalog = observed(Catalog.open(url))
    try:
        _assert_recovered(run, catalog, url, root, work, _sqlite(tmp_path, "fresh.db"))
    finally:
        catalog.close()


@pytest.mark.parametrize("run", _cases({"expiry"}))
def test_postgres_catalog_dropped_mid_run(restartable_postgres: RestartablePostgres, tmp_path: Path, run: Run) -> None:
    """The PostgreSQL catalog database is dropped (WITH (FORCE): sessions cut) in the middle of the run:
    the run fails clearly, opening it says so, and a new database, `statekeeper db upgrade` and
    `catalog rebuild` bring the catalog back from the checkpoint location."""
    pg = restartable_postgres
    url, new_url, fresh_url = pg.new_database(), pg.new_database(), pg.new_database()
    upgrade(fresh_url)
    upgrade(url)
    root, work = str(tmp_path / "root"), str(tmp_path / "work")
    catalog = observed(Catalog.open(url))

    def drop() -> None:
        INJECTED[f"catalog deleted ({run.name})"] += 1
        pg.drop_database(url)

    try:
        _history(root, work, catalog)
        with fault_at_transaction(FAULT_AT, drop) as seen:
            outcome = _attempt(run, catalog, root, work)
        assert seen[0] >= FAULT_AT
        assert not _ok(outcome), "the run succeeded without its database"
        _assert_clear(outcome, "postgres")
    finally:
        catalog.close()
    with pytest.raises(CatalogError, match="catalog database"):
        Catalog.open(url).close()
    assert cli.main(["db", "upgrade", "--db", new_url]) == 0
    catalog = observed(Catalog.open(new_url))
    try:
        _assert_recovered(run, catalog, new_url, root, work, fresh_url)
    finally:
        catalog.close()
        for u in (new_url, fresh_url):
            pg.drop_database(u)
