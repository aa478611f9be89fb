"""The maintenance assets, one partition per checkpoint root.

- ``lineage_catalog``: the catalog of a root, synced from its checkpoint location (incremental, or
  full with ``full: true``).
- ``state_snapshots``: snapshots of every store whose changelog chain reached the threshold.
- ``retained_versions``: the root trimmed to the newest ``min_versions_to_retain`` versions (expiry).
- ``orphan_cleanup``: the root without orphan files older than the grace period.

They form a chain (lineage -> snapshots -> expiry -> orphans), so a run that materializes several
works on the root one operation at a time, in the order that deletes the most.

Each materialization records its maintenance run in the catalog with the Dagster run id (the
maintenance operation does, given ``orchestrator_run_id``; a run it did not record is recorded
here), and reports numeric metadata the UI plots (files, bytes, seconds, the root's chain lengths before
and after the run under keys of their own, its size) plus a ``details`` table of what it did and a
``worst_stores`` table. A run whose operation reports errors fails, naming them.
"""

import contextlib
import datetime as dt
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    asset,
)
from pydantic import Field

from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.orchestration.metadata import (
    chain_rows,
    chain_stats,
    chains_of,
    health_metadata,
    numeric,
    report_errors,
    report_metadata,
    root_size,
    rounded,
    table,
    worst_stores,
)
from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig
from statekeeper.sql import Catalog, NotInCatalogError, StoreChain
from statekeeper.sql.models import utcnow
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import StoreId
from statekeeper.store.rocks import release_free_heap

GROUP = "statekeeper"
LINEAGE = "lineage_catalog"
SNAPSHOTS = "state_snapshots"
RETAINED = "retained_versions"
ORPHANS = "orphan_cleanup"
ASSET_NAMES = (LINEAGE, SNAPSHOTS, RETAINED, ORPHANS)

KIND_TAG = "statekeeper/kind"
ROOT_TAG = "statekeeper/root"
KINDS = {LINEAGE: "catalog-sync", SNAPSHOTS: "snapshot", RETAINED: "expire", ORPHANS: "clean-orphans"}
"""The maintenance kind of each asset (run tag, and the kind the failure sensor records)."""


class LineageConfig(Config):
    full: bool = Field(default=False, description="List the whole root and mark missing files deleted.")


class SnapshotConfig(Config):
    stores: list[str] = Field(
        default_factory=list,
        description="Only these stores (operator/partition, optionally @version as the sensor names them: "
        "snapshotted once they committed that version, whatever their chain); empty: every store whose chain "
        "reached the threshold.",
    )


class DeleteConfig(Config):
    dry_run: bool = Field(default=False, description="Report what would be deleted, delete nothing.")


def parse_stores(specs: list[str]) -> dict[StoreId, int | None] | None:
    """``operator/partition[@version]`` -> store id -> the version named, if any (None for an empty list:
    every store). A store named more than once keeps the lowest version named."""
    if not specs:
        return None
    out: dict[StoreId, int | None] = {}
    for spec in specs:
        store_part, at, version = spec.partition("@")
        name, sep, number = store_part.rpartition("/")
        if not sep or not number.isdigit() or (at and not version.isdigit()):
            raise ConfigurationError(f"invalid store {spec!r}: expected operator/partition[@version]")
        store = StoreId(name, int(number))
        named = [v for v in (out.get(store), int(version) if at else None) if v is not None]
        out[store] = min(named, default=None)
    return out


FRESH_SYNC_SECONDS = 1.0
"""A sync of the root younger than this is as current as another would be (a store commits its next version
a second or more after the last): an asset's run and the checks after it reuse the sync before them."""


def sync_lineage(
    catalog: Catalog, fm: CheckpointFileManager, *, fresh_within: float = 0.0, list_stores: bool = True
) -> Any:
    """An incremental catalog sync, not recorded as a run (it keeps chain lengths and checks current);
    none when the root's last sync is younger than `fresh_within` seconds. Without `list_stores`, only the
    new commit records (of a root the catalog knows): enough for chain lengths and bases (snapshot runs
    sync the snapshots they write), without listing every store's directories."""
    from statekeeper.maintenance.catalog_sync import sync_catalog

    if fresh_within > 0 and _synced_within(catalog, fm.root_uri, fresh_within):
        return None
    return sync_catalog(catalog, fm, raise_on_error=False, stores=None if list_stores else ())


