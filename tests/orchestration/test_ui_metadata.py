"""What the Dagster UI shows is what the run found (issue 63), without a browser: chain lengths before and after a
run under keys of their own, equal to the maintenance report; the bounded chain check failing when the chains the
run found passed twice the threshold (whoever ran it: the asset's run, the loop); the checkpoint sensor's catalog
syncs as materializations of ``lineage_catalog``; rounded durations; the root's size and its worst stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    SensorResult,
    build_sensor_context,
)

from statekeeper.maintenance.loop import maintain
from statekeeper.orchestration.assets import LINEAGE, SNAPSHOTS
from statekeeper.orchestration.checks import CHAINS, CHAINS_BOUNDED, chain_check
from statekeeper.orchestration.external_runs import SENSOR_NAME as EXTERNAL_SENSOR
from statekeeper.orchestration.jobs import JOB_NAMES
from statekeeper.orchestration.sensors import SENSOR_NAME
from statekeeper.store.files import open_file_manager
from tests.orchestration.conftest import THRESHOLD, Orch

BOUND = 2 * THRESHOLD


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Orch]:
    """One local root (these tests are about the metadata, not the backend)."""
    o = Orch([(tmp_path / "ckpt").as_uri()], f"sqlite:///{tmp_path / 'catalog.db'}")
    yield o
    o.close()


def run_sensor(orch: Orch, name: str, cursor: str | None) -> SensorResult:
    sensor = orch.defs.get_repository_def().get_sensor_def(name)
    result = sensor(build_sensor_context(cursor=cursor, resources=orch.resources, instance=orch.instance))
    assert isinstance(result, SensorResult)
    return result


def values(metadata: Any) -> dict[str, Any]:
    return {k: v.value for k, v in metadata.items()}


def snapshot_run(orch: Orch) -> tuple[Any, dict[str, Any], dict[str, AssetCheckEvaluation]]:
    job = orch.defs.resolve_job_def(JOB_NAMES[SNAPSHOTS])
    result = job.execute_in_process(partition_key=orch.root, instance=orch.instance)
    assert result.success
    (mat,) = [e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(SNAPSHOTS)]
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    return result, values(mat.materialization.metadata), checks


def logged(orch: Orch, result: Any, text: str) -> str:
    """The message of the run's log line containing `text` (what the run's log shows in the UI)."""
    messages = [e.user_message for e in orch.instance.all_logs(result.run_id) if text in e.user_message]
    assert messages, text
    return str(messages[0])


@pytest.mark.parametrize(("commits", "passes"), [(BOUND, True), (BOUND + 1, False)])
def test_the_bounded_check_is_evaluated_on_the_chains_the_run_found(local: Orch, commits: int, passes: bool) -> None:
    local.writer.commit(commits)
    result, md, checks = snapshot_run(local)
    # the run's own numbers: what it found before building (its log says it) and what is left after
    assert md["max_chain_length_before"] == commits
    assert f"max_chain_length_before: {commits}," in logged(local, result, "max_chain_length_before")
    assert f"'max_chain_length': {commits}," in logged(local, result, "'snapshots': 2")
    assert md["max_chain_length_after"] == 0
    assert "max_chain_length" not in md, "one key per moment: no value the run overwrites"
    assert md["stores_over_twice_threshold_before"] == (0 if passes else 2)
    assert md["stores_over_twice_threshold_after"] == 0
    assert md["chain_length_limit"] == BOUND and md["snapshot_threshold"] == THRESHOLD

    bounded = checks[CHAINS_BOUNDED]
    assert bounded.passed is passes and bounded.severity == AssetCheckSeverity.ERROR
    chk = values(bounded.metadata)
    assert chk["max_chain_length_before"] == commits and chk["max_chain_length_after"] == 0
    # the warning is about what recovery replays after the run: nothing is left over the threshold
    assert checks[CHAINS].passed and checks[CHAINS].severity == AssetCheckSeverity.WARN


def test_snapshot_metadata_equals_the_report_and_the_catalog(local: Orch) -> None:
    local.writer.commit(THRESHOLD + 1)
    _, first, _ = snapshot_run(local)
    local.writer.commit(THRESHOLD + 2)
    _, md, _ = snapshot_run(local)
    assert set(md) == set(first), "the same keys on every materialization: one plotted series each"
    assert md["max_chain_length_before"] == THRESHOLD + 2
    # durations rounded for reading (no 16 decimals)
    for key in ("seconds", "asset_seconds", "snapshot_lag_seconds_max"):
        assert isinstance(md[key], float) and md[key] == round(md[key], 2), (key, md[key])
    # the root's size, as the catalog knows it now
    summary = local.catalog.summary(local.root)
    assert md["checkpoint_bytes"] == summary["present_bytes"] > 0
    assert md["checkpoint_files"] == summary["present_files"] > 0
    # the worst stores: each with its chain before and after the run
    rows = [r.data for r in md["worst_stores"].records]
    assert {r["store"] for r in rows} == {"agg/0", "agg/1"}
    assert [(r["chain_length_before"], r["chain_length"]) for r in rows] == [(THRESHOLD + 2, 0)] * 2, rows


def test_a_check_without_a_run_sees_the_chains_now(local: Orch) -> None:
    """Without a materialization in its run (the Checks tab), the bounded check reads the catalog's chains."""
    local.writer.commit(BOUND + 1)
    r = local.resources
    fm = r["storage"].file_manager(local.root)
    passed, md, severity = chain_check(CHAINS_BOUNDED, fm, r["catalog"], THRESHOLD)
    assert not passed and severity == AssetCheckSeverity.ERROR
    assert md["max_chain_length_after"].value == BOUND + 1 and "max_chain_length_before" not in md
    assert chain_check(CHAINS_BOUNDED, fm, r["catalog"], THRESHOLD + 1)[0]


