"""The stateful operator on a real Spark standalone cluster (a master and two one-core workers).

The driver of each application runs in its own process (`tests.spark.cluster_job`); the executors are
JVMs the workers start, each with its own Python workers and its own warm stores. Checked: results equal
the batch-computed reference; partitions run on both executors and on the fresh executors of a restarted
application, loading their state from the checkpoint; an executor killed with SIGKILL mid-batch is
retried by Spark with exactly-once state, in sync and async mode, on local disk and on S3.
"""

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

from statekeeper.store import CommitLog, open_file_manager
from testkit.spark import ROOT, StandaloneCluster, spark_env
from tests.spark.helpers import read_batch_output, reference, write_inputs

S3_ENV_PREFIXES = ("AWS_", "STATEKEEPER_S3_")


class ClusterRun:
    """One application of `tests.spark.cluster_job` on the cluster, with the files it leaves."""

    def __init__(self, cluster: StandaloneCluster, work: Path, root: str, **settings: Any) -> None:
        self.cluster, self.work, self.root = cluster, work, root
        self.out, self.markers = work / "out", work / "markers"
        env_for_executors = {k: v for k, v in os.environ.items() if k.startswith(S3_ENV_PREFIXES)}
        conf = cluster.session_conf(work / "local")
        conf.update({f"spark.executorEnv.{k}": v for k, v in env_for_executors.items()})
        self.settings = {
            "conf": conf,
            "input": str(work / "in"),
            "root": root,
            "checkpoint": str(work / "spark-ckpt"),
            "out": str(self.out),
            "markers": str(self.markers),
            **settings,
        }
        self.log = work / "driver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ClusterRun:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.cluster_job", json.dumps(self.settings)],
            cwd=ROOT,
            env={**os.environ, **spark_env()},
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        return self

    def wait(self, timeout: float = 420) -> None:
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the cluster job did not finish in {timeout}s:\n{self.tail()}") from None
        assert rc == 0, f"the cluster job failed ({rc}):\n{self.tail()}"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def progress(self) -> list[dict[str, Any]]:
        path = self.out / "progress.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def executor_of_worker(self) -> dict[int, int]:
        """Python worker pid -> executor JVM pid, from the task markers."""
        out = {}
        for marker in self.markers.iterdir() if self.markers.exists() else ():
            _, executor, worker, _ = marker.name.split("-")
            out[int(worker)] = int(executor)
        return out

    def state(self) -> dict[str, tuple[int, int]]:
        return {k: tuple(v) for k, v in json.loads((self.out / "state.json").read_text()).items()}

    def batch_output(self, batch_id: int) -> dict[str, tuple[int, int]]:
        return read_batch_output(self.out, batch_id)


def _assert_exactly_once(run: ClusterRun, batches: list[list[tuple[str, int]]], first_batch: int = 0) -> None:
    expected = reference(batches)
    assert CommitLog(open_file_manager(run.root)).latest() == len(batches)
    assert run.state() == expected
    for b in range(first_batch, len(batches)):  # every batch's output is the running total of its keys
        running = reference(batches[: b + 1])
        assert run.batch_output(b) == {u: running[u] for u, _ in batches[b]}


def _executors_per_partition(run: ClusterRun) -> dict[int, set[int]]:
    by_worker = run.executor_of_worker()
    out: dict[int, set[int]] = {}
    for progress in run.progress():
        for m in progress["partitions"]:
            out.setdefault(m["partition"], set()).add(by_worker.get(m["worker_pid"], 0))
    return out


def test_cluster_results_equal_the_batch_reference(spark_cluster: StandaloneCluster, tmp_path: Path) -> None:
    """The representative fast case: 3 batches, 4 partitions over 2 executors, local checkpoint root."""
    batches = write_inputs(tmp_path / "in", files=3, rows=300, keys=50, seed=41)
    run = ClusterRun(spark_cluster, tmp_path, (tmp_path / "state").as_uri(), partitions=4).start()
    run.wait()
    _assert_exactly_once(run, batches)
    executors = {e for es in _executors_per_partition(run).values() for e in es}
    assert len(executors - {0}) == 2, f"partition tasks ran on executors {executors}, expected both"


def _s3_root(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    if backend == "local":
        return (tmp_path / "state").as_uri()
    return f"s3://{request.getfixturevalue('s3_bucket')}/counts"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_partitions_move_to_the_executors_of_a_new_application(
    spark_cluster: StandaloneCluster, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """A restarted application has fresh executors: every partition loads its state from the checkpoint."""
    batches = write_inputs(tmp_path / "in", files=4, rows=300, keys=50, seed=43)
    staged = tmp_path / "staged"
    staged.mkdir()
    for f in ("part-00002.parquet", "part-00003.parquet"):
        (tmp_path / "in" / f).rename(staged / f)
    root = _s3_root(request, backend, tmp_path)
    first = ClusterRun(spark_cluster, tmp_path, root, partitions=4).start()
    first.wait()
    _assert_exactly_once(first, batches[:2])
    before = {e for es in _executors_per_partition(first).values() for e in es}

    for staged_file in staged.iterdir():
        staged_file.rename(tmp_path / "in" / staged_file.name)
    (first.out / "progress.jsonl").unlink()
    second = ClusterRun(spark_cluster, tmp_path, root, partitions=4).start()
    second.wait()
    _assert_exactly_once(second, batches, first_batch=2)
    after = _executors_per_partition(second)
    assert all(not (es & before) for es in after.values()), "the new application reused an old executor"
    first_batch = second.progress()[0]
    assert first_batch["batch_id"] == 2 and first_batch["stores_reused"] == 0
    assert all(not m["reused_local"] for m in first_batch["partitions"])


def _kill_when(run: ClusterRun, cond: Callable[[], int | None], timeout: float = 300) -> int:
    """SIGKILL the executor JVM `cond` names once it names one; returns its pid."""
    assert run.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.proc.poll() is not None:
            raise AssertionError(f"the job ended (rc={run.proc.returncode}) before the kill point:\n{run.tail()}")
        pid = cond()
        if pid:
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.05)
    raise AssertionError("the kill point was never reached")


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "backend"), [("sync", "local"), ("async", "s3")])
def test_executor_killed_mid_batch_is_retried_exactly_once(
    spark_cluster: StandaloneCluster, tmp_path: Path, mode: str, backend: str, request: pytest.FixtureRequest
) -> None:
    batches = write_inputs(tmp_path / "in", files=4, rows=300, keys=50, seed=47)
    root = _s3_root(request, backend, tmp_path)
    run = ClusterRun(spark_cluster, tmp_path, root, partitions=3, task_sleep=1.5, **{"async": mode == "async"})
    run.start()
    seen: set[str] = set()

    def task_of_batch_one_running() -> int | None:
        """An executor running a partition task after batch 0 committed (so mid-batch 1 or later)."""
        if not run.progress():
            if run.markers.exists():
                seen.update(p.name for p in run.markers.iterdir())
            return None
        fresh = [p for p in run.markers.iterdir() if p.name not in seen]
        alive = set(spark_cluster.executor_pids())
        for marker in fresh:
            executor = int(marker.name.split("-")[1])
            if executor in alive:
                return executor
        return None

    killed = _kill_when(run, task_of_batch_one_running)
    run.wait()
    _assert_exactly_once(run, batches)
    assert killed not in spark_cluster.executor_pids()
    tasks_run = len(list(run.markers.iterdir()))
    assert tasks_run > len(batches) * 3, f"{tasks_run} partition tasks ran: the killed one was not retried"
