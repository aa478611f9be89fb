"""Migrations from an empty database, schema == models, URL handling, model round trips."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.orm import Session

from statekeeper.sql import (
    Catalog,
    CatalogConfigError,
    CatalogError,
    current_revision,
    head_revision,
    make_engine,
    upgrade,
)
from statekeeper.sql.db import default_url, downgrade, normalize_url
from statekeeper.sql.models import (
    Attempt,
    Base,
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
)

REPO = Path(__file__).resolve().parents[2]

TABLES = frozenset(Base.metadata.tables)
"""Every table the models declare (sql/models.py): the migrations must create exactly these."""


def test_upgrade_from_empty(db_url: str) -> None:
    assert current_revision(db_url) is None
    with pytest.raises(CatalogError, match="statekeeper db upgrade"):
        Catalog.open(db_url)
    assert upgrade(db_url) == head_revision()
    assert current_revision(db_url) == head_revision()
    assert upgrade(db_url) == head_revision()  # idempotent
    engine = make_engine(db_url)
    try:
        assert TABLES and set(inspect(engine).get_table_names()) - {"alembic_version"} == TABLES
        # The migrations create exactly what the models describe.
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_downgrade_to_base_and_back(db_url: str) -> None:
    upgrade(db_url)
    assert downgrade(db_url, "base") is None
    engine = make_engine(db_url)
    try:
        assert not TABLES & set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert upgrade(db_url) == head_revision()


def test_catalog_refuses_foreign_database(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE unrelated (x INTEGER)")
        with pytest.raises(CatalogError, match="no schema revision"):
            Catalog(engine)
    finally:
        engine.dispose()


def test_models_round_trip(catalog: Catalog) -> None:
    t = dt.datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=dt.UTC)
    with Session(catalog.engine) as s, s.begin():
        root = CheckpointRoot(uri="file:///ckpt", created_at=t)
        s.add(root)
        s.flush()
        store = Store(root_id=root.id, operator="agg", partition=3)
        s.add(store)
        s.flush()
        s.add_all(
            [
                SyncCursor(root_id=root.id, prefix="commits/", start_after="commits/x"),
                Commit(root_id=root.id, version=2**40, committed_at=t, operators=1, partitions=4),
                Version(store_id=store.id, version=2**40, checkpoint_id="a" * 32, parent_id=None, committed_at=t),
                Attempt(store_id=store.id, version=2**40, checkpoint_id="b" * 32, outcome="losing", first_seen=t),
                File(
                    root_id=root.id,
                    path="state/agg/00003/sst/x.sst",
                    kind="sst",
                    store_id=store.id,
                    size=2**40,
                    mtime=t,
                    state="orphan",
                    first_seen=t,
                ),
                MaintenanceRun(
                    root_id=root.id,
                    kind="expire",
                    started_at=t,
                    status="failed",
                    dry_run=True,
                    errors="boom",
                    details={"a": [1, 2]},
                ),
                MaintenanceLease(root_id=root.id, scope="*", owner="me", token="c" * 32, acquired_at=t, expires_at=t),
            ]
        )
        snap = Snapshot(
            store_id=store.id,
            version=7,
            checkpoint_id="d" * 32,
            manifest_path="m",
            sst_count=1,
            sst_bytes=10,
            num_keys=5,
            created_at=t,
        )
        s.add(snap)
        s.flush()
        s.add(SnapshotSst(snapshot_id=snap.id, sst_path="state/agg/00003/sst/x.sst", size=10))
    with Session(catalog.engine) as s:
        f = s.scalars(select(File)).one()
        assert (f.size, f.mtime, f.state, f.deleted_at) == (2**40, t, "orphan", None)
        assert f.mtime.tzinfo is dt.UTC
        assert s.scalars(select(Version)).one().version == 2**40
        run = s.scalars(select(MaintenanceRun)).one()
        assert (run.details, run.dry_run, run.store_count, run.file_count) == ({"a": [1, 2]}, True, 0, 0)
        assert s.scalars(select(MaintenanceLease)).one().expires_at == t
        assert s.scalars(select(SnapshotSst)).one().size == 10
    # Constraints hold on both backends.
    with pytest.raises(IntegrityError), Session(catalog.engine) as s, s.begin():
        s.add(Store(root_id=1, operator="agg", partition=3))
    with pytest.raises(IntegrityError), Session(catalog.engine) as s, s.begin():
        s.add(File(root_id=1, path="p", kind="bogus", size=0, mtime=t, state="live", first_seen=t))
    with pytest.raises(StatementError, match="naive"), Session(catalog.engine) as s, s.begin():
        s.add(CheckpointRoot(uri="x", created_at=dt.datetime(2026, 1, 1)))


def test_urls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STATEKEEPER_DB_URL", raising=False)
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    assert default_url() == f"sqlite:///{tmp_path / 'home' / 'catalog.db'}"
    monkeypatch.delenv("STATEKEEPER_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_url() == f"sqlite:///{tmp_path / '.statekeeper' / 'catalog.db'}"
    monkeypatch.setenv("STATEKEEPER_DB_URL", "postgresql://u@h/db")
    assert normalize_url(None).drivername == "postgresql+psycopg"
    with pytest.raises(CatalogConfigError, match="unsupported catalog database"):
        normalize_url("mysql://u@h/db")
    with pytest.raises(CatalogConfigError, match="invalid catalog database URL"):
        normalize_url("::nonsense::")
    # The embedded default works out of the box: the directory is created on first use.
    monkeypatch.setenv("STATEKEEPER_DB_URL", f"sqlite:///{tmp_path / 'new' / 'dir' / 'catalog.db'}")
    assert upgrade() == head_revision()
    with Catalog.open() as cat:
        assert cat.roots() == []


def test_sql_imports_nothing_of_the_other_packages() -> None:
    code = (
        "import sys, statekeeper.sql, statekeeper.sql.catalog, statekeeper.sql.leases, statekeeper.sql.db, "
        "statekeeper.sql.models; print(sorted(m for m in sys.modules if m.split('.')[:2] in "
        "(['statekeeper', 'store'], ['statekeeper', 'maintenance'], ['statekeeper', 'orchestration'])))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_unreachable_database_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(
        CatalogError, match=f"cannot use the catalog database postgresql\\+psycopg://u:\\*\\*\\*@127.0.0.1:{port}/db"
    ):
        Catalog.open(f"postgresql://u:secret@127.0.0.1:{port}/db", connect_args={"connect_timeout": 5})
