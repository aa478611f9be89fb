"""One job per maintenance operation, each on the checkpoint-root partitions, and the checkpoint sensor's
job that snapshots and expires a root in one run.

Runs carry the ``statekeeper/kind`` tag; the ``dagster/partition`` tag (the root) is what the run
coordinator's concurrency limit keys on (orchestration/dagster.yaml), so at most one maintenance run
per checkpoint root is in progress at a time, whatever launched it (sensor, schedule, UI).
"""

from __future__ import annotations

from collections.abc import Mapping

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    Definitions,
    JobDefinition,
    RunConfig,
    RunRequest,
    define_asset_job,
)
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from statekeeper.orchestration.assets import KIND_TAG, KINDS, LINEAGE, ORPHANS, RETAINED, SNAPSHOTS, SnapshotConfig
from statekeeper.orchestration.checks import CHAINS, CHAINS_BOUNDED

MAINTENANCE_TAG = "statekeeper/maintenance"
JOB_NAMES = {
    LINEAGE: "catalog_sync_job",
    SNAPSHOTS: "snapshot_job",
    RETAINED: "expiry_job",
    ORPHANS: "orphan_cleanup_job",
}
DESCRIPTIONS = {
    LINEAGE: "Sync the lineage catalog of a checkpoint root from its checkpoint location.",
    SNAPSHOTS: "Snapshot every store of a root whose changelog chain reached the threshold.",
    RETAINED: "Delete what the newest min_versions_to_retain versions of a root do not need.",
    ORPHANS: "Delete orphan files of a root older than the grace period.",
}
SNAPSHOT_AND_EXPIRY_JOB = "snapshot_and_expiry_job"
SNAPSHOT_AND_EXPIRY_KIND = "maintenance"
"""The kind of a run of several maintenance assets (its `statekeeper/kind` tag, or derived from its assets)."""
SNAPSHOT_CHECKS = [AssetCheckKey(AssetKey(SNAPSHOTS), name) for name in (CHAINS, CHAINS_BOUNDED)]
"""The checks a sensor's snapshot run carries: the chain bounds (not the loadability check, which reads every
retained version and runs on the verification schedule, outside the root's run slot)."""


def build_jobs() -> dict[str, UnresolvedAssetJobDefinition]:
    """Asset name -> its job (the asset and its checks; partitioned as the asset, by root)."""
    return {
        asset_name: define_asset_job(
            name=job_name,
            selection=AssetSelection.assets(asset_name),
            description=DESCRIPTIONS[asset_name],
            tags={KIND_TAG: KINDS[asset_name], MAINTENANCE_TAG: "true"},
        )
        for asset_name, job_name in JOB_NAMES.items()
    }


def build_snapshot_and_expiry_job() -> UnresolvedAssetJobDefinition:
    """Snapshots and expiry of one root in one run: what the checkpoint sensor requests when a tick finds
    both a crossing and a moved base, so the root's run slot and the cores pay one run's process start (about
    2 s of each on a 2-core machine) instead of two."""
    return define_asset_job(
        name=SNAPSHOT_AND_EXPIRY_JOB,
        selection=AssetSelection.assets(SNAPSHOTS, RETAINED),
        description="Delete what the newest min_versions_to_retain versions of a root no longer need, then "
        "snapshot its stores that crossed the threshold.",
        tags={KIND_TAG: SNAPSHOT_AND_EXPIRY_KIND, MAINTENANCE_TAG: "true"},
    )


def snapshot_request(
    root: str, run_key: str, crossings: list[str], tags: Mapping[str, str], *, expire: bool = False
) -> RunRequest:
    """A `snapshot_job` run snapshotting the `crossings` (``operator/partition@version``) of `root`, with the
    chain checks; with `expire`, a `snapshot_and_expiry_job` run that expires the root first (as the assets
    depend), without the loadability check."""
    return RunRequest(
        run_key=run_key,
        job_name=SNAPSHOT_AND_EXPIRY_JOB if expire else JOB_NAMES[SNAPSHOTS],
        partition_key=root,
        run_config=RunConfig(ops={SNAPSHOTS: SnapshotConfig(stores=crossings)}),
        asset_selection=[AssetKey(RETAINED), AssetKey(SNAPSHOTS)] if expire else None,
        asset_check_keys=SNAPSHOT_CHECKS if expire else None,
        tags=dict(tags),
    )


def expiry_request(root: str, run_key: str, tags: Mapping[str, str]) -> RunRequest:
    """An `expiry_job` run of `root` without the loadability check, which reads every retained version (the
    verification schedule runs it, outside the root's run slot). The daemon takes a request for a subset
    only if it selects something: with no asset named it would launch the whole job, check and all."""
    return RunRequest(
        run_key=run_key,
        job_name=JOB_NAMES[RETAINED],
        partition_key=root,
        asset_selection=[AssetKey(RETAINED)],
        asset_check_keys=[],
        tags=dict(tags),
    )


def requested_job(defs: Definitions, request: RunRequest, target: str | None = None) -> JobDefinition:
    """The job the daemon launches for a sensor's or schedule's `request`: a subset only when the request
    selects assets or checks (Dagster's `JobSubsetSelector.is_subset_selection`), else the whole job with
    every check. `target`: the job of a schedule, whose requests name none. For running a request in
    process as a deployment would (tests, benchmarks)."""
    job_name = request.job_name or target
    assert job_name is not None, "a sensor's request names its job; a schedule's is its target"
    job = defs.resolve_job_def(job_name)
    selector = JobSubsetSelector(
        location_name="",
        repository_name="",
        job_name=job_name,
        op_selection=None,
        asset_selection=request.asset_selection,
        asset_check_selection=request.asset_check_keys,
    )
    if not selector.is_subset_selection:
        return job
    return job.get_subset(
        asset_selection=set(request.asset_selection or job.asset_layer.executable_asset_keys),
        asset_check_selection=selector.asset_check_selection,
    )


__all__ = [
    "JOB_NAMES",
    "MAINTENANCE_TAG",
    "SNAPSHOT_AND_EXPIRY_JOB",
    "SNAPSHOT_AND_EXPIRY_KIND",
    "build_jobs",
    "build_snapshot_and_expiry_job",
    "expiry_request",
    "requested_job",
    "snapshot_request",
]
