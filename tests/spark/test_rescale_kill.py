"""kill -9 of the job during an online rescale (3 -> 5 partitions at restart, the new partitions built by
the executors), then restart (DESIGN invariant 11): killed before, among or after the new partitions'
files and around the commit record that names the new layout, the checkpoint holds the old layout or the
new one, never a mix; the restart finishes the rescale and the batches, every batch is delivered exactly
once and the state equals the reference."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.spark import StatefulOperator
from testkit.processors import SlowCountSum
from tests.spark.driver_job import file_sink
from tests.spark.helpers import reference, run_query, stage_files, state_of, write_inputs
from tests.spark.test_driver_kill import _start
from tests.spark.test_rescale import OUT, _owned_groups_only

pytestmark = pytest.mark.slow

KILL_POINTS = [
    "local.put_file:state/:1",  # in an executor: before the first file of a new partition is published
    "local.put_file:state/:3",  # in an executor: some new partitions' files published, not all
    "local.publish:commits/:1",  # in the driver: every changelog published, the commit record not
    "local.published:commits/:1",  # the commit record naming the new layout is visible
]


def _run(args: list[str], log: Path, partitions: int, kill_at: str = "") -> int:
    os.environ["JOB_PARTITIONS"], os.environ["JOB_KILL_AT"] = str(partitions), kill_at
    try:
        proc = _start(args, log)
    finally:
        del os.environ["JOB_PARTITIONS"], os.environ["JOB_KILL_AT"]
    return proc.wait(600)


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("kill_at", KILL_POINTS)
def test_driver_killed_during_an_online_rescale(spark: Any, tmp_path: Path, kill_at: str) -> None:
    batches = write_inputs(tmp_path / "all", files=4, rows=200, keys=40, seed=5)
    root = (tmp_path / "state").as_uri()
    ckpt, out, log = tmp_path / "spark-ckpt", tmp_path / "out", tmp_path / "job.log"
    args = [str(tmp_path / "in"), root, str(ckpt), str(out), "0.0", "0.0"]
    commits = CommitLog(open_file_manager(root))

    stage_files(tmp_path / "all", tmp_path / "in", range(2))  # batches 0, 1 on 3 partitions, in this process
    sink = file_sink(str(out), "0")
    op = StatefulOperator(root, "counts", "user", SlowCountSum(0.0), OUT, num_partitions=3, sink=sink)
    run_query(spark, op, tmp_path / "in", ckpt)
    assert commits.latest() == 2
    stage_files(tmp_path / "all", tmp_path / "in", range(2, 4))
    assert _run(args, log, 5, kill_at) != 0, "the kill point was never reached"
    latest = commits.latest()
    record = commits.get(latest, use_cache=False)
    assert record is not None
    partitions = len(record.checkpoint_ids["counts"])
    assert (latest, partitions) in ((2, 3), (3, 5)), "the old layout or the new one"
    assert state_of(spark, root, "counts") == reference(batches[:2])
    _owned_groups_only(root, "counts")

    assert _run(args, log, 5) == 0, log.read_text()[-3000:]
    final = commits.get(commits.latest(), use_cache=False)
    assert final is not None and final.batch == 3 and len(final.checkpoint_ids["counts"]) == 5
    assert state_of(spark, root, "counts") == reference(batches)
    _owned_groups_only(root, "counts")
    deliveries = (out / "deliveries.log").read_text().split()[::2]
    assert sorted(deliveries) == ["0", "1", "2", "3"], "every batch delivered exactly once"
    for b, batch in enumerate(batches):
        running = reference(batches[: b + 1])
        got = {r[0]: tuple(r[1:]) for r in json.loads((out / f"batch-{b:05d}.json").read_text())}
        assert got == {u: running[u] for u, _ in batch}
