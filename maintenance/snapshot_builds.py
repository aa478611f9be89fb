"""Snapshot builds: which stores a run snapshots and the build of each, bounding the changelogs a load replays.

For each store whose chain of changelogs since its last snapshot is at or above
`snapshot_threshold`, rebuild its latest committed version in a local replica (`Replica`: only
changelogs newer than the copy are replayed), upload the SST files the checkpoint location does not
have yet (content-named, so shared SSTs are never uploaded twice) and write the manifest last.
Stores run in parallel on a bounded pool, the longest chains first; each under its maintenance lease.

Replicas: `statekeeper.maintenance.replica_pool`; with ``build_processes`` set, they live in worker
processes (`statekeeper.maintenance.build_processes`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from statekeeper.maintenance.build_processes import BuildRequest, build_processes
from statekeeper.maintenance.executors import InProcess, Row, StoreExecutor, StoreTask, catalog_url
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.leasing import LeaseGuard, scan_under_leases, store_lease
from statekeeper.maintenance.plan import StorePlan, plan_store
from statekeeper.maintenance.replica import BuildStats
from statekeeper.maintenance.replica_pool import check_work_dir, work_root
from statekeeper.maintenance.reports import SnapshotReport, recorded
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_checks import corrupt_ssts, mark_sound, newest_snapshot_problem
from statekeeper.maintenance.snapshot_policy import crossing_version
from statekeeper.store.errors import CheckpointFileExistsError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import StoreId
from statekeeper.store.snapshot import SnapshotResult

if TYPE_CHECKING:
    from statekeeper.sql.catalog import Catalog

log = logging.getLogger(__name__)


def create_snapshots(
    fm: CheckpointFileManager,
    settings: MaintenanceSettings,
    *,
    catalog: Catalog | None = None,
    orchestrator_run_id: str | None = None,
    dry_run: bool = False,
    progress: bool = False,
    stores: Iterable[StoreId] | None = None,
    due_at: Mapping[StoreId, int] | None = None,
    inventory: Inventory | None = None,
    executor: StoreExecutor | None = None,
) -> SnapshotReport:
    """Snapshot every store (or those in `stores`) whose chain reached `settings.snapshot_threshold`.

    With `catalog`: the run is recorded, each store is leased in the catalog, and the catalog is
    synced incrementally afterwards so it knows the new snapshots. `dry_run` only reports which
    stores would be snapshotted.
    `due_at`: store -> a version it was requested at (the checkpoint sensor requests a snapshot ahead of the
    threshold when the root's snapshots land late): such a store is due once it committed that version, if
    its newest snapshot is older, whatever its chain.
    `inventory`: a listing of the root the caller took (the maintenance loop shares one per cycle);
    each store is listed again under its lease before anything is changed. `executor`: where the
    stores' snapshots are built (default: a pool of `settings.parallelism` threads in this process;
    `statekeeper.maintenance.fanout` supplies Spark's executors). Once the builds ran
    `settings.snapshot_round_seconds`, a store still under the threshold (due early by `snapshot_spread`) is not
    started but left for the next run ("deferred"); a store at the threshold, requested, or needing a repair is
    always built.
    """
    check_work_dir(fm, settings)
    wanted = None if stores is None else list(stores)
    report = SnapshotReport(root=fm.root_uri, dry_run=dry_run)
    with recorded(catalog, report, orchestrator_run_id=orchestrator_run_id):
        inv = inventory or scan_under_leases(fm, settings, catalog, progress=progress, stores=wanted)
        ids = wanted if wanted is not None else inv.store_ids()
        plans = [plan_store(inv, s, settings) for s in ids]
        report.stores = len(plans)
        report.max_chain_length = max((p.chain_length for p in plans), default=0)
        requested = due_at or {}
        # longest chains first: a cycle's last builds land a round's length later, and the stores that can
        # afford the wait are those whose chains are shortest
        due_plans = sorted(
            (p for p in plans if _due(fm, inv, p, settings, requested.get(p.store))),
            key=lambda p: p.chain_length,
            reverse=True,
        )
        todo = [p.store for p in due_plans]
        report.candidates = len(todo)
        if dry_run:
            report.items.extend(
                {
                    "store": str(p.store),
                    "version": p.latest,
                    "snapshot_version": p.snapshot[0] if p.snapshot else None,
                    "chain_length": p.chain_length,
                    "action": "would snapshot",
                }
                for p in due_plans
            )
            return report
        due = {str(s): requested[s] for s in todo if s in requested}
        task = StoreTask("snapshot", fm.root_uri, settings, catalog_url(catalog), {"due_at": due})
        threshold = settings.snapshot_threshold
        early = {p.store: p for p in due_plans if p.chain_length < threshold and p.store not in requested}
        bound = settings.snapshot_round_seconds
        deadline = time.monotonic() + bound if bound else None

        def build_or_defer(store: StoreId) -> Row:
            """Past the deadline, a store due early by the spread alone waits for the next run."""
            plan = early.get(store)
            late = deadline is not None and time.monotonic() >= deadline
            if plan is not None and late and _repair_reason(fm, inv, plan, settings) is None:
                return {"store": str(store), "version": plan.latest, "action": "skipped", "reason": "deferred"}
            return snapshot_row(fm, inv, store, settings, catalog, requested.get(store))

        rows = (executor or _in_process(fm, settings, progress)).run_stores(task, todo, build_or_defer)
        for store in todo:
            _account(report, rows.get(store) or {"store": str(store), "action": "failed", "error": "no result"})
        if catalog is not None and report.snapshots:
            written = {s: row for s in todo if (row := rows.get(s) or {}).get("action") == "snapshot"}
            _sync(catalog, fm, inv, report, written)
    return report


def _in_process(fm: CheckpointFileManager, settings: MaintenanceSettings, progress: bool) -> InProcess:
    """This process's pool; with build processes, each gets its share of the threads (its lane), so that every
    one has its next build ready while it runs one."""
    if not settings.build_processes:
        return InProcess(settings.parallelism, progress)
    workers = build_processes(settings.build_processes)
    return InProcess(settings.parallelism, progress, lambda store: workers.worker_of(fm.root_uri, store))


def snapshot_row(
    fm: CheckpointFileManager,
    inv: Inventory,
    store: StoreId,
    settings: MaintenanceSettings,
    catalog: Catalog | None,
    requested_at: int | None = None,
) -> Row:
    """Snapshot one store under its lease: its report row (a failure is a row too, naming the store).
    `requested_at`: the version it was requested at (`create_snapshots`'s `due_at`).

    The per-store step of `create_snapshots`, wherever its executor runs it (`statekeeper.maintenance.executors`).
    """
    try:
        return _snapshot_store(fm, inv, store, settings, catalog, requested_at)
    except Exception as e:
        log.debug("snapshot of store %s failed", store, exc_info=True)
        return {"store": str(store), "action": "failed", "error": str(e)}


def _account(report: SnapshotReport, row: Row) -> None:
    report.items.append(row)
    if "error" in row:
        report.error(f"store {row['store']}: {row['error']}")
    if row.get("action") != "snapshot":
        return
    report.snapshots += 1
    report.files += row["ssts_uploaded"] + 1
    report.bytes += row["bytes_uploaded"]
    report.ssts_uploaded += row["ssts_uploaded"]
    report.ssts_reused += row["ssts_reused"]
    report.changelogs_replayed += row["changelogs_replayed"]
    report.records_replayed += row["records_replayed"]
    if row["build"] == "warm":
        report.warm_builds += 1
    else:
        report.cold_builds += 1


def _snapshot_store(
    fm: CheckpointFileManager,
    inv: Inventory,
    store: StoreId,
    settings: MaintenanceSettings,
    catalog: Catalog | None,
    requested_at: int | None,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    with store_lease(fm, store, settings, catalog) as lease:
        leased_at = time.time()
        row = _snapshot_leased(fm, inv, store, settings, lease, t0, requested_at)
        # when this maintainer held the store (invariant 5: the holds of two maintainers never overlap)
        return {**row, "leased_at": leased_at, "released_at": time.time()}


def _snapshot_leased(
    fm: CheckpointFileManager,
    inv: Inventory,
    store: StoreId,
    settings: MaintenanceSettings,
    lease: LeaseGuard,
    t0: float,
    requested_at: int | None,
) -> dict[str, Any]:
    """The snapshot of one store whose lease this maintainer holds (skipped when another did it meanwhile)."""
    inv.rescan_store(store)  # what the store holds now that no other maintainer changes it
    plan = plan_store(inv, store, settings)
    row: dict[str, Any] = {"store": str(store), "version": plan.latest, "chain_length": plan.chain_length}
    repair = _repair_reason(fm, inv, plan, settings)
    if plan.latest is None or plan.latest_id is None:
        return {**row, "action": "skipped", "reason": "nothing committed"}
    if not _chain_due(plan, settings, requested_at) and repair is None:
        return {**row, "action": "skipped", "reason": "already snapshotted"}
    current = inv.is_current(store)
    inv.changed(store)  # until the snapshot is written (`wrote_snapshot`); if this fails, listed again
    if repair is not None:
        log.warning("store %s: %s; writing a fresh snapshot from a cold build", store, repair)
        plan = plan_store(inv, store, settings)  # a snapshot found unopenable is no base for the build
    # a repair resets the replica: it may share the damaged files (hard links on local disk)
    request = build_request(fm, inv, plan, settings, reset=repair is not None)
    try:
        stats, result = _build(fm, request, settings, lease)
    except CheckpointFileExistsError:
        return {**row, "action": "skipped", "reason": "the manifest exists already"}
    mark_sound(fm.root_uri, store, result.manifest)
    manifest_bytes = len(result.manifest.to_bytes())
    inv.wrote_snapshot(store, result.manifest_path, result.manifest, manifest_bytes, current=current)
    log.info(
        "snapshot of store %s at version %d: %s build, %d changelogs replayed, %d/%d SSTs uploaded",
        store,
        plan.latest,
        "warm" if stats.warm else "cold",
        stats.changelogs,
        result.uploaded_files,
        result.uploaded_files + result.reused_files,
    )
    return {
        **row,
        "action": "snapshot",
        "checkpoint_id": plan.latest_id,
        "manifest": result.manifest_path,
        "build": "warm" if stats.warm else "cold",
        "base_version": stats.base_version,
        "changelogs_replayed": stats.changelogs,
        "records_replayed": stats.records,
        "ssts_uploaded": result.uploaded_files,
        "ssts_reused": result.reused_files,
        "bytes_uploaded": result.uploaded_bytes + manifest_bytes,
        "num_keys": result.manifest.num_keys,
        "build_seconds": round(stats.seconds, 3),
        "seconds": round(time.perf_counter() - t0, 3),
        "written_at": round(time.time(), 3),
    }


def build_request(
    fm: CheckpointFileManager, inv: Inventory, plan: StorePlan, settings: MaintenanceSettings, *, reset: bool = False
) -> BuildRequest:
    """What building `plan`'s latest version takes: from its committed lineage, or a cold build from its
    intact snapshots; the SSTs the store holds are not uploaded again."""
    if plan.latest is None or plan.latest_id is None:
        raise ValueError(f"store {plan.store} has nothing committed to build")
    files = inv.files_of(plan.store)
    return BuildRequest(
        work=work_root(settings),
        store=plan.store,
        version=plan.latest,
        checkpoint_id=plan.latest_id,
        committed=plan.committed,
        snapshots={v: files.manifest_data[(v, cid)] for v, cid in plan.intact_snapshots.items()},
        full_state=plan.full_state,
        existing_ssts=files.ssts,
        corrupt_ssts=corrupt_ssts(fm.root_uri, plan.store),
        reset=reset,
    )


def _build(
    fm: CheckpointFileManager, request: BuildRequest, settings: MaintenanceSettings, lease: LeaseGuard
) -> tuple[BuildStats, SnapshotResult]:
    """Build the requested version in the store's replica and write its snapshot: here, or in the build
    process that holds the copy (``build_processes``); the lease is checked between the two either way."""
    if settings.build_processes:
        return build_processes(settings.build_processes).build(fm, request, lease.check)
    return request.build_and_write(fm, lease.check)


def _due(
    fm: CheckpointFileManager, inv: Inventory, plan: StorePlan, settings: MaintenanceSettings, requested_at: int | None
) -> bool:
    """Snapshot when the chain is due, or at once when the newest snapshot is bad (a repair)."""
    return _chain_due(plan, settings, requested_at) or _repair_reason(fm, inv, plan, settings) is not None


def _chain_due(plan: StorePlan, settings: MaintenanceSettings, requested_at: int | None) -> bool:
    """The chain crossed the store's point (`crossing_version`, as the checkpoint sensor asks), or the store
    committed the version its snapshot was requested at and has no snapshot that new."""
    if plan.latest is None:
        return False
    if crossing_version(settings, plan.store, plan.latest, plan.chain_length) is not None:
        return True
    return requested_at is not None and plan.latest >= requested_at > (plan.snapshot[0] if plan.snapshot else 0)


def _repair_reason(
    fm: CheckpointFileManager, inv: Inventory, plan: StorePlan, settings: MaintenanceSettings
) -> str | None:
    """Why the store's newest snapshot cannot be restored (None: it can, or there is none)."""
    if plan.latest is None:
        return None
    manifests = inv.files_of(plan.store).manifest_data
    return newest_snapshot_problem(fm, plan, manifests, checksums=True, work_dir=settings.work_dir)


def _sync(
    catalog: Catalog,
    fm: CheckpointFileManager,
    inv: Inventory,
    report: SnapshotReport,
    snapshotted: Mapping[StoreId, Row],
) -> None:
    """Tell the catalog about the new snapshots (an incremental sync of the `snapshotted` stores); its read
    errors are logged. A store whose snapshot this process wrote is told from its view in `inv`, which holds
    it (`Inventory.wrote_snapshot`): nothing listed or read again; the others (built on Spark's executors)
    are listed."""
    from statekeeper.maintenance.catalog_sync import sync_catalog
    from statekeeper.maintenance.sync_view import InventoryView

    known = [s for s, row in snapshotted.items() if (row["version"], row["checkpoint_id"]) in inv.files_of(s).manifests]
    result = sync_catalog(catalog, fm, raise_on_error=False, stores=snapshotted, view=InventoryView(inv, known))
    for err in result.errors:
        log.warning("catalog sync after snapshots of %s: %s", report.root, err)


__all__ = ["build_request", "create_snapshots", "snapshot_row"]
