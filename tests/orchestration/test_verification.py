"""The loadability check in `verification_job` runs: outside the root's run slot, recorded on the root's
partition of `retained_versions_loadable` (local and S3)."""

from __future__ import annotations

from typing import Any

from dagster import AssetCheckKey, AssetKey, DagsterRun
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.tags import PARTITION_NAME_TAG

from statekeeper.orchestration.assets import RETAINED, ROOT_TAG, SNAPSHOTS
from statekeeper.orchestration.checks import LOADABLE
from statekeeper.orchestration.jobs import JOB_NAMES, requested_job
from statekeeper.orchestration.schedules import EXPIRY_SCHEDULE, VERIFY_SCHEDULE
from statekeeper.orchestration.sensors import maintenance_kind
from statekeeper.orchestration.verification import VERIFICATION_JOB
from statekeeper.store.files import open_file_manager
from tests.orchestration.conftest import RETAIN, THRESHOLD, Orch
from tests.orchestration.test_schedules import ctx_at

LOADABLE_KEY = AssetCheckKey(AssetKey(RETAINED), LOADABLE)


def _scheduled(orch: Orch, name: str) -> tuple[Any, str]:
    """The schedule's one request (one root), and its job."""
    import datetime as dt

    schedule = orch.defs.get_repository_def().get_schedule_def(name)
    when = dt.datetime(2025, 3, 1, 5, 0, tzinfo=dt.UTC)
    (request,) = schedule.evaluate_tick(ctx_at(orch, orch.defs.get_repository_def(), when)).run_requests or []
    return request, schedule.job_name


def _run(orch: Orch, scheduled: tuple[Any, str]) -> Any:
    request, target = scheduled
    job = requested_job(orch.defs, request, target)
    result = job.execute_in_process(
        run_config=request.run_config,
        partition_key=request.partition_key,
        tags=request.tags,
        instance=orch.instance,
        raise_on_error=False,
    )
    assert result.success
    return result


def _latest(orch: Orch) -> Any:
    (record,) = orch.instance.event_log_storage.get_asset_check_execution_history(LOADABLE_KEY, limit=1)
    return record


def test_scheduled_verification_is_recorded_on_the_roots_partition_outside_its_slot(orch: Orch) -> None:
    orch.writer.commit(THRESHOLD)
    orch.defs.resolve_job_def(JOB_NAMES[SNAPSHOTS]).execute_in_process(partition_key=orch.root, instance=orch.instance)
    orch.writer.commit(RETAIN + 2)

    request, job = _scheduled(orch, VERIFY_SCHEDULE)
    assert job == VERIFICATION_JOB and request.partition_key is None
    assert request.tags[ROOT_TAG] == orch.root
    result = _run(orch, (request, job))
    run: DagsterRun = result.dagster_run
    # The per-root limit of orchestration/dagster.yaml keys on the partition tag: this run holds no slot.
    assert PARTITION_NAME_TAG not in run.tags and maintenance_kind(run) == "verify"
    (evaluation,) = result.get_asset_check_evaluations()
    assert (evaluation.check_name, evaluation.partition, evaluation.passed) == (LOADABLE, orch.root, True)
    record = _latest(orch)
    assert record.partition == orch.root and record.status == AssetCheckExecutionRecordStatus.SUCCEEDED
    verified = {k: v.value for k, v in evaluation.metadata.items()}
    assert verified["errors"] == 0 and verified["versions"] == 2 * RETAIN

    # A retained changelog lost: the next verification fails on the root's partition, naming it.
    fm = open_file_manager(orch.root)
    lost = max(i.path for i in fm.list("state/agg/00001/changelogs/"))  # the newest version's
    fm.delete_many([lost])
    (failed,) = _run(orch, _scheduled(orch, VERIFY_SCHEDULE)).get_asset_check_evaluations()
    assert not failed.passed and lost in str(failed.metadata["first_errors"].value)
    assert _latest(orch).status == AssetCheckExecutionRecordStatus.FAILED


def test_the_expiry_schedule_expires_without_the_check(orch: Orch) -> None:
    """Its runs hold the root's slot: the verification that used to run in them is the verification schedule's."""
    orch.writer.commit(THRESHOLD)
    orch.defs.resolve_job_def(JOB_NAMES[SNAPSHOTS]).execute_in_process(partition_key=orch.root, instance=orch.instance)
    orch.writer.commit(RETAIN + 2)
    request, job = _scheduled(orch, EXPIRY_SCHEDULE)
    assert request.partition_key == orch.root  # in the root's slot
    result = _run(orch, (request, job))
    assert not result.get_asset_check_evaluations()
    (mat,) = result.get_asset_materialization_events()
    assert mat.asset_key == AssetKey(RETAINED) and mat.materialization.metadata["files"].value > 0


def test_the_deployed_queue_starts_a_verification_beside_the_roots_maintenance_run(orch: Orch, tmp_path: Any) -> None:
    """Dagster's own queue rule (`TagConcurrencyLimitsCounter`) over the instance `make run` deploys: with a
    snapshot run of the root in progress, another maintenance run of the root waits, a verification does not."""
    from dagster import DagsterInstance
    from dagster._utils.tags import TagConcurrencyLimitsCounter

    from statekeeper.orchestration.run_local import prepare_home

    orch.writer.commit(THRESHOLD)
    snapshot = orch.defs.resolve_job_def(JOB_NAMES[SNAPSHOTS])
    in_progress = snapshot.execute_in_process(partition_key=orch.root, instance=orch.instance).dagster_run
    another = snapshot.execute_in_process(partition_key=orch.root, instance=orch.instance).dagster_run
    verification = _run(orch, _scheduled(orch, VERIFY_SCHEDULE)).dagster_run
    with DagsterInstance.from_config(str(prepare_home(tmp_path / "home"))) as deployed:
        queue = deployed.get_concurrency_config().run_queue_config
        assert queue is not None
        counter = TagConcurrencyLimitsCounter(list(queue.tag_concurrency_limits), [in_progress])
    assert counter.is_blocked(another)
    assert not counter.is_blocked(verification)
