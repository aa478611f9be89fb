"""The lineage catalog: what is in each checkpoint root, derived from it, and the queries users need.

`Catalog` is the one class callers use (`Catalog.open()`, then its methods). It wraps an engine on a
migrated database and knows nothing of the checkpoint file layout. It is assembled here from one
module per responsibility, each building on `statekeeper.sql.base.CatalogBase` (connections and the root registry):

- `statekeeper.sql.base`: connections and roots (`open`, `close`, `read`, `write`, `ensure_root`, `find_root`,
  `root_id`, `roots`, `last_sync`, `reset_root`, `forget_root`)
- `statekeeper.sql.ingest`: `sync_writer`, fed by `statekeeper.maintenance.catalog_sync`
- `statekeeper.sql.file_states`: `mark_expired`, `mark_deleted`, reported by maintenance
- `statekeeper.sql.lineage`: `stores`, `files`, `summary`, `committed_versions`, `losing_attempts`,
  `files_for_version`, `chain_lengths`
- `statekeeper.sql.retention`: `retention_plan`
- `statekeeper.sql.runs`: maintenance run records (`start_run`, `finish_run`, `record_run`, `runs`)
- `statekeeper.sql.history`: `prune_history`, the horizon after which the rows of what is gone are dropped
- `statekeeper.sql.leases`: `acquire_lease`, `leases`

File states: ``live`` (part of a committed version, a pending attempt, or a foreign file),
``orphan`` (a losing attempt's changelog or manifest, an SST no present manifest references, a temp
file of an unfinished write; orphan cleanup applies its own grace period), ``expired`` (set by the
expiry operation for files it is about to delete), ``deleted`` (gone; kept as history until `prune_history` drops it).
Roots are identified by the URI string callers pass; use the file manager's normalised ``root_uri``.
"""

from __future__ import annotations

from statekeeper.sql.file_states import FileStateUpdates
from statekeeper.sql.history import HistoryPruning
from statekeeper.sql.ingest import CatalogIngest
from statekeeper.sql.layouts import LayoutQueries
from statekeeper.sql.leases import LeaseAccess
from statekeeper.sql.lineage import LineageQueries
from statekeeper.sql.retention import RetentionPlanning
from statekeeper.sql.runs import RunRecords


class Catalog(
    CatalogIngest,
    FileStateUpdates,
    LineageQueries,
    LayoutQueries,
    RetentionPlanning,
    RunRecords,
    HistoryPruning,
    LeaseAccess,
):
    """The lineage catalog on one database (thread-safe: every call uses its own connection)."""


__all__ = ["Catalog"]
