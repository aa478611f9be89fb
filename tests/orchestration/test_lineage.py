"""The lineage asset and catalog_sync_job on real local and S3 checkpoints written by the store."""

from __future__ import annotations

from typing import Any

from dagster import AssetKey, AssetsDefinition, materialize

from statekeeper.orchestration.assets import LINEAGE
from statekeeper.orchestration.jobs import JOB_NAMES
from tests.orchestration.conftest import THRESHOLD, Orch


def _metadata(result, asset: str) -> dict[str, Any]:
    mats = [e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(asset)]
    assert len(mats) == 1
    return {k: v.value for k, v in mats[0].materialization.metadata.items()}


def test_catalog_sync_job_records_lineage_and_its_run(orch: Orch) -> None:
    orch.writer.commit(THRESHOLD + 2)
    job = orch.defs.resolve_job_def(JOB_NAMES[LINEAGE])
    result = job.execute_in_process(partition_key=orch.root, instance=orch.instance)
    assert result.success
    md = _metadata(result, LINEAGE)
    assert md["commits"] == THRESHOLD + 2
    assert md["files_new"] >= 2 * (THRESHOLD + 2) + THRESHOLD + 2  # changelogs of 2 partitions + commit records
    assert md["stores"] == 2
    assert md["max_chain_length"] == THRESHOLD + 2
    assert md["stores_at_or_over_threshold"] == 2
    assert md["errors"] == 0
    assert isinstance(md["seconds"], float)
    rows = md["details"].records
    assert {(r.data["operator"], r.data["partition"]) for r in rows} == {("agg", 0), ("agg", 1)}
    runs = orch.catalog.runs(orch.root)
    assert [r.orchestrator_run_id for r in runs] == [result.run_id]
    assert runs[0].status == "succeeded" and runs[0].kind == "catalog-incremental"

    # incremental: a second run adds only what is new; a full pass with config
    orch.writer.commit(1)
    again = job.execute_in_process(partition_key=orch.root, instance=orch.instance)
    assert _metadata(again, LINEAGE)["commits"] == 1
    full = job.execute_in_process(
        partition_key=orch.root,
        instance=orch.instance,
        run_config={"ops": {LINEAGE: {"config": {"full": True}}}},
    )
    assert _metadata(full, LINEAGE)["commits"] == 0
    kinds = [r.kind for r in orch.catalog.runs(orch.root)]
    assert kinds == ["catalog-full", "catalog-incremental", "catalog-incremental"]


def test_materialize_lineage_asset(orch: Orch) -> None:
    orch.writer.commit(2)
    assets = [a for a in orch.defs.assets or [] if isinstance(a, AssetsDefinition) and a.key == AssetKey(LINEAGE)]
    result = materialize(assets, partition_key=orch.root, resources=orch.resources, instance=orch.instance)
    assert result.success
    assert _metadata(result, LINEAGE)["commits"] == 2
