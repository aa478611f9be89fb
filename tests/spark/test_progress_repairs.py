"""Snapshot repairs surface in the batch progress: per partition and in Spark's custom metrics."""

from __future__ import annotations

from statekeeper.store.spark.metrics import BatchProgress, PartitionMetrics

FIELDS = {name: 0 for name in PartitionMetrics.__dataclass_fields__}


def test_repaired_snapshots_are_summed_into_the_progress() -> None:
    parts = [
        PartitionMetrics.from_meta({**FIELDS, "partition": p, "reused_local": False, "repaired_snapshots": p})
        for p in range(3)
    ]
    old = PartitionMetrics.from_meta({k: v for k, v in FIELDS.items() if k != "repaired_snapshots"})
    assert old.repaired_snapshots == 0  # metas of executors that do not report it
    progress = BatchProgress("agg", 0, 1, "commit", False, 3, 0, partitions=parts)
    assert progress.repaired_snapshots == 3
    assert progress.state_operator_progress()["customMetrics"]["repairedSnapshots"] == 3
    assert '"repaired_snapshots": 3' in progress.summary()
