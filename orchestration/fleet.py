"""One run for several checkpoint roots: the checkpoint sensor's fleet run.

A Dagster run pays its process start before any work (Dagster's and statekeeper's imports, the run's own
machinery: about 3 s of CPU on a 2-core machine), the same for a root of one store as for a root of a
hundred. A fleet of streaming queries is many roots; a run per root per threshold's worth of commits then
costs more than the maintenance itself. So when a tick of the checkpoint sensor finds work in at least
``STATEKEEPER_SENSOR_FLEET_ROOTS`` roots (default 2), or while its last fleet run is in progress, it
requests one `fleet_maintenance_job` run for all of them. The run takes the roots in turn and does for
each what its `snapshot_and_expiry_job` run would: the expiry of a root whose base moved, then the
snapshots of the stores that crossed, then the chain checks. Each is reported as the root's partition of
the assets (an `AssetMaterialization` of ``retained_versions`` / ``state_snapshots`` with the same metadata,
the checks as `AssetCheckEvaluation`s of the partition), so the UI's per-root history, plots and checks
read the same whichever run did the work.

One fleet run at a time (the ``statekeeper/fleet`` tag's limit in orchestration/dagster.yaml). It does not
take the roots' run slots (their partition tag): a schedule's run of a root may run beside it, and the
catalog leases keep the two off the same store, as they keep `statekeeper maintain` and Dagster apart. A
root that fails does not stop the others; the run fails after all of them, naming each failed root.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    AssetMaterialization,
    AssetObservation,
    Config,
    Failure,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    RunConfig,
    RunRequest,
    job,
    op,
)
from pydantic import Field

from statekeeper.orchestration.assets import KIND_TAG, RETAINED, SNAPSHOTS, maintain_root, parse_stores
from statekeeper.orchestration.checks import chain_check_evaluations, found_max
from statekeeper.orchestration.jobs import MAINTENANCE_TAG, SNAPSHOT_AND_EXPIRY_KIND
from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig
from statekeeper.sql.errors import CatalogError
from statekeeper.store.errors import StatekeeperError

FLEET_JOB = "fleet_maintenance_job"
FLEET_OP = "fleet_maintenance"
FLEET_TAG = "statekeeper/fleet"


class FleetConfig(Config):
    snapshots: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Checkpoint root (its partition key) -> the stores to snapshot there (operator/partition@version "
        "as the checkpoint sensor names them: snapshotted once they committed that version); an empty list: every "
        "store of the root whose chain reached the threshold.",
    )
    expire: list[str] = Field(
        default_factory=list, description="Checkpoint roots to expire (before their snapshots): their bases moved."
    )

    def roots(self) -> list[str]:
        """Every root the run works on, in the order it takes them."""
        return sorted({*self.snapshots, *self.expire})


def fleet_roots(run_config: Mapping[str, Any]) -> list[str]:
    """The roots a fleet run's configuration names (none for any other run)."""
    return FleetConfig(**run_config.get("ops", {}).get(FLEET_OP, {}).get("config", {})).roots()


def fleet_request(work: Mapping[str, tuple[list[str], list[str]]], run_key: str, tags: Mapping[str, str]) -> RunRequest:
    """One `fleet_maintenance_job` run for `work`: root -> (its store@version crossings, its moved bases)."""
    config = FleetConfig(
        snapshots={root: crossings for root, (crossings, _) in work.items() if crossings},
        expire=sorted(root for root, (_, bases) in work.items() if bases),
    )
    return _request(config, run_key, tags)


def fleet_expiry_request(roots: Sequence[str], run_key: str, tags: Mapping[str, str]) -> RunRequest:
    """One `fleet_maintenance_job` run expiring every root in `roots` (the expiry schedule's, for a fleet)."""
    return _request(FleetConfig(expire=sorted(roots)), run_key, tags)


def _request(config: FleetConfig, run_key: str, tags: Mapping[str, str]) -> RunRequest:
    return RunRequest(
        run_key=run_key,
        job_name=FLEET_JOB,
        run_config=RunConfig(ops={FLEET_OP: config}),
        tags={**tags, FLEET_TAG: "true"},
    )