def _synced_within(catalog: Catalog, root: str, seconds: float) -> bool:
    try:
        last, _ = catalog.last_sync(root)
    except NotInCatalogError:
        return False
    return last is not None and (utcnow() - last).total_seconds() < seconds  # aware UTC (UTCDateTime)


def ensure_recorded(
    catalog: Catalog, root: str, kind: str, run_id: str, since: dt.datetime, report: Any, *, dry_run: bool = False
) -> int:
    """The catalog run id of the operation; records the run when the operation did not (`report.run_id`)."""
    recorded = getattr(report, "run_id", None)
    if isinstance(recorded, int):
        return recorded
    md = report.metadata()
    errors = report_errors(report)
    rid = catalog.start_run(root, kind, dry_run=dry_run, orchestrator_run_id=run_id, started_at=since)
    catalog.finish_run(
        rid,
        status="failed" if errors else "succeeded",
        stores=int(md.get("stores", 0)),
        files=int(md.get("files", 0)),
        bytes=int(md.get("bytes", 0)),
        errors=errors,
        details={"metadata": md},
    )
    return rid


def _fail_on_errors(what: str, root: str, errors: list[str], metadata: dict[str, MetadataValue]) -> None:
    if errors:
        shown = "; ".join(errors[:5]) + (f" (and {len(errors) - 5} more)" if len(errors) > 5 else "")
        raise Failure(description=f"{what} of {root} reported {len(errors)} error(s): {shown}", metadata=metadata)


def _run_leases(
    asset_name: str,
    cat: Catalog,
    fm: CheckpointFileManager,
    maintenance: MaintenanceConfig,
    settings: MaintenanceSettings,
    kwargs: dict[str, Any],
) -> AbstractContextManager[object]:
    """The leases of every store the run may change (those asked for, else every store the catalog knows),
    taken in one catalog transaction and held until the operation ends, as a cycle of the maintenance loop
    takes them: one acquisition, renewal and release for the run instead of one each per store, and no
    second listing of a store under its lease. Stores held elsewhere (or new to the catalog) are leased
    one by one as before. Not for dry runs (they change nothing) nor for snapshots built by the Spark
    engine (its executors take the leases)."""
    if kwargs.get("dry_run") or (asset_name == SNAPSHOTS and maintenance.engine != "local"):
        return contextlib.nullcontext()
    from statekeeper.maintenance.leasing import cycle_leases

    stores = kwargs.get("stores")
    if stores is None:
        try:
            stores = [StoreId(s.operator, s.partition) for s in cat.stores(fm.root_uri)]
        except NotInCatalogError:
            stores = []
    return cycle_leases(fm, settings, cat, stores)


FOUND_MAX = "max_chain_length_before"
"""The longest chain a run found before it worked: the key the chain checks evaluate."""


def lineage_metadata(catalog: Catalog, root: str, result: Any, threshold: int) -> dict[str, MetadataValue]:
    """A catalog sync of `root` (`CatalogSyncResult`) as ``lineage_catalog`` metadata, whoever ran it (the asset's
    run, the checkpoint sensor's tick): its counts, the root's chains and size now, the snapshot lag percentiles,
    the worst stores and every store's chain (``details``)."""
    from statekeeper.maintenance.health import health_from_chains, summarize

    chains = chains_of(catalog, root)
    md = numeric({k: v for k, v in result.to_json().items() if k != "errors"})
    md["errors"] = MetadataValue.int(len(result.errors))
    md.update(chain_stats(chains, threshold))
    md.update(numeric(summarize(health_from_chains(chains)).metadata()))
    md.update(root_size(catalog, root))
    md["worst_stores"] = worst_stores(chains)
    md["details"] = table(chain_rows(chains))
    return md


def run_chain_metadata(
    report_values: dict[str, MetadataValue], before: list[StoreChain], after: list[StoreChain], threshold: int
) -> dict[str, MetadataValue]:
    """The chains of the root before and after a run, under their own keys (``..._before`` / ``..._after``).
    ``max_chain_length_before`` is the longest the run found: the catalog's before the run, or the report's own
    (a snapshot run's inventory, which its log shows) when longer. The report's ``max_chain_length`` is taken out
    of `report_values` for it: one key the after-values overwrote was the UI showing 0 for a run that found 27."""
    md = chain_stats(before, threshold, "_before")
    found = report_values.pop("max_chain_length", None)
    if found is not None and isinstance(found.value, int):
        md[FOUND_MAX] = MetadataValue.int(max([found.value, *(c.chain_length for c in before)]))
    md.update(chain_stats(after, threshold, "_after"))
    md["worst_stores"] = worst_stores(after, before)
    return md


