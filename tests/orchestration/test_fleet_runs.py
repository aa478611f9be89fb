"""The checkpoint sensor's fleet run: one run for the roots a tick found work in, each reported as its own
partition of the assets and checks; a run per root when one root has work or fleet runs are off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagster import AssetKey, DagsterEventType, DagsterRunStatus, RunRequest

from statekeeper.orchestration.assets import RETAINED, SNAPSHOTS
from statekeeper.orchestration.checks import CHAINS, CHAINS_BOUNDED
from statekeeper.orchestration.fleet import FLEET_JOB, FLEET_OP, FLEET_TAG, fleet_request
from statekeeper.orchestration.jobs import JOB_NAMES, requested_job
from statekeeper.orchestration.sensors import SensorCursor
from statekeeper.store.files import open_file_manager
from tests.orchestration.conftest import RETAIN, THRESHOLD, Orch
from tests.orchestration.helpers import CheckpointWriter
from tests.orchestration.test_failure_sensor import sense_failure
from tests.orchestration.test_sensors import tick


class Fleet:
    """Definitions over roots a, b and c (c stays empty), a writer on a and one on b."""

    def __init__(self, tmp_path: Path, db_url: str, **config: Any) -> None:
        self.orch = Orch([str(tmp_path / name) for name in "abc"], db_url, **config)
        self.a, self.b, self.c = self.orch.config.roots
        self.writers = {self.a: self.orch.writer, self.b: CheckpointWriter(str(tmp_path / "b"))}
        self.cursor: str | None = None

    def commit(self, batches: int, *roots: str) -> None:
        for root in roots:
            self.writers[root].commit(batches)

    def tick(self) -> list[RunRequest]:
        result = tick(self.orch, self.cursor)
        self.cursor = result.cursor
        return list(result.run_requests or [])

    def run(self, request: RunRequest, **kw: Any) -> Any:
        """The run the daemon launches for `request`."""
        return requested_job(self.orch.defs, request).execute_in_process(
            run_config=request.run_config,
            partition_key=request.partition_key,
            tags=request.tags,
            instance=self.orch.instance,
            **kw,
        )

    def close(self) -> None:
        self.writers[self.b].close()
        self.orch.close()


def _materialized(result: Any, asset: str) -> dict[str, dict[str, Any]]:
    return {
        e.partition: e.materialization.metadata
        for e in result.get_asset_materialization_events()
        if e.asset_key == AssetKey(asset)
    }


def test_work_in_several_roots_is_one_run_that_reports_each_root_as_its_partition(tmp_path: Path, db_url: str) -> None:
    fleet = Fleet(tmp_path, db_url)
    orch = fleet.orch
    try:
        assert fleet.tick() == []  # every root enters the catalog
        fleet.commit(THRESHOLD, fleet.a, fleet.b)
        (req,) = fleet.tick()
        assert req.job_name == FLEET_JOB and req.partition_key is None and req.tags[FLEET_TAG] == "true"
        crossings = [f"agg/0@{THRESHOLD}", f"agg/1@{THRESHOLD}"]
        assert req.run_config["ops"][FLEET_OP]["config"] == {
            "snapshots": {fleet.a: crossings, fleet.b: crossings},
            "expire": [],
        }
        result = fleet.run(req)
        assert result.success
        snapshots = _materialized(result, SNAPSHOTS)
        assert set(snapshots) == {fleet.a, fleet.b}  # the idle root c is not touched
        for root in (fleet.a, fleet.b):
            md = snapshots[root]
            assert md["stores"].value == 2 and md["max_chain_length_after"].value == 0
            assert md["chain_length/agg/0"].value == 0  # the per-store series the UI plots
            assert {c.chain_length for c in orch.catalog.chain_lengths(root)} == {0}
            assert {c.snapshot_version for c in orch.catalog.chain_lengths(root)} == {THRESHOLD}
        checks = {(e.check_name, e.partition): e.passed for e in result.get_asset_check_evaluations()}
        assert checks == {(name, root): True for name in (CHAINS, CHAINS_BOUNDED) for root in (fleet.a, fleet.b)}
        assert orch.instance.get_materialized_partitions(AssetKey(SNAPSHOTS)) == {fleet.a, fleet.b}
        assert fleet.tick() == [], "each crossing is requested once"

        # both bases move: one run expires both roots (and snapshots nothing)
        fleet.commit(RETAIN - 1, fleet.a, fleet.b)
        (req,) = fleet.tick()
        assert req.job_name == FLEET_JOB
        assert req.run_config["ops"][FLEET_OP]["config"] == {"snapshots": {}, "expire": sorted([fleet.a, fleet.b])}
        result = fleet.run(req)
        assert result.success and _materialized(result, SNAPSHOTS) == {}
        expired = _materialized(result, RETAINED)
        assert set(expired) == {fleet.a, fleet.b}
        assert all(md["changelogs"].value == 2 * THRESHOLD for md in expired.values())
        assert result.get_asset_check_evaluations() == []
        state = SensorCursor.parse(fleet.cursor)
        assert state.roots[fleet.a].bases == state.roots[fleet.b].bases == {"agg/0": THRESHOLD, "agg/1": THRESHOLD}
    finally:
        fleet.close()


def test_one_root_with_work_gets_its_own_run_and_fleet_runs_can_be_turned_off(tmp_path: Path, db_url: str) -> None:
    fleet = Fleet(tmp_path, db_url)
    try:
        fleet.tick()
        fleet.commit(THRESHOLD, fleet.a)
        (req,) = fleet.tick()
        assert req.job_name == JOB_NAMES[SNAPSHOTS] and req.partition_key == fleet.a
    finally:
        fleet.close()
    off = Fleet(tmp_path / "off", db_url.replace("catalog.db", "off.db"), sensor_fleet_roots=0)
    try:
        off.tick()
        off.commit(THRESHOLD, off.a, off.b)
        requests = off.tick()
        assert sorted((r.job_name, r.partition_key) for r in requests) == [
            (JOB_NAMES[SNAPSHOTS], off.a),
            (JOB_NAMES[SNAPSHOTS], off.b),
        ]
    finally:
        off.close()


def test_a_pending_fleet_run_holds_every_root_and_a_started_one_takes_the_next_work(
    tmp_path: Path, db_url: str
) -> None:
    fleet = Fleet(tmp_path, db_url)
    orch = fleet.orch
    try:
        fleet.tick()
        job = orch.defs.resolve_job_def(FLEET_JOB)
        earlier = fleet_request(
            {fleet.c: ([], ["agg/0@1"])}, "fleet:earlier", {"statekeeper/trigger": "checkpoint_sensor"}
        )
        queued = orch.instance.create_run_for_job(
            job, run_config=earlier.run_config, tags=earlier.tags, status=DagsterRunStatus.NOT_STARTED
        )
        fleet.commit(THRESHOLD, fleet.a)
        assert fleet.tick() == [], "root a waits for the queued fleet run to start"
        orch.instance.report_run_failed(queued)  # no longer pending
        (req,) = fleet.tick()
        assert req.job_name == JOB_NAMES[SNAPSHOTS] and req.partition_key == fleet.a  # asked for once it can run
        started = orch.instance.create_run_for_job(
            job, run_config=earlier.run_config, tags=earlier.tags, status=DagsterRunStatus.STARTED
        )
        fleet.commit(THRESHOLD, fleet.b)
        (req,) = fleet.tick()
        assert req.job_name == FLEET_JOB, "while a fleet run works, the next one takes even a single root"
        assert set(req.run_config["ops"][FLEET_OP]["config"]["snapshots"]) == {fleet.b}
        orch.instance.report_run_failed(started)
    finally:
        fleet.close()


def test_a_failed_root_does_not_stop_the_others_and_each_is_recorded(tmp_path: Path, db_url: str) -> None:
    fleet = Fleet(tmp_path, db_url)
    orch = fleet.orch
    try:
        fleet.commit(THRESHOLD, fleet.a)
        gone = (tmp_path / "not-configured").as_uri()
        req = fleet_request({fleet.a: ([f"agg/0@{THRESHOLD}"], []), gone: ([], ["agg/0@1"])}, "fleet:gone", {})
        result = fleet.run(req, raise_on_error=False)
        assert not result.success
        assert orch.instance.get_materialized_partitions(AssetKey(SNAPSHOTS)) == {fleet.a}, (
            "a was maintained all the same"
        )
        (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
        assert gone in failure.step_failure_data.error.message and "not a configured checkpoint root" in str(
            failure.step_failure_data.user_failure_data.metadata["failed_roots"].value
        )
        # the failure sensor: root a's run succeeded (kept), the other root gets a failed row
        sense_failure(orch, result.run_id)
        mine = [r for r in orch.catalog.runs(fleet.a) if r.orchestrator_run_id == result.run_id]
        assert [(r.kind, r.status) for r in mine] == [("snapshot", "succeeded")]
        (row,) = [r for r in orch.catalog.runs(gone) if r.orchestrator_run_id == result.run_id]
        assert row.status == "failed" and "not a configured checkpoint root" in (row.errors or "")
    finally:
        fleet.close()


def test_a_fleet_run_and_a_root_run_on_the_same_store_at_once_keep_to_its_lease(tmp_path: Path, db_url: str) -> None:
    """A fleet run does not take the roots' run slots, so a schedule's or an operator's run of root a may work on
    a's stores meanwhile (held here: the lease of agg/0, as that run holds it). The catalog lease keeps the fleet
    run off that store: a's other store and root b are snapshotted, agg/0 of a is not touched and the run fails
    naming it, and the next fleet run, once the lease is free, snapshots it; no store gets two snapshots."""
    from statekeeper.maintenance.leasing import store_lease
    from statekeeper.store.layout import StoreId

    fleet = Fleet(tmp_path, db_url)
    orch = fleet.orch
    try:
        fleet.tick()
        fleet.commit(THRESHOLD, fleet.a, fleet.b)
        (req,) = fleet.tick()
        settings = orch.resources["maintenance"].settings()
        with store_lease(open_file_manager(fleet.a), StoreId("agg", 0), settings, orch.catalog):
            result = fleet.run(req, raise_on_error=False)
        assert not result.success
        failure = next(e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE)
        assert fleet.a in str(failure.event_specific_data) and fleet.b not in str(failure.event_specific_data)
        chains = {(c.operator, c.partition): c.snapshot_version for c in orch.catalog.chain_lengths(fleet.a)}
        assert chains == {("agg", 0): None, ("agg", 1): THRESHOLD}, "the held store was left alone"
        assert {c.snapshot_version for c in orch.catalog.chain_lengths(fleet.b)} == {THRESHOLD}
        again = fleet.run(req)  # the lease is free: the same request again (the next tick's run does the same)
        assert again.success
        assert {c.snapshot_version for c in orch.catalog.chain_lengths(fleet.a)} == {THRESHOLD}
        for root in (fleet.a, fleet.b):
            manifests = [p for p in _files(root) if p.endswith(".manifest")]
            assert len(manifests) == 2, manifests  # one per store, none written twice
    finally:
        fleet.close()


def _files(root: str) -> list[str]:
    return [i.path for i in open_file_manager(root).list("")]


def test_a_roots_step_that_failed_part_way_reports_what_it_did(tmp_path: Path, db_url: str) -> None:
    from statekeeper.maintenance.snapshot_builds import create_snapshots

    fleet = Fleet(tmp_path, db_url)
    orch = fleet.orch
    try:
        fleet.commit(THRESHOLD, fleet.a)
        fm = open_file_manager(fleet.a)
        create_snapshots(fm, orch.resources["maintenance"].settings())
        fleet.commit(RETAIN + 1, fleet.a)
        with fm.create("state/agg/00001/notes.txt") as out:  # a foreign file: store agg/1 is left untouched
            out.write(b"not ours")
        before = {i.path for i in fm.list("")}
        result = fleet.run(fleet_request({fleet.a: ([], ["agg/0@1"])}, "fleet:part-way", {}), raise_on_error=False)
        assert not result.success
        gone = before - {i.path for i in fm.list("")}
        assert gone and not any(p.startswith("state/agg/00001/") for p in gone), "agg/0 was expired all the same"
        (record,) = orch.instance.fetch_observations(AssetKey(RETAINED), limit=5).records
        seen = record.asset_observation
        assert seen is not None and record.run_id == result.run_id
        assert seen.asset_key == AssetKey(RETAINED) and seen.partition == fleet.a
        assert seen.metadata["files"].value == len(gone), "the files the step deleted before it failed"
        assert seen.metadata["blocked_stores"].value == 1 and "notes.txt" in str(seen.metadata["errors_text"].value)
    finally:
        fleet.close()
