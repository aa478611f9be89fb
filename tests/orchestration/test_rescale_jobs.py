"""The Dagster rescale and rollback jobs run the same operation as the CLI (real Dagster, in process)."""

from __future__ import annotations

from pathlib import Path

from statekeeper.orchestration.rescale_jobs import rescale_job, rollback_job
from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.key_groups import KeyGroupLayout
from tests.maintenance.test_offline_rescale import _history
from tests.store.test_rescale import GROUPS, OP, read_all


def test_rescale_and_rollback_jobs(tmp_path: Path) -> None:
    root = (tmp_path / "ckpt").as_uri()
    model = _history(root, partitions=2, batches=2)
    ops = {"rescale_op": {"config": {"root": root, "operator": OP, "partitions": 3, "idle_seconds": 0}}}
    result = rescale_job.execute_in_process(run_config={"ops": ops})
    assert result.success and result.output_for_node("rescale_op")["new_version"] == 3
    assert read_all(root, 3, KeyGroupLayout(3, GROUPS)) == model
    ops = {"rollback_op": {"config": {"root": root, "operator": OP, "to_version": 2, "idle_seconds": 0}}}
    assert rollback_job.execute_in_process(run_config={"ops": ops}).success
    record = CommitLog(open_file_manager(root)).get(4)
    assert record is not None and record.change == {OP: "rollback"}
