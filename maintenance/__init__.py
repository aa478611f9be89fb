"""Maintenance operations, usable without Dagster, and the `statekeeper` command line.

- `statekeeper.maintenance.snapshot_builds.create_snapshots`: snapshot stores whose chain reached the threshold
- `statekeeper.maintenance.expiry.expire_versions`: keep the newest versions loadable, delete what none of them needs
- `statekeeper.maintenance.orphans.clean_orphans`: delete losing attempts, unreferenced SSTs and unfinished writes
- `statekeeper.maintenance.verify.verify_root`: check that every retained version is loadable
- `statekeeper.maintenance.catalog_sync`: fill the lineage catalog from the checkpoint location

All of them start from one listing (`statekeeper.maintenance.inventory`) and one set of rules
(`statekeeper.maintenance.plan`); docs/maintenance.md describes what is kept, what is deleted and when.
"""

if __name__ != "statekeeper.maintenance":  # one path per module: a bare `maintenance` would be a second copy
    raise ImportError(f"import statekeeper.maintenance, not {__name__}: the folders import only as statekeeper.*")

from statekeeper.store.extras import require

require(("sqlalchemy", "alembic", "tqdm"), "maintenance", "statekeeper maintenance (and its command line)")
