"""Maintenance done outside Dagster, shown in it: the external-maintenance sensor.

On a small machine a large fleet is best kept by the `statekeeper maintain` loop (one warm process), with the
checkpoint sensor off and Dagster for the UI, the checks and the schedules (docs/orchestration.md, "A thousand
store-commits a second"): a Dagster run starts a cold process, and one run of a root at a time cannot keep 1,000
store-commits a second on 2 cores. The loop records every operation it runs in the catalog, as the CLI does,
with no orchestrator run id. This sensor reads those rows on from its cursor and reports them as the root's
partition of the assets, as Dagster's own runs are: an `AssetMaterialization` of ``state_snapshots``,
``retained_versions``, ``orphan_cleanup`` or ``lineage_catalog`` per tick and root with the operations' summed
counts (``runs``, ``failed_runs`` and the reports' own numbers; ``max_chain_length_before``, the longest chain the
runs found, their largest), the chains after them (``..._after``), the root's size and, for snapshots, the
chain length and snapshot lag of every store (the plotted series of the asset's own runs); and after snapshots
the two chain checks as `AssetCheckEvaluation`s, the bounded one on the chains the loop found too. So the UI's
per-root history, plots and checks read the same whichever maintainer did the work, and the
``chains_within_twice_threshold`` check fails when the loop falls behind.

A tick costs one catalog query per root (the rows after the cursor, at most `MAX_RUNS` of them) and, when there
were snapshots, one incremental catalog sync of the new commit records for the checks. Runs still running when
read are kept in the cursor (at most `MAX_PENDING` per root) and reported once they end; dry runs and the rows of
Dagster's own runs are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from statekeeper.maintenance.reports import STATE_FIELDS
from statekeeper.orchestration.assets import FOUND_MAX, KINDS, SNAPSHOTS
from statekeeper.orchestration.checks import chain_check_evaluations, found_max
from statekeeper.orchestration.config import ENV_EXTERNAL_RUNS_SENSOR, OrchestrationConfig
from statekeeper.orchestration.metadata import chain_stats, health_metadata, numeric, root_size, worst_stores
from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig
from statekeeper.sql import Catalog, RunInfo
from statekeeper.sql.errors import CatalogError, NotInCatalogError
from statekeeper.sql.models import RUN_FAILED, RUN_RUNNING
from statekeeper.store.errors import StatekeeperError

SENSOR_NAME = "external_maintenance_sensor"
CURSOR_VERSION = 1
MAX_RUNS = 1000
"""Catalog rows a tick reads per root at most (the rest the next tick)."""
MAX_PENDING = 100
"""Runs still running that a root's cursor waits for at most (the oldest beyond are given up)."""
ASSET_OF_KIND = {kind: asset for asset, kind in KINDS.items()}
NOT_ADDITIVE = STATE_FIELDS
"""Report numbers that are a state, not a count: the newest run's, not the sum."""
MAXIMA = frozenset({"max_chain_length"})
"""Report numbers that are a maximum: the largest of the runs', not the sum."""


@dataclass
class ExternalCursor:
    after: dict[str, int] = field(default_factory=dict)
    """root -> the highest catalog run id read."""
    pending: dict[str, list[int]] = field(default_factory=dict)
    """root -> ids read while still running, reported once they end."""

    @classmethod
    def parse(cls, text: str | None) -> ExternalCursor:
        if not text:
            return cls()
        data = json.loads(text)
        if data.get("v") != CURSOR_VERSION:
            return cls()
        return cls(
            after={str(k): int(v) for k, v in data.get("after", {}).items()},
            pending={str(k): [int(i) for i in v] for k, v in data.get("pending", {}).items()},
        )

    def dump(self) -> str:
        return json.dumps({"v": CURSOR_VERSION, "after": self.after, "pending": self.pending}, sort_keys=True)


def read_new_runs(catalog: Catalog, root: str, cursor: ExternalCursor) -> list[RunInfo]:
    """The finished runs of `root` recorded outside Dagster since the cursor (not dry runs); moves the cursor
    on, keeping the ids of those still running for a later tick."""
    waiting = cursor.pending.get(root, [])
    rows = catalog.runs_after(root, cursor.after.get(root, 0), also=waiting, limit=MAX_RUNS)
    if rows:
        cursor.after[root] = max(cursor.after.get(root, 0), rows[-1].id)
    running = [r.id for r in rows if r.status == RUN_RUNNING]
    # a waited-for row that is gone (history pruned) is not waited for any more
    cursor.pending[root] = sorted(running)[-MAX_PENDING:]
    if not cursor.pending[root]:
        del cursor.pending[root]
    return [r for r in rows if r.status != RUN_RUNNING and not r.dry_run and r.kind in ASSET_OF_KIND]


