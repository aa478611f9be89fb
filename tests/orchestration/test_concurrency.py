"""One maintenance run per checkpoint root at a time: the run queue limit of orchestration/dagster.yaml."""

from __future__ import annotations

import shutil
from pathlib import Path

from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from dagster._utils.tags import TagConcurrencyLimitsCounter

from statekeeper.orchestration.assets import LINEAGE, SNAPSHOTS
from statekeeper.orchestration.jobs import JOB_NAMES
from tests.orchestration.conftest import Orch

REPO = Path(__file__).resolve().parents[2]


def test_one_run_per_root(tmp_path: Path, db_url: str) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "orchestration" / "dagster.yaml", home / "dagster.yaml")
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    orch = Orch([str(tmp_path / "a"), str(tmp_path / "b")], db_url)
    try:
        queue = instance.get_concurrency_config().run_queue_config
        assert queue is not None
        limits = list(queue.tag_concurrency_limits)
        assert {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
        orch.writer.commit(1)
        # every maintenance run carries its root as the partition tag
        a, b = orch.config.roots
        runs = []
        for asset, root in ((LINEAGE, a), (SNAPSHOTS, a), (LINEAGE, b)):
            job = orch.defs.resolve_job_def(JOB_NAMES[asset])
            result = job.execute_in_process(partition_key=root, instance=instance)
            assert result.success
            run = instance.get_run_by_id(result.run_id)
            assert run is not None and run.tags["dagster/partition"] == root
            runs.append(run)
        # with the first run of root a in progress, the queue holds the second one of a, not b's
        counter = TagConcurrencyLimitsCounter(limits, [runs[0]])
        assert counter.is_blocked(runs[1])
        assert not counter.is_blocked(runs[2])
    finally:
        orch.close()
        instance.dispose()
