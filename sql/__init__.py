"""The metadata database: lineage catalog models, queries, leases and migrations.

    from statekeeper.sql import Catalog, upgrade
    upgrade()                              # migrate the default catalog (STATEKEEPER_DB_URL / SQLite)
    catalog = Catalog.open()               # or Catalog.open("postgresql+psycopg://user@host/db")
    catalog.chain_lengths("file:///ckpt")

`statekeeper.sql` imports nothing of `statekeeper.store`, `statekeeper.maintenance` or
`statekeeper.orchestration`; filling the catalog from a checkpoint location is `statekeeper.maintenance.catalog_sync`.
"""

if __name__ != "statekeeper.sql":  # one path per module: a bare `sql` would be a second copy
    raise ImportError(f"import statekeeper.sql, not {__name__}: the folders import only as statekeeper.*")

# ruff: noqa: E402 - the check that names a missing extra runs before the imports that need it
import importlib.util

_MISSING = [m for m in ("sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
if _MISSING:  # sql imports nothing of store, so it cannot use store.extras.require
    raise ImportError(
        f"statekeeper's catalog (package sql) needs {_MISSING}, which are not installed: "
        "pip install 'statekeeper[maintenance]'"
    )

from statekeeper.sql.catalog import Catalog
from statekeeper.sql.db import current_revision, default_url, head_revision, make_engine, upgrade
from statekeeper.sql.errors import (
    CatalogConfigError,
    CatalogError,
    CatalogUnavailableError,
    LeaseError,
    LeaseLostError,
    LeaseUnavailableError,
    NotInCatalogError,
)
from statekeeper.sql.history import HistoryPruned
from statekeeper.sql.ingest import (
    CommitObservation,
    FileObservation,
    SnapshotObservation,
    SyncStats,
    SyncWriter,
)
from statekeeper.sql.layouts import LayoutRow, LayoutSpan, layout_rows, layout_spans
from statekeeper.sql.leases import Lease, LeaseInfo
from statekeeper.sql.lineage import FileRecord, StoreChain, StoreInfo, VersionFiles
from statekeeper.sql.retention import RetentionPlan, StoreRetention
from statekeeper.sql.runs import RunInfo, RunRecorder

__all__ = [
    "Catalog",
    "CatalogConfigError",
    "CatalogError",
    "CatalogUnavailableError",
    "CommitObservation",
    "FileObservation",
    "FileRecord",
    "HistoryPruned",
    "LayoutRow",
    "LayoutSpan",
    "Lease",
    "LeaseError",
    "LeaseInfo",
    "LeaseLostError",
    "LeaseUnavailableError",
    "NotInCatalogError",
    "RetentionPlan",
    "RunInfo",
    "RunRecorder",
    "SnapshotObservation",
    "StoreChain",
    "StoreInfo",
    "StoreRetention",
    "SyncStats",
    "SyncWriter",
    "VersionFiles",
    "current_revision",
    "default_url",
    "head_revision",
    "layout_rows",
    "layout_spans",
    "make_engine",
    "upgrade",
]
