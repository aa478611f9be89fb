"""Exactly-once state under task failures that Spark retries (local[2,4]: up to 4 attempts per task)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.layout import StoreId
from statekeeper.store.spark import StatefulOperator
from testkit.processors import CountSum, FailingUploads, FailOnce
from tests.spark.helpers import CollectingSink, reference, run_query, state_of, write_inputs

OUT = "user string, count long, total long"


@pytest.mark.parametrize("where", ["process", "close", "kill"])
def test_task_failures_are_retried_without_lost_or_doubled_updates(spark: Any, tmp_path: Path, where: str) -> None:
    batches = write_inputs(tmp_path / "in", files=3, rows=300, keys=40, seed=5)
    poison = {batches[1][0][1], batches[2][5][1]}  # one row of batch 1 and one of batch 2
    root = (tmp_path / "state").as_uri()
    sink = CollectingSink()
    op = StatefulOperator(root, "counts", "user", FailOnce(where, poison), OUT, num_partitions=2, sink=sink)
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")

    expected = reference(batches)
    assert state_of(spark, root, "counts") == expected
    assert sink.latest_per_key() == expected
    retried = [m for p in op.recent_progress for m in p.partitions if m.attempt > 0]
    assert len(retried) >= 2, "the injected failures did not happen"
    fm = open_file_manager(root)
    log = CommitLog(fm)
    for p in op.recent_progress:
        record = log.get(p.version)
        assert record is not None
        assert list(record.checkpoint_ids["counts"]) == [m.checkpoint_id for m in p.partitions]
    if where in ("close", "kill"):
        # the failed attempts had committed changelogs of their own, never named in a commit record
        for p in op.recent_progress:
            for m in p.partitions:
                if m.attempt == 0:
                    continue
                names = [f.path.rsplit("/", 1)[-1] for f in fm.list(StoreId("counts", m.partition).changelog_dir())]
                same_version = [n for n in names if n.startswith(f"{p.version:020d}_")]
                assert len(same_version) >= 2
                assert f"{p.version:020d}_{m.checkpoint_id}.changelog" in same_version


@pytest.mark.parametrize("async_checkpoint", [False, True])
def test_failed_upload_fails_the_attempt_and_nothing_is_lost(
    spark: Any, tmp_path: Path, async_checkpoint: bool
) -> None:
    """Sync: the task fails and Spark retries it. Async: the driver's wait fails and the batch is re-run."""
    batches = write_inputs(tmp_path / "in", files=3, rows=200, keys=30, seed=9)
    root = (tmp_path / "state").as_uri()
    (tmp_path / "marker").mkdir()
    op = StatefulOperator(
        root,
        "counts",
        "user",
        CountSum(),
        OUT,
        num_partitions=2,
        async_checkpoint=async_checkpoint,
        file_manager_factory=FailingUploads(str(tmp_path / "marker"), version=2),
        upload_timeout_s=3.0,
    )
    run_query(spark, op, tmp_path / "in", tmp_path / "ckpt")
    assert (tmp_path / "marker" / "failed-once").exists()
    assert state_of(spark, root, "counts") == reference(batches)
    batch1 = op.recent_progress[1]
    if async_checkpoint:
        assert batch1.attempts == 2
    else:
        assert batch1.attempts == 1 and any(m.attempt > 0 for m in batch1.partitions)
