"""The ground floor of the catalog: connections to its database and the registry of checkpoint roots.

Everything else in `statekeeper.sql` that reads or writes catalog rows builds on `CatalogBase`: the catalog's
facets (`statekeeper.sql.ingest`, `statekeeper.sql.file_states`, `statekeeper.sql.lineage`,
`statekeeper.sql.retention`, `statekeeper.sql.runs`) and the maintenance leases
(`statekeeper.sql.leases`). It sits below all of them so that none needs the assembled
`statekeeper.sql.catalog.Catalog`, which keeps the package free of import circles (`tests/test_architecture.py`).
Also here: the small bulk-write helpers they share.

Roots are identified by the URI string callers pass; use the file manager's normalised ``root_uri``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Self, cast

from sqlalchemy import Connection, Engine, Table, delete, select, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError

from statekeeper.sql.db import check_current, make_engine, read_only
from statekeeper.sql.db import upgrade as upgrade_db
from statekeeper.sql.errors import CatalogConfigError, CatalogError, CatalogUnavailableError, NotInCatalogError
from statekeeper.sql.models import (
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

CHUNK = 500
"""Rows per statement in bulk writes (keeps SQLite under its bound-parameter limit)."""


def table_of(model: type[Any]) -> Table:
    """The Core table of a mapped model."""
    return cast(Table, model.__table__)


def chunks(items: Sequence[Any], n: int = CHUNK) -> Iterator[Sequence[Any]]:
    """`items` in slices of at most `n` (one statement each)."""
    for i in range(0, len(items), n):
        yield items[i : i + n]


def from_timestamp(ts: float) -> dt.datetime:
    """A POSIX timestamp as an aware UTC datetime."""
    return dt.datetime.fromtimestamp(ts, dt.UTC)


log = logging.getLogger(__name__)

CONNECT_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)
"""Seconds to wait between attempts to reach the catalog's database server (a restart takes a moment)."""


