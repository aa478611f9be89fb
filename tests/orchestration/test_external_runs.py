"""The external-maintenance sensor: the `statekeeper maintain` loop's runs, recorded in the catalog, reported as the
roots' materializations and chain checks in Dagster (local and S3), once each, and never Dagster's own runs."""

from __future__ import annotations

from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    SensorResult,
    build_sensor_context,
)

from statekeeper.maintenance.loop import maintain
from statekeeper.orchestration.assets import ORPHANS, RETAINED, SNAPSHOTS
from statekeeper.orchestration.checks import CHAINS, CHAINS_BOUNDED
from statekeeper.orchestration.external_runs import SENSOR_NAME, ExternalCursor
from statekeeper.store.files import open_file_manager
from statekeeper.store.layout import StoreId
from tests.orchestration.conftest import THRESHOLD, Orch


def tick(orch: Orch, cursor: str | None) -> SensorResult:
    sensor = orch.defs.get_repository_def().get_sensor_def(SENSOR_NAME)
    result = sensor(build_sensor_context(cursor=cursor, resources=orch.resources, instance=orch.instance))
    assert isinstance(result, SensorResult)
    return result


def by_asset(result: SensorResult) -> dict[str, Any]:
    return {
        e.asset_key.to_user_string(): e
        for e in result.asset_events
        if isinstance(e, AssetMaterialization | AssetObservation)
    }


def checks(result: SensorResult) -> dict[str, AssetCheckEvaluation]:
    return {e.check_name: e for e in result.asset_events if isinstance(e, AssetCheckEvaluation)}


def value(event: Any, key: str) -> Any:
    return event.metadata[key].value


def loop_cycle(orch: Orch, stores: list[StoreId] | None = None) -> None:
    settings = orch.resources["maintenance"].settings()
    maintain(open_file_manager(orch.root), settings, every=0.0, catalog=orch.catalog, cycles=1, stores=stores)


def test_the_loops_runs_are_reported_once_as_the_roots_materializations_and_checks(orch: Orch) -> None:
    orch.writer.commit(THRESHOLD + 2)
    loop_cycle(orch)  # expiry, snapshots of both stores, orphans: three catalog runs, no orchestrator run id

    first = tick(orch, None)
    assert first.cursor is not None
    events = by_asset(first)
    assert set(events) == {RETAINED, SNAPSHOTS, ORPHANS}
    snap = events[SNAPSHOTS]
    assert isinstance(snap, AssetMaterialization) and snap.partition == orch.root
    assert value(snap, "runs") == 1 and value(snap, "failed_runs") == 0
    assert value(snap, "snapshots") == 2
    assert value(snap, "stores") == 2  # the root's stores (as an asset run reports them), not a sum over runs
    assert value(snap, "max_chain_length_after") == 0
    assert value(snap, "chain_length/agg/0") == 0 and "snapshot_lag_seconds/agg/1" in snap.metadata
    found = checks(first)
    assert set(found) == {CHAINS, CHAINS_BOUNDED}
    assert all(c.passed and c.partition == orch.root for c in found.values())
    for event in first.asset_events:  # what the daemon does with them: Dagster takes each for the root's partition
        orch.instance.report_runless_asset_event(event)
    latest = orch.instance.get_latest_materialization_event(AssetKey(SNAPSHOTS))
    assert latest is not None and latest.asset_materialization is not None
    assert latest.asset_materialization.partition == orch.root

    # nothing new: nothing reported again
    again = tick(orch, first.cursor)
    assert list(again.asset_events) == []

    # two cycles more: one materialization per asset for both, with the runs' counts summed
    orch.writer.commit(THRESHOLD)
    loop_cycle(orch)
    orch.writer.commit(THRESHOLD)
    loop_cycle(orch)
    later = tick(orch, again.cursor)
    snap = by_asset(later)[SNAPSHOTS]
    assert value(snap, "runs") == 2 and value(snap, "snapshots") == 4
    assert value(by_asset(later)[RETAINED], "runs") == 2


def test_dagster_runs_and_dry_runs_are_not_reported_and_running_ones_wait(orch: Orch) -> None:
    orch.writer.commit(2)
    cursor = tick(orch, None).cursor
    cat = orch.catalog
    dagster_run = cat.start_run(orch.root, "snapshot", orchestrator_run_id="a-dagster-run")
    cat.finish_run(dagster_run, details={"snapshots": 1})
    dry = cat.start_run(orch.root, "expire", dry_run=True)
    cat.finish_run(dry)
    running = cat.start_run(orch.root, "expire")
    later = cat.start_run(orch.root, "clean-orphans")
    cat.finish_run(later, files=3)

    result = tick(orch, cursor)
    assert set(by_asset(result)) == {ORPHANS}  # the running expiry waits, Dagster's run and the dry run are skipped
    assert value(by_asset(result)[ORPHANS], "files") == 3
    assert ExternalCursor.parse(result.cursor).pending == {orch.root: [running]}

    cat.finish_run(running, status="failed", errors=["bucket unreachable"])
    result = tick(orch, result.cursor)
    expiry = by_asset(result)[RETAINED]
    assert isinstance(expiry, AssetObservation)  # every run of it failed: nothing materialized, the errors shown
    assert value(expiry, "failed_runs") == 1 and "bucket unreachable" in value(expiry, "errors_text")
    assert ExternalCursor.parse(result.cursor).pending == {}
    assert list(tick(orch, result.cursor).asset_events) == []


def test_a_loop_that_falls_behind_fails_the_bounded_chain_check(orch: Orch) -> None:
    orch.writer.commit(2 * THRESHOLD + 2)
    loop_cycle(orch, stores=[StoreId("agg", 0)])  # partition 1 keeps its chain of 2 x threshold + 2

    found = checks(tick(orch, None))
    assert not found[CHAINS_BOUNDED].passed and not found[CHAINS].passed
    assert found[CHAINS_BOUNDED].metadata["stores_over_limit"].value == 1


def test_numbers_that_describe_the_root_are_the_newest_runs_not_a_sum(orch: Orch) -> None:
    orch.writer.commit(2)
    cursor = tick(orch, None).cursor
    fm = open_file_manager(orch.root)
    with fm.create("notes/README.txt") as out:  # someone else's file: reported by every run, never deleted
        out.write(b"not ours")
    loop_cycle(orch)
    loop_cycle(orch)

    orphans = by_asset(tick(orch, cursor))[ORPHANS]
    assert value(orphans, "runs") == 2
    assert value(orphans, "foreign_files") == 1, "one foreign file under the root, however many runs saw it"
    assert value(orphans, "kept_in_flight") == 0
