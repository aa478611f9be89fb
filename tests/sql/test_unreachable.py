"""A catalog database server that is down or goes away: a `CatalogUnavailableError` naming it, after waiting
out a restart. (The restart and stop of a real PostgreSQL in the middle of maintenance runs is in
tests/reliability/test_catalog_faults.py.)"""

from __future__ import annotations

import socket

import pytest
from sqlalchemy import select, text

from statekeeper.sql import Catalog, CatalogUnavailableError, make_engine
from statekeeper.sql import base as sql_base
from statekeeper.sql.models import CheckpointRoot


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_that_stays_down_is_named_after_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql_base, "CONNECT_RETRY_DELAYS", (0.01, 0.01))
    port = _closed_port()
    catalog = Catalog(make_engine(f"postgresql+psycopg://sk:secret@127.0.0.1:{port}/catalog"), check_schema=False)
    attempts: list[int] = []
    real_connect = catalog.engine.connect

    def counted_connect():
        attempts.append(1)
        return real_connect()

    monkeypatch.setattr(catalog.engine, "connect", counted_connect)
    unreachable = rf"127\.0\.0\.1:{port}/catalog is unreachable"
    with pytest.raises(CatalogUnavailableError, match=unreachable) as info, catalog.write() as conn:
        conn.execute(text("select 1"))
    assert len(attempts) == 3
    assert "secret" not in str(info.value) and "re-run" in str(info.value)


def test_a_restarting_server_is_waited_for(postgres_server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempts are refused (the server is restarting); a later one connects and the work is done."""
    url = postgres_server.new_database()
    catalog = Catalog.open(url, upgrade=True)
    try:
        real_connect = catalog.engine.connect
        refused = [2]

        def flaky_connect():
            if refused[0]:
                refused[0] -= 1
                return make_engine(f"postgresql+psycopg://sk@127.0.0.1:{_closed_port()}/x").connect()
            return real_connect()

        monkeypatch.setattr(catalog.engine, "connect", flaky_connect)
        monkeypatch.setattr(sql_base, "CONNECT_RETRY_DELAYS", (0.01, 0.01, 0.01))
        root = catalog.ensure_root("file:///tmp/unreachable-test")
        assert refused[0] == 0
        with catalog.read() as conn:
            found = select(CheckpointRoot.id).where(CheckpointRoot.uri == "file:///tmp/unreachable-test")
            assert conn.execute(found).scalar() == root
    finally:
        catalog.close()


def test_sqlite_errors_stay_its_own(tmp_path) -> None:
    """SQLite has no server: a locked or broken file is not 'unreachable' (and is not retried here)."""
    catalog = Catalog.open(f"sqlite:///{tmp_path / 'c.db'}", upgrade=True)
    try:
        with pytest.raises(Exception) as info, catalog.write() as conn:
            conn.execute(text("select * from no_such_table"))
        assert not isinstance(info.value, CatalogUnavailableError)
    finally:
        catalog.close()