@op(
    name=FLEET_OP,
    description="For each root named: expiry if its base moved, then the snapshots asked for, then the chain checks.",
)
def fleet_maintenance(
    context: OpExecutionContext,
    config: FleetConfig,
    storage: CheckpointStorage,
    catalog: CatalogDatabase,
    maintenance: MaintenanceConfig,
) -> None:
    configured = set(storage.root_uris())
    failed: dict[str, list[str]] = {}
    for root in config.roots():
        if root not in configured:
            failed[root] = ["not a configured checkpoint root"]
            continue
        try:
            errors = _maintain(context, root, config, storage, catalog, maintenance)
        except (StatekeeperError, CatalogError, OSError) as e:
            errors = [f"{type(e).__name__}: {e}"]
        if errors:
            failed[root] = errors
            context.log.error("maintenance of %s: %s", root, "; ".join(errors[:5]))
    if failed:
        shown = "; ".join(f"{root}: {errors[0]}" for root, errors in sorted(failed.items())[:5])
        raise Failure(
            description=f"fleet maintenance: {len(failed)} of the run's roots failed: {shown}",
            metadata={"failed_roots": MetadataValue.json(failed)},
        )


def _maintain(
    context: OpExecutionContext,
    root: str,
    config: FleetConfig,
    storage: CheckpointStorage,
    catalog: CatalogDatabase,
    maintenance: MaintenanceConfig,
) -> list[str]:
    """One root's work, reported as its partition of the assets and checks; the errors of its first failed step
    (as in an asset run, snapshots wait for the expiry before them)."""
    from statekeeper.maintenance.expiry import expire_versions

    run_id = context.run.run_id
    fm = storage.file_manager(root)  # once for the root's steps and checks
    steps: list[tuple[str, Any, dict[str, Any]]] = []
    if root in config.expire:
        steps.append((RETAINED, expire_versions, {}))
    if root in config.snapshots:
        requested = parse_stores(config.snapshots[root])  # as the asset's config: none named, every store due
        stores = None if requested is None else list(requested)
        due = None if requested is None else {s: v for s, v in requested.items() if v is not None}
        steps.append((SNAPSHOTS, maintenance.snapshot_operation(), {"stores": stores, "due_at": due}))
    found: int | None = None
    for asset_name, operation, kwargs in steps:
        out = maintain_root(
            fm, run_id, asset_name, operation, catalog, maintenance, health=asset_name == SNAPSHOTS, **kwargs
        )
        if out.errors:  # what it did before it failed (files it deleted, snapshots it wrote), its errors named
            metadata = {**out.metadata, "errors_text": MetadataValue.text("\n".join(out.errors)[:4000])}
            context.log_event(AssetObservation(asset_key=asset_name, partition=root, metadata=metadata))
            return out.errors
        context.log_event(AssetMaterialization(asset_key=asset_name, partition=root, metadata=out.metadata))
        found = found_max(out.metadata) if asset_name == SNAPSHOTS else found
        context.log.info("%s of %s: %s", asset_name, root, out.summary)
    if root in config.snapshots:
        for evaluation in chain_check_evaluations(fm, catalog, maintenance.snapshot_threshold, found):
            context.log_event(evaluation)  # type: ignore[arg-type]  # its annotation omits the check evaluations it takes
    return []


def build_fleet_job() -> JobDefinition:
    @job(
        name=FLEET_JOB,
        description="Expiry and snapshots of several checkpoint roots in one run (the checkpoint sensor's, when "
        "a tick finds work in several roots): each reported as the root's partition of the assets.",
        tags={KIND_TAG: SNAPSHOT_AND_EXPIRY_KIND, MAINTENANCE_TAG: "true"},
    )
    def fleet_maintenance_job() -> None:
        fleet_maintenance()

    return fleet_maintenance_job


__all__ = [
    "FLEET_JOB",
    "FLEET_OP",
    "FLEET_TAG",
    "FleetConfig",
    "build_fleet_job",
    "fleet_expiry_request",
    "fleet_request",
    "fleet_roots",
]
