"""Asset checks, per checkpoint root (the partitions of the assets they check).

- ``retained_versions_loadable`` (on ``retained_versions``): every retained committed version of every
  store is loadable: files present, checksums and lineage good (`statekeeper.maintenance.verify.verify_root`).
  Scheduled through `verification_job` (orchestration/verification.py), outside the root's run slot.
- ``chain_lengths_within_threshold`` (on ``state_snapshots``): no store replays more than
  ``snapshot_threshold`` changelogs on recovery after the run (warning: a store the run left over it; the
  sensor snapshots it on its next tick). Not on the chains the run found: a snapshot is requested at the
  threshold and lands some commits later, so those are over it on every healthy run.
- ``chains_within_twice_threshold`` (on ``state_snapshots``): no store's chain was longer than twice
  ``snapshot_threshold``, neither when the run found it (``max_chain_length_before`` of the run's
  materialization) nor after: maintenance is not keeping up (error). Evaluated after the run alone, it
  would see the chains the run had just reset and pass while the stores replayed far more.
- ``no_orphans_past_grace`` (on ``orphan_cleanup``): a dry run of orphan cleanup finds no orphan older
  than the grace period, and could look everywhere (a store it could not look into fails the check).
"""

import warnings
from collections.abc import Mapping

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    MetadataValue,
    PartitionsDefinition,
    asset_check,
)

from statekeeper.maintenance.health import chain_bound
from statekeeper.orchestration.assets import FOUND_MAX, FRESH_SYNC_SECONDS, ORPHANS, RETAINED, SNAPSHOTS, sync_lineage
from statekeeper.orchestration.metadata import chain_rows, chain_stats, numeric, report_errors, table
from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig
from statekeeper.store.files import CheckpointFileManager

LOADABLE = "retained_versions_loadable"
CHAINS = "chain_lengths_within_threshold"
NO_ORPHANS = "no_orphans_past_grace"
CHAINS_BOUNDED = "chains_within_twice_threshold"
CHECK_NAMES = (LOADABLE, CHAINS, CHAINS_BOUNDED, NO_ORPHANS)


def _root(context: AssetCheckExecutionContext, storage: CheckpointStorage) -> str:
    return storage.root_uri(context.partition_key)


def found_max(metadata: Mapping[str, MetadataValue]) -> int | None:
    """The longest chain a run found before it worked (``max_chain_length_before`` of its materialization)."""
    value = metadata.get(FOUND_MAX)
    return None if value is None or not isinstance(value.value, int) else value.value


def found_in_run(context: AssetCheckExecutionContext, root_key: str) -> int | None:
    """`found_max` of this run's materialization of the root's ``state_snapshots``; None when the check runs
    without one (alone, from the Checks tab: it then sees the chains as they are)."""
    op = context.op_execution_context
    records = op.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(SNAPSHOTS), asset_partitions=[root_key]), limit=1
    ).records
    if not records or records[0].run_id != op.run_id or records[0].asset_materialization is None:
        return None
    return found_max(records[0].asset_materialization.metadata)


def chain_check(
    name: str,
    fm: CheckpointFileManager,
    catalog: CatalogDatabase,
    threshold: int,
    found: int | None = None,
) -> tuple[bool, dict[str, MetadataValue], AssetCheckSeverity]:
    """The chain check `name` of `fm`'s root: whether every store replays at most the threshold (`CHAINS`, a warning,
    on the chains now) or twice it (`CHAINS_BOUNDED`, an error, on the chains now and `found`, the longest the
    run found before it worked) changelogs; passed, the chain metadata, severity."""
    bounded = name == CHAINS_BOUNDED
    limit = chain_bound(threshold) if bounded else threshold
    with catalog.session() as cat:
        sync_lineage(cat, fm, fresh_within=FRESH_SYNC_SECONDS, list_stores=False)  # the asset's run's
        chains = cat.chain_lengths(fm.root_uri)
    over = [c for c in chains if c.chain_length > limit]
    md = chain_stats(chains, threshold, "_after")
    md["stores_over_limit" if bounded else "stores_over_threshold"] = MetadataValue.int(len(over))
    md["details"] = table(chain_rows(over or chains))
    md["limit"] = MetadataValue.int(limit)
    passed = not over
    if found is not None:
        md[FOUND_MAX] = MetadataValue.int(found)
        if bounded:
            passed = passed and found <= limit
    md["evaluated_on"] = MetadataValue.text(
        "the chains the run found (max_chain_length_before) and after it"
        if bounded and found is not None
        else "the chains after the run"
        if found is not None
        else "the chains now (no materialization in this run)"
    )
    return passed, md, AssetCheckSeverity.ERROR if bounded else AssetCheckSeverity.WARN


def chain_check_evaluations(
    fm: CheckpointFileManager, catalog: CatalogDatabase, threshold: int, found: int | None = None
) -> list[AssetCheckEvaluation]:
    """Both chain checks of the root as evaluations of its partition of ``state_snapshots``, for work reported outside
    the asset's own run (the sensor's fleet runs, the external-maintenance sensor); `found`: the longest chain the
    work found before it snapshotted (`found_max`)."""
    out: list[AssetCheckEvaluation] = []
    for name in (CHAINS, CHAINS_BOUNDED):
        passed, md, severity = chain_check(name, fm, catalog, threshold, found)
        out.append(
            AssetCheckEvaluation(
                asset_key=AssetKey(SNAPSHOTS),
                check_name=name,
                passed=passed,
                metadata=md,
                severity=severity,
                partition=fm.root_uri,
            )
        )
    return out