@dataclass(frozen=True)
class RootOutcome:
    """What one maintenance operation on one root did."""

    metadata: dict[str, MetadataValue]
    """For the UI: the report's numbers, the chains before and after it, the root's size, its catalog run."""
    errors: list[str]
    summary: dict[str, int | float]
    """The operation's own figures (`report.metadata()`), for the run's log."""


def maintain_root(
    fm: CheckpointFileManager,
    run_id: str,
    asset_name: str,
    operation: Callable[..., Any],
    catalog: CatalogDatabase,
    maintenance: MaintenanceConfig,
    *,
    health: bool = False,
    **kwargs: Any,
) -> RootOutcome:
    """Run one maintenance operation on `fm`'s root (opened by the run, once) for Dagster run `run_id`.

    The root's chains are read from the catalog before the operation (after syncing the new commit records) and
    after it (`run_chain_metadata`). With `health`, also the chain length and snapshot lag of every store after the
    run (`statekeeper.maintenance.health`, from the catalog), as numbers the UI plots per store.
    """
    root = fm.root_uri
    settings = maintenance.settings()
    t0 = time.perf_counter()
    since = utcnow()
    with catalog.session() as cat:
        # the chains the run finds: the new commit records, however recent the last sync (a root new to the
        # catalog is listed whole, once)
        sync_lineage(cat, fm, list_stores=False)
        before = chains_of(cat, root)
        with _run_leases(asset_name, cat, fm, maintenance, settings, kwargs):
            try:
                report = operation(fm, settings, catalog=cat, orchestrator_run_id=run_id, **kwargs)
            finally:
                release_free_heap()  # as the maintain loop after each cycle: for a process running many runs
        catalog_run = ensure_recorded(
            cat, root, KINDS[asset_name], run_id, since, report, dry_run=bool(kwargs.get("dry_run"))
        )
        sync_lineage(cat, fm, fresh_within=FRESH_SYNC_SECONDS, list_stores=False)  # chains as they are now
        chains = cat.chain_lengths(root)
        size = root_size(cat, root)
    md = report_metadata(report)
    md.update(run_chain_metadata(md, before, chains, settings.snapshot_threshold))
    md.update(size)
    if health:
        from statekeeper.maintenance.health import health_from_chains

        md.update(health_metadata(health_from_chains(chains)))
    md["asset_seconds"] = MetadataValue.float(round(time.perf_counter() - t0, 2))
    md["catalog_run_id"] = MetadataValue.int(catalog_run)
    summary = {k: rounded(k, v) if isinstance(v, float) else v for k, v in report.metadata().items()}
    return RootOutcome(md, report_errors(report), summary)


def run_maintenance(
    context: AssetExecutionContext,
    asset_name: str,
    operation: Callable[..., Any],
    storage: CheckpointStorage,
    catalog: CatalogDatabase,
    maintenance: MaintenanceConfig,
    *,
    health: bool = False,
    **kwargs: Any,
) -> MaterializeResult[None]:
    """`maintain_root` on the root of the asset's partition; a run whose operation reports errors fails."""
    root = context.partition_key
    fm = storage.file_manager(root)
    out = maintain_root(fm, context.run.run_id, asset_name, operation, catalog, maintenance, health=health, **kwargs)
    _fail_on_errors(KINDS[asset_name], root, out.errors, out.metadata)
    context.log.info("%s of %s: %s", KINDS[asset_name], root, out.summary)
    context.log.info(
        "%s of %s: max_chain_length_before: %s, max_chain_length_after: %s",
        KINDS[asset_name],
        root,
        out.metadata[FOUND_MAX].value,
        out.metadata["max_chain_length_after"].value,
    )
    return MaterializeResult(metadata=out.metadata)


