"""Connecting to the catalog database and migrating it (Alembic).

The URL comes from the caller, else from ``STATEKEEPER_DB_URL``, else it is the embedded default:
a SQLite file ``catalog.db`` in ``$STATEKEEPER_HOME`` (default ``~/.statekeeper``; ``./.statekeeper``
when there is no home directory). PostgreSQL URLs use psycopg 3: ``postgresql+psycopg://user@host/db``
(a plain ``postgresql://`` URL is taken to mean the same).

SQLite is opened in WAL mode with foreign keys on, and every write transaction starts with
``BEGIN IMMEDIATE``, so concurrent writers (lease acquisition, syncs) queue on the busy timeout
instead of failing on a lock upgrade. Read-only work uses ``read_only(engine)`` (plain ``BEGIN``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError

from statekeeper.sql.errors import CatalogConfigError, CatalogError

ENV_URL = "STATEKEEPER_DB_URL"
ENV_HOME = "STATEKEEPER_HOME"
SQLITE_BUSY_TIMEOUT_S = 60.0
_MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_READ_ONLY = "statekeeper_read_only"


def default_home() -> Path:
    home = os.environ.get(ENV_HOME)
    if home:
        return Path(home).expanduser()
    try:
        return Path.home() / ".statekeeper"
    except RuntimeError:  # no home directory (some service accounts)
        return Path.cwd() / ".statekeeper"


def default_url() -> str:
    """``$STATEKEEPER_DB_URL``, else ``sqlite:///<STATEKEEPER_HOME or ~/.statekeeper>/catalog.db``."""
    url = os.environ.get(ENV_URL)
    if url:
        return url
    return f"sqlite:///{default_home() / 'catalog.db'}"


def normalize_url(url: str | URL | None) -> URL:
    """Parse `url` (default: `default_url()`), mapping plain postgresql:// to the psycopg 3 driver."""
    raw = default_url() if url is None else url
    try:
        parsed = make_url(raw)
    except ArgumentError:
        raise CatalogConfigError(f"invalid catalog database URL {str(raw)!r}") from None
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend != "sqlite":
        raise CatalogConfigError(
            f"unsupported catalog database {parsed.render_as_string(hide_password=True)!r}: "
            "use sqlite:///path or postgresql+psycopg://user@host/db"
        )
    return parsed


def _setup_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (pysqlite's own handling is broken)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cur.execute("PRAGMA foreign_keys = ON")
        if engine.url.database not in (None, "", ":memory:"):
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READ_ONLY) else "BEGIN IMMEDIATE")


def make_engine(url: str | URL | None = None, **kwargs: Any) -> Engine:
    """An engine for the catalog at `url` (default: `default_url()`); creates a SQLite file's directory."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("connect_args", {}).setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
        engine = create_engine(parsed, **kwargs)
        _setup_sqlite(engine)
        return engine
    if parsed.get_backend_name() == "postgresql" and importlib.util.find_spec("psycopg") is None:
        raise CatalogConfigError(
            f"the catalog URL {parsed.render_as_string(hide_password=True)!r} needs the PostgreSQL driver psycopg, "
            "which is not installed: pip install 'statekeeper[postgres]'"
        )
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, **kwargs)


def read_only(engine: Engine) -> Engine:
    """The same engine, starting transactions without taking SQLite's write lock."""
    return engine.execution_options(**{_READ_ONLY: True})


def _alembic_config(connection: Connection | None = None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _as_engine(url_or_engine: str | URL | Engine | None) -> tuple[Engine, bool]:
    if isinstance(url_or_engine, Engine):
        return url_or_engine, False
    return make_engine(url_or_engine), True


def upgrade(url: str | URL | Engine | None = None, revision: str = "head") -> str | None:
    """Migrate the catalog at `url` to `revision` (default: the newest); returns the revision it is at."""
    from alembic import command

    return _migrate(url, command.upgrade, revision)


def downgrade(url: str | URL | Engine | None, revision: str) -> str | None:
    """Migrate the catalog at `url` down to `revision` ("base": drop every table); returns where it is."""
    from alembic import command

    return _migrate(url, command.downgrade, revision)


def _migrate(url: str | URL | Engine | None, step: Callable[[Any, str], None], revision: str) -> str | None:
    engine, owned = _as_engine(url)
    try:
        with engine.begin() as conn:
            step(_alembic_config(conn), revision)
        return current_revision(engine)
    finally:
        if owned:
            engine.dispose()


def current_revision(url: str | URL | Engine | None = None) -> str | None:
    """The revision the catalog at `url` is at; None for an empty (never migrated) database."""
    from alembic.runtime.migration import MigrationContext

    engine, owned = _as_engine(url)
    try:
        with read_only(engine).connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        if owned:
            engine.dispose()


@functools.cache  # alembic parses every migration script to find it: once a process
def head_revision() -> str:
    """The newest revision this release ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


def check_current(engine: Engine) -> None:
    """Raise `CatalogError` naming the fix when the database is not at this release's schema."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return
    where = engine.url.render_as_string(hide_password=True)
    if current is None:
        if inspect(engine).get_table_names():
            raise CatalogError(f"catalog database {where} has tables but no schema revision; is it a statekeeper DB?")
        raise CatalogError(f"catalog database {where} is empty: run `statekeeper db upgrade`")
    raise CatalogError(
        f"catalog database {where} is at schema revision {current}, this release needs {head}: "
        "run `statekeeper db upgrade`"
    )


__all__ = [
    "ENV_HOME",
    "ENV_URL",
    "check_current",
    "current_revision",
    "default_home",
    "default_url",
    "downgrade",
    "head_revision",
    "make_engine",
    "normalize_url",
    "read_only",
    "upgrade",
]