class CatalogBase:
    """Connections to one catalog database and its checkpoint roots (thread-safe: every call uses its
    own connection). `statekeeper.sql.catalog.Catalog` adds the facets callers use."""

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
    def open(cls, url: str | URL | None = None, *, upgrade: bool = False, **engine_kwargs: Any) -> Self:
        """Connect to `url` (default: `statekeeper.sql.db.default_url()`); `upgrade` migrates it to this release."""
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction (SQLite: BEGIN IMMEDIATE)."""
        with self._connection(self.engine) as conn, conn.begin():
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._connection(self._ro) as conn:
            yield conn

    @contextmanager
    def _connection(self, engine: Engine) -> Iterator[Connection]:
        """A connection, waiting out a database server that is restarting (`CONNECT_RETRY_DELAYS`); a server
        that stays unreachable, or goes away mid-transaction, is a `CatalogUnavailableError` naming it."""
        conn = self._connect(engine)
        try:
            yield conn
        except DBAPIError as e:
            if self._unreachable(e):
                raise self._unavailable(e) from e
            raise
        finally:
            conn.close()

    def _connect(self, engine: Engine) -> Connection:
        for delay in (*CONNECT_RETRY_DELAYS, None):
            try:
                return engine.connect()
            except DBAPIError as e:
                if not self._unreachable(e):
                    raise
                if delay is None:
                    raise self._unavailable(e) from e
                log.warning("catalog database unreachable, retrying in %.1fs: %s", delay, e.orig or e)
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _unreachable(self, e: DBAPIError) -> bool:
        """A lost or refused server connection (SQLite has no server: its errors are its own)."""
        return e.connection_invalidated or (isinstance(e, OperationalError) and self.dialect != "sqlite")

    def _unavailable(self, e: DBAPIError) -> CatalogUnavailableError:
        where = self.engine.url.render_as_string(hide_password=True)
        return CatalogUnavailableError(
            f"the catalog database {where} is unreachable ({str(e.orig or e).strip().splitlines()[0]}); the "
            "transaction in progress was not committed: re-run once the database is back (`statekeeper catalog "
            "rebuild` restores the catalog from the checkpoint if it was lost)"
        )

    def insert(self, model: type[Any]) -> Any:
        """A dialect INSERT supporting on_conflict_do_nothing / on_conflict_do_update."""
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table_of(model))
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table_of(model))

    # -- roots ------------------------------------------------------------------------------
    def ensure_root(self, uri: str) -> int:
        """The id of root `uri`, created if new (safe when several processes race to create it)."""
        if not isinstance(uri, str) or not uri.strip():
            raise CatalogConfigError("checkpoint root URI is empty")
        found = self.find_root(uri)
        if found is not None:
            return found
        with self.write() as conn:
            return self.ensure_root_in(conn, uri)

    def ensure_root_in(self, conn: Connection, uri: str) -> int:
        """Like `ensure_root`, in the caller's write transaction `conn` (see `root_in`)."""
        if not isinstance(uri, str) or not uri.strip():
            raise CatalogConfigError("checkpoint root URI is empty")
        found = conn.execute(select(CheckpointRoot.id).where(CheckpointRoot.uri == uri)).scalar_one_or_none()
        if found is not None:
            return int(found)
        conn.execute(
            self.insert(CheckpointRoot)
            .values(uri=uri, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=["uri"])
        )
        return int(conn.execute(select(CheckpointRoot.id).where(CheckpointRoot.uri == uri)).scalar_one())

    def root_in(self, conn: Connection, uri: str) -> int:
        """The id of root `uri`, looked up in the caller's transaction `conn`; `NotInCatalogError` if unknown.

        Hot write paths use this instead of `root_id` (a lookup on a connection of its own): the id is
        then read in the same transaction that writes with it, so it is right even if another process
        forgot the root and re-added it (SQLite may reuse the id of a deleted row for another URI).
        """
        rid = conn.execute(select(CheckpointRoot.id).where(CheckpointRoot.uri == uri)).scalar_one_or_none()
        if rid is None:
            raise NotInCatalogError(f"checkpoint root {uri} is not in the catalog: run `statekeeper catalog sync`")
        return int(rid)

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

    def store_id(self, conn: Connection, rid: int, operator: str, partition: int) -> int:
        """The id of store (operator, partition) of root `rid`; `NotInCatalogError` naming it if unknown."""
        sid = conn.execute(
            select(Store.id).where(Store.root_id == rid, Store.operator == operator, Store.partition == partition)
        ).scalar_one_or_none()
        if sid is None:
            raise NotInCatalogError(f"store {operator}/{partition} of {self.uri_of(conn, rid)} is not in the catalog")
        return int(sid)

    @staticmethod
    def uri_of(conn: Connection, rid: int) -> str:
        """The URI of root `rid` (for messages)."""
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
            delete_derived(conn, rid)
            conn.execute(
                update(CheckpointRoot).where(CheckpointRoot.id == rid).values(last_sync_at=None, last_full_sync_at=None)
            )

    def forget_root(self, uri: str) -> None:
        """Remove root `uri` and everything about it, run history and leases included."""
        rid = self.find_root(uri)
        if rid is None:
            return
        with self.write() as conn:
            delete_derived(conn, rid)
            for by_root in (table_of(MaintenanceRun), table_of(MaintenanceLease)):
                conn.execute(delete(by_root).where(by_root.c.root_id == rid))
            conn.execute(delete(CheckpointRoot).where(CheckpointRoot.id == rid))


def delete_derived(conn: Connection, rid: int) -> None:
    """Delete every row derived from root `rid`'s checkpoint location (not the root, runs or leases)."""
    # Explicit deletes, children first (no reliance on ON DELETE CASCADE).
    store_ids = select(Store.id).where(Store.root_id == rid).scalar_subquery()
    snap_ids = select(Snapshot.id).where(Snapshot.store_id.in_(store_ids)).scalar_subquery()
    conn.execute(delete(SnapshotSst).where(SnapshotSst.snapshot_id.in_(snap_ids)))
    for by_store in (table_of(Snapshot), table_of(Attempt), table_of(Version)):
        conn.execute(delete(by_store).where(by_store.c.store_id.in_(store_ids)))
    conn.execute(delete(File).where(File.root_id == rid))
    conn.execute(delete(Store).where(Store.root_id == rid))
    for by_root in (table_of(Commit), table_of(SyncCursor)):
        conn.execute(delete(by_root).where(by_root.c.root_id == rid))
