"""Orphan cleanup: delete files no committed version will ever read, once they cannot be in flight.

Orphans (rules in `statekeeper.maintenance.plan`): changelogs and manifests of attempts that lost an already
committed version, files left below the oldest commit record that no retained version needs, SST
files no surviving manifest references, temp files of unfinished local writes and incomplete S3
multipart uploads. Each is deleted only when older than `orphan_grace_seconds` (a slow task, a
zombie attempt or a snapshot upload may still be writing it); anything of a version newer than the
newest commit record is never touched. Foreign files are reported, never deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextlib import nullcontext
from typing import TYPE_CHECKING

from statekeeper.maintenance.deletion import DeleteOutcome, Deleter, each_store, plan_deletions, run_deleter
from statekeeper.maintenance.file_kinds import FileEntry
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.leasing import planned_store, root_files_lease, scan_under_leases
from statekeeper.maintenance.reports import OrphanReport, recorded
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)


def clean_orphans(
    fm: CheckpointFileManager,
    settings: MaintenanceSettings,
    *,
    catalog: Catalog | None = None,
    orchestrator_run_id: str | None = None,
    dry_run: bool = False,
    progress: bool = False,
    stores: Iterable[StoreId] | None = None,
    inventory: Inventory | None = None,
) -> OrphanReport:
    """Delete orphans older than the grace period; `dry_run` reports the files and bytes instead.

    With `catalog`: the run is recorded, stores are leased in the catalog and deleted files are
    marked deleted. A store with problems is left untouched and named in the errors.
    `inventory`: a listing of the root the caller took (the maintenance loop shares one per cycle);
    each store is listed again under its lease before anything is changed.
    """
    wanted = None if stores is None else list(stores)
    report = OrphanReport(root=fm.root_uri, dry_run=dry_run)
    with recorded(catalog, report, orchestrator_run_id=orchestrator_run_id):
        inv = inventory or scan_under_leases(fm, settings, catalog, progress=progress, stores=wanted)
        root, plans = plan_deletions(inv, settings, wanted, report)
        report.foreign_files = len(root.foreign) + sum(len(inv.files_of(p.store).foreign) for p in plans)
        report.kept_in_flight = len(root.in_flight) + sum(len(p.in_flight) for p in plans)
        for e, why in [*root.in_flight, *(x for p in plans for x in p.in_flight)]:
            report.items.append(_row(e, "kept", why))
        todo = [p for p in plans if p.orphans and not p.blocked]
        if dry_run:
            for p in todo:
                _account(report, [e for e, _ in p.orphans], dict(p.orphans), "would delete")
            if wanted is None:
                _account(report, [e for e, _ in root.orphans], dict(root.orphans), "would delete")
            return report
        with run_deleter(fm, catalog, settings, mark_expired=False, name="orphan-delete", inventory=inv) as deleter:
            done = each_store(
                todo,
                lambda s: _clean_store(deleter, inv, s, catalog),
                report,
                parallelism=settings.parallelism,
                progress=progress,
                desc="clean-orphans",
            )
            for p, (out, reasons) in done:
                _account(report, out.deleted, reasons, "deleted")
                for text in out.errors:
                    report.error(f"store {p.store}: {text}")
            with root_files_lease(fm, settings, catalog) if root.orphans and wanted is None else nullcontext() as lease:
                if lease is not None:  # None: another maintainer holds the root's files and deletes them
                    out = deleter.delete_fenced([e for e, _ in root.orphans], lease.check)
                    _account(report, out.deleted, dict(root.orphans), "deleted")
                    for text in out.errors:
                        report.error(text)
    return report


def _clean_store(
    deleter: Deleter, inv: Inventory, store: StoreId, catalog: Catalog | None
) -> tuple[DeleteOutcome, dict[FileEntry, str]]:
    with planned_store(inv, store, deleter.settings, catalog) as (plan, lease):
        entries = [e for e, _ in plan.orphans]
        out = deleter.delete_fenced(entries, lease.check, in_order=True)
        return out, dict(plan.orphans)


def _row(e: FileEntry, action: str, reason: str) -> dict[str, object]:
    return {
        "store": str(e.store) if e.store else None,
        "path": e.path,
        "kind": e.kind,
        "version": e.version,
        "bytes": e.size,
        "age_seconds": round(time.time() - e.mtime, 1),
        "action": action,
        "reason": reason,
    }


def _account(report: OrphanReport, entries: Iterable[FileEntry], reasons: dict[FileEntry, str], action: str) -> None:
    for e in entries:
        report.count(e, _row(e, action, reasons.get(e, "")))


__all__ = ["clean_orphans"]
