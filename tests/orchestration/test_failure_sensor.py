"""The run-failure sensor records failed maintenance runs in the catalog."""

from __future__ import annotations

from dagster import DagsterEventType, build_run_status_sensor_context

from statekeeper.orchestration.assets import LINEAGE, SNAPSHOTS
from statekeeper.orchestration.definitions import build_definitions
from statekeeper.orchestration.jobs import JOB_NAMES
from statekeeper.orchestration.resources import MaintenanceConfig
from statekeeper.orchestration.sensors import FAILURE_SENSOR_NAME, maintenance_kind, record_failed_run
from tests.orchestration.conftest import Orch


def _fail_and_sense(orch: Orch, job_name: str, partitioned: bool = True, **run_kw):
    job = orch.defs.resolve_job_def(job_name)
    if partitioned:
        run_kw["partition_key"] = orch.root
    result = job.execute_in_process(instance=orch.instance, raise_on_error=False, **run_kw)
    assert not result.success
    sense_failure(orch, result.run_id)
    return result.run_id


def sense_failure(orch: Orch, run_id: str) -> None:
    """The failure sensor, on the failure of run `run_id`."""
    records = orch.instance.get_records_for_run(run_id, of_type=DagsterEventType.RUN_FAILURE).records
    event = records[0].event_log_entry.dagster_event
    run = orch.instance.get_run_by_id(run_id)
    assert event is not None and run is not None
    sensor = orch.defs.get_repository_def().get_sensor_def(FAILURE_SENSOR_NAME)
    ctx = build_run_status_sensor_context(
        sensor_name=FAILURE_SENSOR_NAME,
        dagster_event=event,
        dagster_instance=orch.instance,
        dagster_run=run,
        resources=orch.resources,
    ).for_run_failure()
    sensor(ctx)


def test_run_that_failed_before_recording_gets_a_failed_row(tmp_path, db_url: str) -> None:
    orch = Orch([str(tmp_path / "root")], db_url)
    try:
        orch.writer.commit(2)
        # an invalid setting fails the snapshot run before its operation records anything
        orch.resources["maintenance"] = MaintenanceConfig(snapshot_threshold=0)
        orch.defs = build_definitions(orch.config, orch.resources)
        run_id = _fail_and_sense(orch, JOB_NAMES[SNAPSHOTS])
        runs = [r for r in orch.catalog.runs(orch.root) if r.orchestrator_run_id == run_id]
        assert len(runs) == 1
        assert runs[0].status == "failed" and runs[0].kind == "snapshot"
        assert "snapshot_threshold" in (runs[0].errors or "")
        assert runs[0].details and runs[0].details["recorded_by"] == FAILURE_SENSOR_NAME
    finally:
        orch.close()


def test_running_row_of_a_failed_run_is_marked_failed(tmp_path, db_url: str) -> None:
    orch = Orch([str(tmp_path / "root")], db_url)
    try:
        orch.writer.commit(2)
        path = orch.root.removeprefix("file://") + "/commits/00000000000000000002.commit"
        with open(path, "r+b") as f:  # corrupt a commit record: the sync reports it, the run fails
            f.seek(10)
            f.write(b"\xff\xff\xff")
        run_id = _fail_and_sense(orch, JOB_NAMES[LINEAGE])
        runs = [r for r in orch.catalog.runs(orch.root) if r.orchestrator_run_id == run_id]
        assert [r.status for r in runs] == ["failed"]  # recorded by the sync itself, not twice
        assert "00000000000000000002.commit" in (runs[0].errors or "")

        # a run killed while its catalog row said running: the sensor closes the row
        rid = orch.catalog.start_run(orch.root, "expire", orchestrator_run_id="dead-run")
        assert record_failed_run(orch.catalog, orch.root, "expire", "dead-run", "worker died") == [rid]
        row = next(r for r in orch.catalog.runs(orch.root) if r.id == rid)
        assert row.status == "failed" and "worker died" in (row.errors or "")
        # idempotent: a second report of the same failure adds nothing
        assert record_failed_run(orch.catalog, orch.root, "expire", "dead-run", "worker died") == []
    finally:
        orch.close()


def test_maintenance_kind(tmp_path, db_url: str) -> None:
    orch = Orch([str(tmp_path / "root")], db_url)
    try:
        result = orch.defs.resolve_job_def(JOB_NAMES[LINEAGE]).execute_in_process(
            partition_key=orch.root, instance=orch.instance
        )
        run = orch.instance.get_run_by_id(result.run_id)
        assert run is not None and maintenance_kind(run) == "catalog-sync"
    finally:
        orch.close()


def test_failed_verification_run_is_recorded_under_its_root(tmp_path, db_url: str) -> None:
    """A `verification_job` run has no partition: its root comes from its `statekeeper/root` tag."""
    from statekeeper.orchestration.verification import VERIFICATION_JOB, verification_request

    orch = Orch([str(tmp_path / "root")], db_url)
    try:
        orch.writer.commit(2)
        orch.resources["maintenance"] = MaintenanceConfig(min_versions_to_retain=0)  # refused: not a setting
        orch.defs = build_definitions(orch.config, orch.resources)
        request = verification_request(orch.root, "k", {})
        run_id = _fail_and_sense(
            orch, VERIFICATION_JOB, partitioned=False, run_config=request.run_config, tags=request.tags
        )
        (run,) = [r for r in orch.catalog.runs(orch.root) if r.orchestrator_run_id == run_id]
        assert (run.status, run.kind) == ("failed", "verify")
        assert "min_versions_to_retain" in (run.errors or "")
    finally:
        orch.close()