def test_the_sensors_catalog_sync_is_a_materialization_of_the_lineage_catalog(local: Orch) -> None:
    def tick(cursor: str | None) -> SensorResult:
        result = run_sensor(local, SENSOR_NAME, cursor)
        for event in result.asset_events:  # what the daemon does with them
            local.instance.report_runless_asset_event(event)
        return result

    local.writer.commit(THRESHOLD - 1)
    first = tick(None)
    (event,) = first.asset_events
    assert isinstance(event, AssetMaterialization)
    assert event.asset_key == AssetKey(LINEAGE) and event.partition == local.root
    md = values(event.metadata)
    chains = local.catalog.chain_lengths(local.root)
    assert md["max_chain_length"] == max(c.chain_length for c in chains) == THRESHOLD - 1
    assert md["stores"] == len(chains) == 2 and md["commits"] == THRESHOLD - 1 and md["errors"] == 0
    assert md["checkpoint_bytes"] == local.catalog.summary(local.root)["present_bytes"] > 0
    assert md["synced_by"] == SENSOR_NAME and "worst_stores" in md
    latest = local.instance.get_latest_materialization_event(AssetKey(LINEAGE))
    assert latest is not None and latest.asset_materialization is not None
    assert latest.asset_materialization.partition == local.root, "no longer 'Never materialized'"

    # a tick with nothing new syncs nothing and reports nothing; the next commit is the next point
    second = tick(first.cursor)
    assert list(second.asset_events) == []
    local.writer.commit(1)
    (event,) = tick(second.cursor).asset_events
    assert values(event.metadata)["max_chain_length"] == THRESHOLD and values(event.metadata)["commits"] == 1


def test_a_loop_run_that_found_chains_past_the_bound_fails_the_check_though_it_reset_them(local: Orch) -> None:
    local.writer.commit(BOUND + 2)
    settings = local.resources["maintenance"].settings()
    # snapshots every store
    maintain(open_file_manager(local.root), settings, every=0.0, catalog=local.catalog, cycles=1)
    result = run_sensor(local, EXTERNAL_SENSOR, None)
    (snap,) = [
        e for e in result.asset_events if isinstance(e, AssetMaterialization) and e.asset_key == AssetKey(SNAPSHOTS)
    ]
    md = values(snap.metadata)
    assert md["max_chain_length_before"] == BOUND + 2 and md["max_chain_length_after"] == 0
    checks = {e.check_name: e for e in result.asset_events if isinstance(e, AssetCheckEvaluation)}
    assert not checks[CHAINS_BOUNDED].passed and checks[CHAINS].passed
