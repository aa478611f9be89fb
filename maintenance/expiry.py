"""Expiry: keep the newest `min_versions_to_retain` committed versions of each store loadable, delete
the committed files none of them needs (rules in `statekeeper.maintenance.plan`).

A snapshot becomes the base only once proven to open to what it recorded (DESIGN invariant 14): expiry
opens each store's next base first (`prove_bases`), and one that fails keeps the older base and its files.

Per store, under its lease, after listing the store again: manifests first, then the SSTs only they
referenced (so no surviving manifest ever names a deleted SST), then changelogs. Commit records go
last, only those below every store's base, and only in a run over every store of the root. A crash
at any point leaves every retained version loadable; a rerun finishes the job (files left without a
commit record below the base are deleted as orphans). Changelogs of versions newer than the newest
commit record are never touched: they may belong to a batch still in flight.

With a catalog, expiry also drops the catalog's history older than `catalog_history_seconds`
(`prune_catalog_history`): the rows of deleted files and snapshots, of expired versions, and old runs.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import TYPE_CHECKING

from statekeeper.maintenance.deletion import DeleteOutcome, Deleter, each_store, plan_deletions, run_deleter
from statekeeper.maintenance.file_kinds import FileEntry
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.leasing import planned_store, root_files_lease, scan_under_leases
from statekeeper.maintenance.plan import StorePlan, plan_store
from statekeeper.maintenance.reports import ExpiryReport, recorded
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_checks import base_problem, proof_problem
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import StoreId

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)

PRUNE_EVERY_SECONDS = 300.0
_PRUNED_AT: dict[tuple[str, str], float] = {}
"""When this process last pruned a catalog's history of a root (monotonic seconds)."""


def expire_versions(
    fm: CheckpointFileManager,
    settings: MaintenanceSettings,
    *,
    catalog: Catalog | None = None,
    orchestrator_run_id: str | None = None,
    dry_run: bool = False,
    progress: bool = False,
    stores: Iterable[StoreId] | None = None,
    inventory: Inventory | None = None,
) -> ExpiryReport:
    """Delete what no retained version needs; `dry_run` reports the files and bytes instead.

    With `catalog`: the run is recorded, stores are leased in the catalog, files are marked expired
    before and deleted after. A store with problems (unreadable or foreign files, a broken snapshot,
    a gap in its chain) is left untouched and named in the errors.
    `inventory`: a listing of the root the caller took (the maintenance loop shares one per cycle);
    each store is listed again under its lease before anything is changed.
    """
    wanted = None if stores is None else list(stores)
    report = ExpiryReport(root=fm.root_uri, dry_run=dry_run)
    with recorded(catalog, report, orchestrator_run_id=orchestrator_run_id):
        inv = inventory or scan_under_leases(fm, settings, catalog, progress=progress, stores=wanted)
        prove_bases(fm, inv, wanted if wanted is not None else inv.store_ids(), settings)
        root, plans = plan_deletions(inv, settings, wanted, report)
        for p in plans:
            if p.latest is not None and p.retain_from is not None:
                report.retained_versions += p.latest - p.retain_from + 1
        todo = [p for p in plans if p.expired and not p.blocked]
        corrupt = _corrupt_bases(fm, inv, todo, settings.work_dir)
        for p in todo:
            if p.store in corrupt:
                report.blocked([f"store {p.store}: {corrupt[p.store]}"])
        todo = [p for p in todo if p.store not in corrupt]
        if corrupt:  # the floor counted those bases: keep the commit records below them too
            root.expired_commits = []
        root_expired = [*root.expired_batches, *root.expired_commits]  # commit records last
        if dry_run:
            for p in todo:
                _account(report, str(p.store), p.expired, "would delete")
            _account(report, None, root_expired, "would delete")
            return report
        with run_deleter(fm, catalog, settings, mark_expired=True, name="expire-delete", inventory=inv) as deleter:
            # Stores listed under leases held since (a loop's cycle, a Dagster run) are not listed again, so their
            # plans stand: their files are marked expired in one catalog statement, not one per store.
            deleter.expiring([e for p in todo if inv.is_current(p.store) for e in p.expired])
            done = each_store(
                todo,
                lambda s: _expire_store(deleter, inv, s, catalog),
                report,
                parallelism=settings.parallelism,
                progress=progress,
                desc="expire",
            )
            for p, res in done:
                _account(report, str(p.store), res.deleted, "deleted")
                for text in res.errors:
                    report.error(f"store {p.store}: {text}")
            with root_files_lease(fm, settings, catalog) if root_expired else nullcontext() as lease:
                if lease is not None:  # None: another maintainer holds the root's files and deletes them
                    out = deleter.delete_fenced(root.expired_batches, lease.check)
                    if not out.errors:  # a commit record outlives the batch file of its version
                        out.merge(deleter.delete_fenced(root.expired_commits, lease.check))
                    _account(report, None, out.deleted, "deleted")
                    for text in out.errors:
                        report.error(text)
        if catalog is not None:
            report.catalog_rows_pruned = prune_catalog_history(catalog, fm.root_uri, settings)
    return report


