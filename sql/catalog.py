"""The lineage catalog: what is in each checkpoint root, derived from it, and the queries users need.

`Catalog` is the one class callers use (`Catalog.open()`, then its methods). It wraps an engine on a
migrated database and knows nothing of the checkpoint file layout. It is assembled here from one
module per responsibility, each building on `sql.base.CatalogBase` (connections and the root registry):

- `sql.base`: connections and roots (`open`, `close`, `read`, `write`, `ensure_root`, `find_root`,
  `root_id`, `roots`, `last_sync`, `reset_root`, `forget_root`)
- `sql.ingest`: `sync_writer`, fed by `maintenance.catalog_sync`
- `sql.file_states`: `mark_expired`, `mark_deleted`, reported by maintenance
- `sql.lineage`: `stores`, `files`, `summary`, `committed_versions`, `losing_attempts`,
  `files_for_version`, `chain_lengths`
- `sql.retention`: `retention_plan`
- `sql.runs`: maintenance run records (`start_run`, `finish_run`, `record_run`, `runs`)
- `sql.leases`: `acquire_lease`, `leases`
- `sql.export`: `export`

File states: ``live`` (part of a committed version, a pending attempt, or a foreign file),
``orphan`` (a losing attempt's changelog or manifest, an SST no present manifest references, a temp
file of an unfinished write; orphan cleanup applies its own grace period), ``expired`` (set by the
expiry operation for files it is about to delete), ``deleted`` (gone; kept as history).
Roots are identified by the URI string callers pass; use the file manager's normalised ``root_uri``.
"""

from __future__ import annotations

from sql.export import CatalogExport
from sql.file_states import FileStateUpdates
from sql.ingest import CatalogIngest
from sql.leases import LeaseAccess
from sql.lineage import LineageQueries
from sql.retention import RetentionPlanning
from sql.runs import RunRecords


class Catalog(
    CatalogIngest, FileStateUpdates, LineageQueries, RetentionPlanning, RunRecords, LeaseAccess, CatalogExport
):
    """The lineage catalog on one database (thread-safe: every call uses its own connection)."""


__all__ = ["Catalog"]