def runs_metadata(runs: Sequence[RunInfo]) -> dict[str, MetadataValue]:
    """What runs of one kind did together: their count, the failed ones, the summed numbers of their reports
    (a state such as ``retained_versions``: the newest run's), the newest catalog run id."""
    sums: dict[str, float] = {"files": 0, "bytes": 0, "errors": 0, "seconds": 0.0}
    for run in runs:  # oldest first: a state ends as the newest run's
        sums["files"] += run.file_count
        sums["bytes"] += run.byte_count
        sums["errors"] += run.error_count
        for key, value in (run.details or {}).items():
            if isinstance(value, bool) or not isinstance(value, int | float) or key in ("errors", "dry_run"):
                continue
            if key in MAXIMA:
                sums[key] = max(sums.get(key, 0), value)
            else:
                sums[key] = value if key in NOT_ADDITIVE else sums.get(key, 0) + value
    md = numeric(sums)
    if "max_chain_length" in md:  # the longest chain the runs found before they worked: the chain checks' input
        md[FOUND_MAX] = md.pop("max_chain_length")
    md["runs"] = MetadataValue.int(len(runs))
    md["failed_runs"] = MetadataValue.int(sum(1 for r in runs if r.status == RUN_FAILED))
    md["catalog_run_id"] = MetadataValue.int(runs[-1].id)
    md["maintainer"] = MetadataValue.text("outside Dagster (statekeeper maintain or the CLI)")
    return md


def root_events(
    catalog: Catalog,
    storage: CheckpointStorage,
    catalog_db: CatalogDatabase,
    root: str,
    runs: Sequence[RunInfo],
    threshold: int,
) -> list[AssetMaterialization | AssetObservation | AssetCheckEvaluation]:
    """The events of one root's new runs: a materialization per asset (an observation naming the errors when every
    run of it failed), then the chain checks after snapshots."""
    from statekeeper.maintenance.health import health_from_chains

    by_asset: dict[str, list[RunInfo]] = {}
    for run in runs:
        by_asset.setdefault(ASSET_OF_KIND[run.kind], []).append(run)
    try:
        chains = catalog.chain_lengths(root)
    except NotInCatalogError:
        chains = []
    size = root_size(catalog, root)
    events: list[AssetMaterialization | AssetObservation | AssetCheckEvaluation] = []
    found: int | None = None
    for asset_name, done in by_asset.items():
        md = runs_metadata(done)
        md.update(chain_stats(chains, threshold, "_after"))
        md.update(size)
        md["worst_stores"] = worst_stores(chains)
        if asset_name == SNAPSHOTS:
            md.update(health_metadata(health_from_chains(chains)))
            found = found_max(md)
        if all(r.status == RUN_FAILED for r in done):  # nothing was made: seen on the asset's timeline, not plotted
            md["errors_text"] = MetadataValue.text("\n".join(r.errors or "" for r in done)[:4000])
            events.append(AssetObservation(asset_key=asset_name, partition=root, metadata=md))
        else:
            events.append(AssetMaterialization(asset_key=asset_name, partition=root, metadata=md))
    if SNAPSHOTS in by_asset:
        events += chain_check_evaluations(storage.file_manager(root), catalog_db, threshold, found)
    return events


def build_external_runs_sensor(config: OrchestrationConfig) -> SensorDefinition:
    @sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=config.sensor_interval_seconds,
        default_status=(
            DefaultSensorStatus.RUNNING if config.external_runs_sensor_enabled else DefaultSensorStatus.STOPPED
        ),
        description=(
            "Reports the maintenance runs the catalog recorded outside Dagster (the statekeeper maintain loop, the "
            "CLI) as the roots' materializations of the assets, with the chain checks after snapshots."
            + ("" if config.external_runs_sensor_enabled else f" Turned off by {ENV_EXTERNAL_RUNS_SENSOR}=off.")
        ),
    )
    def external_maintenance_sensor(
        context: SensorEvaluationContext,
        storage: CheckpointStorage,
        catalog: CatalogDatabase,
        maintenance: MaintenanceConfig,
    ) -> SensorResult | SkipReason:
        if not config.external_runs_sensor_enabled:
            return SkipReason(f"turned off by {ENV_EXTERNAL_RUNS_SENSOR}=off")
        cursor = ExternalCursor.parse(context.cursor)
        events: list[Any] = []
        notes: list[str] = []
        roots = storage.root_uris()
        with catalog.session() as cat:
            for root in roots:
                try:
                    runs = read_new_runs(cat, root, cursor)
                    if runs:
                        events += root_events(cat, storage, catalog, root, runs, maintenance.snapshot_threshold)
                        notes.append(f"{root}: {len(runs)} run(s)")
                except (StatekeeperError, CatalogError, OSError) as e:
                    context.log.error("external maintenance sensor: %s: %s", root, e)
        cursor.after = {r: v for r, v in cursor.after.items() if r in roots}
        cursor.pending = {r: v for r, v in cursor.pending.items() if r in roots}
        if not events:
            skip = SkipReason("no maintenance run outside Dagster ended")
            return SensorResult(skip_reason=skip, cursor=cursor.dump())
        context.log.info("reported %s", "; ".join(notes))
        return SensorResult(asset_events=events, cursor=cursor.dump())

    return external_maintenance_sensor


__all__ = [
    "SENSOR_NAME",
    "ExternalCursor",
    "build_external_runs_sensor",
    "read_new_runs",
    "root_events",
    "runs_metadata",
]
