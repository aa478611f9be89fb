"""The expiry and orphan-cleanup schedules: one run per root per tick (a fleet's expiry: one run), turned off by
configuration."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from dagster import AssetKey, RunRequest, ScheduleEvaluationContext, SkipReason, build_schedule_context
from dagster._core.storage.tags import PRIORITY_TAG

from statekeeper.orchestration.assets import RETAINED, ROOT_TAG
from statekeeper.orchestration.fleet import FLEET_JOB, FLEET_OP, FLEET_TAG
from statekeeper.orchestration.jobs import JOB_NAMES
from statekeeper.orchestration.schedules import EXPIRY_SCHEDULE, ORPHAN_SCHEDULE, VERIFY_SCHEDULE
from statekeeper.orchestration.verification import VERIFICATION_JOB
from statekeeper.store import CommitLog
from statekeeper.store.files import open_file_manager
from tests.orchestration.conftest import Orch


def ctx_at(orch: Orch, repo: Any, when: dt.datetime) -> ScheduleEvaluationContext:
    return build_schedule_context(instance=orch.instance, repository_def=repo, scheduled_execution_time=when)


def test_schedules_request_one_run_per_root(tmp_path: Path, db_url: str) -> None:
    orch = Orch([str(tmp_path / "a"), str(tmp_path / "b")], db_url, sensor_fleet_roots=0)
    try:
        repo = orch.defs.get_repository_def()
        when = dt.datetime(2025, 3, 1, 5, 0, tzinfo=dt.UTC)
        for name, job in ((EXPIRY_SCHEDULE, "expiry_job"), (ORPHAN_SCHEDULE, "orphan_cleanup_job")):
            sched = repo.get_schedule_def(name)
            assert sched.job_name == job and job in JOB_NAMES.values()
            data = sched.evaluate_tick(
                build_schedule_context(instance=orch.instance, repository_def=repo, scheduled_execution_time=when)
            )
            requests = list(data.run_requests or [])
            assert [r.partition_key for r in requests] == list(orch.config.roots)
            if name == EXPIRY_SCHEDULE:  # expiry alone: the loadability check is the verification schedule's
                assert all(r.asset_selection == [AssetKey(RETAINED)] and r.asset_check_keys == [] for r in requests)
            assert all(isinstance(r, RunRequest) and when.isoformat() in (r.run_key or "") for r in requests)
            assert len({r.run_key for r in requests}) == 2
            assert all(PRIORITY_TAG not in r.tags for r in requests), "queued, the sensor's runs go first"
            # the next tick has other run keys
            later = sched.evaluate_tick(
                build_schedule_context(
                    instance=orch.instance, repository_def=repo, scheduled_execution_time=when + dt.timedelta(hours=1)
                )
            )
            assert not {r.run_key for r in later.run_requests or []} & {r.run_key for r in requests}
        verify = repo.get_schedule_def(VERIFY_SCHEDULE)
        assert verify.job_name == VERIFICATION_JOB
        requests = list(verify.evaluate_tick(ctx_at(orch, repo, when)).run_requests or [])
        assert [(r.partition_key, r.tags[ROOT_TAG]) for r in requests] == [(None, root) for root in orch.config.roots]
        assert repo.get_schedule_def(EXPIRY_SCHEDULE).cron_schedule == "0 * * * *"
        assert verify.cron_schedule == "30 * * * *"  # half an hour from expiry: they never fire together
        assert repo.get_schedule_def(ORPHAN_SCHEDULE).cron_schedule == "30 3 * * *"
    finally:
        orch.close()


def test_schedules_turned_off(tmp_path: Path, db_url: str) -> None:
    orch = Orch([str(tmp_path / "a")], db_url, expiry_cron=None, verify_cron=None, orphan_cron="0 4 * * 1")
    try:
        repo = orch.defs.get_repository_def()
        ctx = build_schedule_context(
            instance=orch.instance, repository_def=repo, scheduled_execution_time=dt.datetime.now(dt.UTC)
        )
        off = repo.get_schedule_def(EXPIRY_SCHEDULE).evaluate_tick(ctx)
        assert not off.run_requests and off.skip_message and "STATEKEEPER_EXPIRY_SCHEDULE=off" in off.skip_message
        off = repo.get_schedule_def(VERIFY_SCHEDULE).evaluate_tick(ctx)
        assert not off.run_requests and off.skip_message and "STATEKEEPER_VERIFY_SCHEDULE=off" in off.skip_message
        on = repo.get_schedule_def(ORPHAN_SCHEDULE)
        assert on.cron_schedule == "0 4 * * 1"
        assert len(on.evaluate_tick(ctx).run_requests or []) == 1
        assert isinstance(SkipReason("x"), SkipReason)
    finally:
        orch.close()


def test_a_fleets_expiry_schedule_requests_one_run_for_every_root(tmp_path: Path, db_url: str) -> None:
    """At STATEKEEPER_SENSOR_FLEET_ROOTS roots or more (default 2), one fleet run an hour, not a run per root; it
    expires each root and records it as the root's partition of `retained_versions`."""
    roots = [tmp_path / name for name in "abc"]
    orch = Orch([str(r) for r in roots], db_url)
    try:
        repo = orch.defs.get_repository_def()
        sched = repo.get_schedule_def(EXPIRY_SCHEDULE)
        assert sched.job_name == FLEET_JOB and sched.cron_schedule == "0 * * * *"
        when = dt.datetime(2025, 3, 1, 5, 0, tzinfo=dt.UTC)
        (request,) = sched.evaluate_tick(ctx_at(orch, repo, when)).run_requests or []
        assert request.job_name in (None, FLEET_JOB) and when.isoformat() in (request.run_key or "")
        assert request.tags[FLEET_TAG] == "true"
        config = request.run_config["ops"][FLEET_OP]["config"]
        assert config["expire"] == sorted(orch.config.roots) and not config.get("snapshots")
        (later,) = sched.evaluate_tick(ctx_at(orch, repo, when + dt.timedelta(hours=1))).run_requests or []
        assert later.run_key != request.run_key
        for root in roots:  # one committed version each: nothing to expire, and a run that succeeds
            CommitLog(open_file_manager(str(root))).commit(1, {})
        result = orch.defs.resolve_job_def(FLEET_JOB).execute_in_process(
            run_config=request.run_config, tags=request.tags, instance=orch.instance
        )
        assert result.success
        assert orch.instance.get_materialized_partitions(AssetKey(RETAINED)) == set(orch.config.roots)
    finally:
        orch.close()
