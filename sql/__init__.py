"""The metadata database: lineage catalog models, queries, leases and migrations.

    from sql import Catalog, upgrade
    upgrade()                              # migrate the default catalog (STATEKEEPER_DB_URL / SQLite)
    catalog = Catalog.open()               # or Catalog.open("postgresql+psycopg://user@host/db")
    catalog.chain_lengths("file:///ckpt")

`sql` imports nothing of `store`, `maintenance` or `orchestration`; filling the catalog from a
checkpoint location is `maintenance.catalog_sync`.
"""

from sql.catalog import Catalog
from sql.db import current_revision, default_url, head_revision, make_engine, upgrade
from sql.errors import (
    CatalogConfigError,
    CatalogError,
    LeaseError,
    LeaseLostError,
    LeaseUnavailableError,
    NotInCatalogError,
)
from sql.ingest import CommitObservation, FileObservation, SnapshotObservation, SyncStats, SyncWriter
from sql.leases import Lease, LeaseInfo
from sql.lineage import FileRecord, StoreChain, StoreInfo, VersionFiles
from sql.retention import RetentionPlan, StoreRetention
from sql.runs import RunInfo, RunRecorder

__all__ = [
    "Catalog",
    "CatalogConfigError",
    "CatalogError",
    "CommitObservation",
    "FileObservation",
    "FileRecord",
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
    "make_engine",
    "upgrade",
]