def build_assets(partitions: PartitionsDefinition) -> list[AssetsDefinition]:
    """The four assets, partitioned by checkpoint root, in the order of a `statekeeper maintain` cycle: lineage, then
    expiry (what the commits made unneeded goes first), snapshots, orphans."""

    @asset(
        name=LINEAGE,
        partitions_def=partitions,
        group_name=GROUP,
        tags={KIND_TAG: KINDS[LINEAGE]},
        kinds={"sql"},
        description="Lineage catalog of the checkpoint root: every committed version, attempt, snapshot and "
        "file, synced from the checkpoint location (the source of truth).",
    )
    def lineage_catalog(
        context: AssetExecutionContext,
        config: LineageConfig,
        storage: CheckpointStorage,
        catalog: CatalogDatabase,
        maintenance: MaintenanceConfig,
    ) -> MaterializeResult[None]:
        from statekeeper.maintenance.catalog_sync import sync_catalog

        fm = storage.file_manager(context.partition_key)
        with catalog.session() as cat:
            result = sync_catalog(
                cat, fm, full=config.full, raise_on_error=False, record_run=True, orchestrator_run_id=context.run.run_id
            )
            md = lineage_metadata(cat, fm.root_uri, result, maintenance.snapshot_threshold)
        md["synced_by"] = MetadataValue.text(f"run {context.run.run_id}")
        _fail_on_errors("catalog sync", fm.root_uri, list(result.errors), md)
        return MaterializeResult(metadata=md)

    @asset(
        name=SNAPSHOTS,
        partitions_def=partitions,
        group_name=GROUP,
        deps=[RETAINED],
        tags={KIND_TAG: KINDS[SNAPSHOTS]},
        description="Snapshots of every store whose changelog chain since its last snapshot reached the "
        "threshold: recovery replays few changelogs.",
    )
    def state_snapshots(
        context: AssetExecutionContext,
        config: SnapshotConfig,
        storage: CheckpointStorage,
        catalog: CatalogDatabase,
        maintenance: MaintenanceConfig,
    ) -> MaterializeResult[None]:
        requested = parse_stores(config.stores)
        if requested is not None:
            context.log.info("requested for %s", ", ".join(config.stores))
        return run_maintenance(
            context,
            SNAPSHOTS,
            maintenance.snapshot_operation(),
            storage,
            catalog,
            maintenance,
            health=True,
            stores=None if requested is None else list(requested),
            due_at=None if requested is None else {s: v for s, v in requested.items() if v is not None},
        )

    @asset(
        name=RETAINED,
        partitions_def=partitions,
        group_name=GROUP,
        deps=[LINEAGE],
        tags={KIND_TAG: KINDS[RETAINED]},
        description="The checkpoint trimmed to the newest min_versions_to_retain committed versions: older "
        "changelogs, manifests, SST files and commit records deleted in parallel batches.",
    )
    def retained_versions(
        context: AssetExecutionContext,
        config: DeleteConfig,
        storage: CheckpointStorage,
        catalog: CatalogDatabase,
        maintenance: MaintenanceConfig,
    ) -> MaterializeResult[None]:
        from statekeeper.maintenance.expiry import expire_versions

        return run_maintenance(
            context, RETAINED, expire_versions, storage, catalog, maintenance, dry_run=config.dry_run
        )

    @asset(
        name=ORPHANS,
        partitions_def=partitions,
        group_name=GROUP,
        deps=[SNAPSHOTS],
        tags={KIND_TAG: KINDS[ORPHANS]},
        description="The checkpoint without orphans older than the grace period: files of losing attempts, "
        "unreferenced SST files, leftovers of crashed writes.",
    )
    def orphan_cleanup(
        context: AssetExecutionContext,
        config: DeleteConfig,
        storage: CheckpointStorage,
        catalog: CatalogDatabase,
        maintenance: MaintenanceConfig,
    ) -> MaterializeResult[None]:
        from statekeeper.maintenance.orphans import clean_orphans

        return run_maintenance(context, ORPHANS, clean_orphans, storage, catalog, maintenance, dry_run=config.dry_run)

    return [lineage_catalog, state_snapshots, retained_versions, orphan_cleanup]


__all__ = [
    "ASSET_NAMES",
    "FOUND_MAX",
    "GROUP",
    "KINDS",
    "KIND_TAG",
    "LINEAGE",
    "ORPHANS",
    "RETAINED",
    "ROOT_TAG",
    "SNAPSHOTS",
    "RootOutcome",
    "build_assets",
    "ensure_recorded",
    "lineage_metadata",
    "maintain_root",
    "run_chain_metadata",
    "run_maintenance",
    "sync_lineage",
]
