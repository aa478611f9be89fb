"""One job per maintenance operation, each on the checkpoint-root partitions.

Runs carry the ``statekeeper/kind`` tag; the ``dagster/partition`` tag (the root) is what the run
coordinator's concurrency limit keys on (orchestration/dagster.yaml), so at most one maintenance run
per checkpoint root is in progress at a time, whatever launched it (sensor, schedule, UI).
"""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from statekeeper.orchestration.assets import KIND_TAG, KINDS, LINEAGE, ORPHANS, RETAINED, SNAPSHOTS

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


__all__ = ["JOB_NAMES", "MAINTENANCE_TAG", "build_jobs"]