def loadability(
    storage: CheckpointStorage, catalog: CatalogDatabase, maintenance: MaintenanceConfig, root: str
) -> tuple[bool, dict[str, MetadataValue]]:
    """Whether every retained version of every store of `root` is loadable, with the verification's metadata
    (`retained_versions_loadable`, run by the asset's job or by `verification_job`)."""
    fm = storage.file_manager(root)  # opened once: the sync and the verification share it
    with catalog.session() as cat:
        sync_lineage(cat, fm)
        report = maintenance.verify_operation()(fm, maintenance.settings(), catalog=cat)
    errors = report_errors(report)
    md = numeric(report.metadata())
    md["errors"] = MetadataValue.int(len(errors))
    md["details"] = table(report.rows())
    if errors:
        md["first_errors"] = MetadataValue.md("\n".join(f"- {e}" for e in errors[:20]))
    return not errors, md


def build_checks(partitions: PartitionsDefinition) -> list[AssetChecksDefinition]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*partitions_def.*")  # partitioned checks are a preview

        @asset_check(
            asset=RETAINED,
            name=LOADABLE,
            partitions_def=partitions,
            description="Every retained committed version of every store of the root is loadable "
            "(files present, checksums, lineage).",
        )
        def retained_versions_loadable(
            context: AssetCheckExecutionContext,
            storage: CheckpointStorage,
            catalog: CatalogDatabase,
            maintenance: MaintenanceConfig,
        ) -> AssetCheckResult:
            passed, md = loadability(storage, catalog, maintenance, _root(context, storage))
            return AssetCheckResult(passed=passed, metadata=md, severity=AssetCheckSeverity.ERROR)

        @asset_check(
            asset=SNAPSHOTS,
            name=CHAINS,
            partitions_def=partitions,
            description="No store of the root replays more than snapshot_threshold changelogs on recovery after "
            "the run (the chains it found, over the threshold by the snapshots' lag, are the bounded check's).",
        )
        def chain_lengths_within_threshold(
            context: AssetCheckExecutionContext,
            storage: CheckpointStorage,
            catalog: CatalogDatabase,
            maintenance: MaintenanceConfig,
        ) -> AssetCheckResult:
            fm = storage.file_manager(context.partition_key)
            found = found_in_run(context, context.partition_key)
            passed, md, severity = chain_check(CHAINS, fm, catalog, maintenance.snapshot_threshold, found)
            return AssetCheckResult(passed=passed, metadata=md, severity=severity)

        @asset_check(
            asset=SNAPSHOTS,
            name=CHAINS_BOUNDED,
            partitions_def=partitions,
            description="No store of the root replayed more than twice snapshot_threshold changelogs, when the run "
            "found it (max_chain_length_before) or after: maintenance keeps up with the writers.",
        )
        def chains_within_twice_threshold(
            context: AssetCheckExecutionContext,
            storage: CheckpointStorage,
            catalog: CatalogDatabase,
            maintenance: MaintenanceConfig,
        ) -> AssetCheckResult:
            fm = storage.file_manager(context.partition_key)
            found = found_in_run(context, context.partition_key)
            threshold = maintenance.snapshot_threshold
            passed, md, severity = chain_check(CHAINS_BOUNDED, fm, catalog, threshold, found)
            return AssetCheckResult(passed=passed, metadata=md, severity=severity)

        @asset_check(
            asset=ORPHANS,
            name=NO_ORPHANS,
            partitions_def=partitions,
            description="A dry run of orphan cleanup finds no orphan older than the grace period.",
        )
        def no_orphans_past_grace(
            context: AssetCheckExecutionContext,
            storage: CheckpointStorage,
            catalog: CatalogDatabase,
            maintenance: MaintenanceConfig,
        ) -> AssetCheckResult:
            from statekeeper.maintenance.orphans import clean_orphans

            fm = storage.file_manager(context.partition_key)
            with catalog.session() as cat:
                sync_lineage(cat, fm)
                report = clean_orphans(
                    fm,
                    maintenance.settings(),
                    catalog=cat,
                    orchestrator_run_id=context.op_execution_context.run_id,
                    dry_run=True,
                )
            values = report.metadata()
            files = int(values.get("files", 0))
            errors = report_errors(report)
            md = numeric(values)
            md["orphans_past_grace"] = MetadataValue.int(files)
            md["errors"] = MetadataValue.int(len(errors))
            md["details"] = table(report.rows())
            if errors:  # a store the dry run could not look into (blocked, leased) may hold orphans it did not count
                md["first_errors"] = MetadataValue.md("\n".join(f"- {e}" for e in errors[:20]))
            return AssetCheckResult(passed=files == 0 and not errors, metadata=md, severity=AssetCheckSeverity.WARN)

    return [
        retained_versions_loadable,
        chain_lengths_within_threshold,
        chains_within_twice_threshold,
        no_orphans_past_grace,
    ]


__all__ = [
    "CHAINS",
    "CHAINS_BOUNDED",
    "CHECK_NAMES",
    "LOADABLE",
    "NO_ORPHANS",
    "build_checks",
    "chain_check",
    "chain_check_evaluations",
    "found_max",
    "loadability",
]