def prune_catalog_history(catalog: Catalog, root: str, settings: MaintenanceSettings) -> int:
    """Drop the catalog's rows of what left `root` more than `catalog_history_seconds` ago
    (`Catalog.prune_history`); at most once per `PRUNE_EVERY_SECONDS` (or a quarter of the horizon) per
    root and process, since the loop expires every cycle. Returns the rows dropped."""
    every = min(PRUNE_EVERY_SECONDS, settings.catalog_history_seconds / 4)
    key = (str(catalog.engine.url), root)  # the URL as rendered, password hidden
    now = time.monotonic()
    if now - _PRUNED_AT.get(key, -math.inf) < every:
        return 0
    _PRUNED_AT[key] = now
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=settings.catalog_history_seconds)
    pruned = catalog.prune_history(root, before)
    if pruned.total:
        log.info("catalog history of %s before %s: dropped %s", root, before.isoformat(), pruned)
    return pruned.total


def _expire_store(deleter: Deleter, inv: Inventory, store: StoreId, catalog: Catalog | None) -> DeleteOutcome:
    fm, settings = deleter.fm, deleter.settings
    with planned_store(inv, store, settings, catalog) as (plan, lease):
        # Snapshot repair (invariant 10): never delete the changelogs below a base that cannot be restored.
        manifests = inv.files_of(store).manifest_data
        corrupt = base_problem(fm, plan, manifests, work_dir=settings.work_dir) if plan.expired else None
        if corrupt is not None:
            return DeleteOutcome(errors=[corrupt], stopped=True)
        return deleter.delete_fenced(plan.expired, lease.check, in_order=True)


def prove_bases(
    fm: CheckpointFileManager, inv: Inventory, stores: Iterable[StoreId], settings: MaintenanceSettings
) -> None:
    """Open and check each store's next base snapshot that is not proven yet (DESIGN invariant 14), so the
    plan may move the base onto it; one that fails is a bad snapshot from then on (the plan keeps the older
    base, `statekeeper snapshot` replaces it). In parallel over stores; nothing is deleted here."""
    todo = []
    for s in stores:
        plan = plan_store(inv, s, settings)
        if plan.unproven_base is not None and not plan.blocked:
            todo.append((s, inv.files_of(s).manifest_data.get(plan.unproven_base)))
    todo = [(s, m) for s, m in todo if m is not None]
    if not todo:
        return

    def prove(item: tuple[StoreId, SnapshotManifest]) -> None:
        why = proof_problem(fm, item[0], item[1], work_dir=settings.work_dir)
        if why is not None:
            log.warning("store %s: %s; expiry keeps the older base", item[0], why)

    with ThreadPoolExecutor(max_workers=max(1, min(settings.parallelism, len(todo)))) as pool:
        list(pool.map(prove, todo))


def _corrupt_bases(
    fm: CheckpointFileManager, inv: Inventory, plans: list[StorePlan], work_dir: str | None
) -> dict[StoreId, str]:
    """Stores whose expiry base is a corrupt snapshot (snapshot repair needs the changelogs below it)."""
    out: dict[StoreId, str] = {}
    for p in plans:
        why = base_problem(fm, p, inv.files_of(p.store).manifest_data, work_dir=work_dir)
        if why is not None:
            out[p.store] = why
    return out


def _account(report: ExpiryReport, store: str | None, entries: Iterable[FileEntry], action: str) -> None:
    for e in entries:
        row = {"store": store, "path": e.path, "kind": e.kind, "version": e.version, "bytes": e.size, "action": action}
        report.count(e, row)


__all__ = ["PRUNE_EVERY_SECONDS", "expire_versions", "prove_bases", "prune_catalog_history"]
