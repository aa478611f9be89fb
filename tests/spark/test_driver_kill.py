"""kill -9 of the driver mid-batch, then restart from the checkpoint: same final state, no lost or
doubled update. Two kills: after the tasks committed but before the commit record (the batch is re-run
and re-applied from its committed version), and after the commit record but before Spark's own commit
(the re-run must not apply the batch again; its output is delivered again)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store import CheckpointFileManager, CommitLog, open_file_manager
from statekeeper.store.layout import StoreId
from testkit.spark import ROOT, spark_env
from tests.spark.helpers import reference, state_of, write_inputs

pytestmark = pytest.mark.slow


def _start(args: list[str], log: Path, module: str = "tests.spark.driver_job") -> subprocess.Popen[bytes]:
    env = {**os.environ, **spark_env()}
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill_when(proc: subprocess.Popen[bytes], cond: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the job ended (rc={proc.returncode}) before the kill point")
        if cond():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            return
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the kill point was never reached")


class KillPoints:
    """Where a driver-kill test kills: read from the state root, the job's output and Spark's checkpoint."""

    def __init__(self, fm: CheckpointFileManager, operator: str, partitions: int, out: Path, ckpt: Path) -> None:
        self.fm = fm
        self.commits = CommitLog(fm)
        self.operator = operator
        self.partitions = partitions
        self.out = out
        self.ckpt = ckpt

    def changelogs(self, version: int) -> int:
        return sum(
            1
            for p in range(self.partitions)
            for f in self.fm.list(StoreId(self.operator, p).changelog_dir())
            if f.path.rsplit("/", 1)[-1].startswith(f"{version:020d}_")
        )

    def tasks_committed_but_no_record(self) -> bool:
        latest = self.commits.latest()
        return (
            latest >= 2 and self.changelogs(latest + 1) >= 1 and self.commits.get(latest + 1, use_cache=False) is None
        )

    def delivered(self, batch: int) -> int:
        path = self.out / "deliveries.log"
        lines = path.read_text().split("\n") if path.exists() else []
        return sum(1 for line in lines if line.split(" ")[0] == str(batch))

    def record_but_no_spark_commit(self, after: int) -> bool:
        """Our commit record of a version past `after` exists, its batch was delivered once, Spark's
        commit of that batch is not written yet."""
        latest = self.commits.latest()
        return (
            latest > after
            and self.delivered(latest - 1) == 1
            and not (self.ckpt / "commits" / str(latest - 1)).exists()
        )


def test_driver_killed_mid_batch_and_restarted(spark: Any, tmp_path: Path) -> None:
    batches = write_inputs(tmp_path / "in", files=6, rows=300, keys=40, seed=21)
    root = (tmp_path / "state").as_uri()
    ckpt = tmp_path / "spark-ckpt"
    out = tmp_path / "out"
    log = tmp_path / "job.log"
    fm = open_file_manager(root)
    commits = CommitLog(fm)

    points = KillPoints(fm, "counts", 3, out, ckpt)
    args = [str(tmp_path / "in"), root, str(ckpt), str(out)]
    # 1) kill after some tasks committed version k+1, before the driver's commit record
    _kill_when(_start([*args, "1.0", "0.0"], log), points.tasks_committed_but_no_record)
    killed_at_1 = commits.latest()
    delivered = points.delivered
    # 2) kill after our commit record of version k+1 and the sink got batch k, before Spark's commit of k
    _kill_when(_start([*args, "0.0", "1.5"], log), lambda: points.record_but_no_spark_commit(killed_at_1 + 1))
    killed_at_2 = commits.latest()
    assert not (ckpt / "commits" / str(killed_at_2 - 1)).exists()

    # 3) run to the end
    proc = _start([*args, "0.0", "0.0"], log)
    assert proc.wait(240) == 0, log.read_text()[-3000:]

    expected = reference(batches)
    assert commits.latest() == len(batches)
    assert state_of(spark, root, "counts") == expected
    for v in range(1, len(batches) + 1):  # every committed version is exactly the prefix of batches
        assert state_of(spark, root, "counts", version=v) == reference(batches[:v])
    for b, batch in enumerate(batches):  # every batch's output (first or re-delivered) is right
        running = reference(batches[: b + 1])
        got = {r[0]: tuple(r[1:]) for r in json.loads((out / f"batch-{b:05d}.json").read_text())}
        assert got == {u: running[u] for u, _ in batch}
    assert delivered(killed_at_2 - 1) == 2, "the batch committed before the second kill is delivered again"
    assert '"mode": "replay"' in log.read_text()
