"""Per-batch progress of a stateful operator, in the style of Spark's ``stateOperators`` progress."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

TWS_METRICS = (
    "numValueStateVars",
    "numListStateVars",
    "numMapStateVars",
    "numDeletedStateVars",
    "numRegisteredTimers",
    "numDeletedTimers",
    "numExpiredTimers",
    "numValueStateWithTTLVars",
    "numListStateWithTTLVars",
    "numMapStateWithTTLVars",
    "numValuesRemovedDueToTTLExpiry",
)
"""Spark's transformWithState custom metrics, under its names, summed over the batch's partition tasks: state
variables declared (per task, as each task's ``init`` declares them) and deleted, timers registered, deleted and
expired (fired), values evicted by TTL."""


@dataclass(frozen=True)
class PartitionMetrics:
    partition: int
    checkpoint_id: str | None
    attempt: int
    worker_pid: int
    input_rows: int
    output_rows: int
    keys: int
    rows_total: int
    rows_updated: int
    rows_removed: int
    ttl_removed: int
    timers_fired: int
    load_ms: float
    reused_local: bool
    replayed_changelogs: int
    replayed_records: int
    process_ms: float
    commit_ms: float
    upload_ms: float
    changelog_bytes: int
    changelog_records: int
    task_ms: float
    phases: dict[str, float] = field(default_factory=dict)
    """The task's trace (``statekeeper.store.spark.executor``): input wait and conversion, user logic and state,
    output build and hand-off to Spark, the worker's reuse and peak RSS."""
    late_rows: int = 0
    """Input rows dropped as late (at or before the previous batch's watermark)."""
    max_event_ms: int | None = None
    """Max event time of the partition's input rows in ms (None without event time or rows)."""
    repaired_snapshots: int = 0
    """Unreadable snapshots the partition's load passed over (snapshot repair)."""
    followed_changelogs: int = 0
    """Changelogs the worker replayed into this store between its tasks (store/spark/follow.py), since the
    store's previous task: the catch-up this task's load did not have to do."""
    followed_records: int = 0
    follow_ms: float = 0.0
    load_replans: int = 0
    """Times the partition's load started over from a newer snapshot that expiry had made the base."""
    rescale_build: dict[str, Any] | None = None
    """The first batch of a rescale: the `PartitionBuild` of the new partition the task built first."""
    next_timer_ms: int | None = None
    """The partition's earliest timer still pending after the batch (quiet-input ticks, store/spark/ticks.py)."""
    next_expiry_ms: int | None = None
    """When the partition's earliest TTL'd value left after the batch expires (quiet-input ticks too)."""
    api_counts: dict[str, int] = field(default_factory=dict)
    """Its task's counts of `TWS_METRICS` the handle keeps (declarations, deletions, timers registered / deleted)."""

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> PartitionMetrics:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in meta.items() if k in names})


@dataclass(frozen=True)
class BatchProgress:
    """What one micro-batch did to the operator's state and how long each phase took.

    ``mode`` is "commit" (state advanced to ``version``), "replay" (the batch was already committed
    before a restart: its output was recomputed from the previous version, state untouched) or
    "skipped" (already committed and no sink to feed).
    """

    operator: str
    batch_id: int
    version: int
    mode: str
    async_checkpoint: bool
    num_partitions: int
    batch_timestamp_ms: int
    input_rows: int = 0
    output_rows: int = 0
    num_rows_total: int = 0
    num_rows_updated: int = 0
    num_rows_removed: int = 0
    ttl_removed: int = 0
    timers_fired: int = 0
    changelog_bytes: int = 0
    load_ms: float = 0.0
    """Slowest partition's load (0 when every store was warm)."""
    process_ms: float = 0.0
    """Slowest partition's processing (user logic, state updates, timers, TTL eviction)."""
    commit_ms: float = 0.0
    """Slowest partition's local commit (changelog sealed and durable on local disk)."""
    upload_ms: float = 0.0
    """Sync: slowest partition's upload within its task. Async: the driver's wait for the uploads."""
    stores_reused: int = 0
    replayed_changelogs: int = 0
    followed_changelogs: int = 0
    """Changelogs the workers replayed into the batch's stores between tasks, before the batch (follow.py)."""
    job_ms: float = 0.0
    job_started_at_ms: float = 0.0
    """Wall clock (epoch ms) at the tasks job's start: with each task's ``phases`` started_at_ms and
    ended_at_ms, where the job's time outside the tasks went (before the first, between, after the last)."""
    commit_record_ms: float = 0.0
    sink_ms: float = 0.0
    """The sink's call after the commit record; 0 when the sink's own job ran the tasks (`tasks_in_sink`)."""
    tasks_in_sink: bool = False
    """The sink's own job ran the tasks (store/spark/tasks_job.py): `job_ms` is the sink's call."""
    duration_ms: float = 0.0
    attempts: int = 1
    watermark_ms: int = -1
    """The batch's event-time watermark (-1 without event time)."""
    num_rows_dropped_by_watermark: int = 0
    """Late input rows dropped before the processor saw them, as Spark's numRowsDroppedByWatermark."""
    partitions: list[PartitionMetrics] = field(default_factory=list)
    api_counts: dict[str, int] = field(default_factory=dict)
    """`TWS_METRICS` counted by the handle, summed over the partitions (``numExpiredTimers`` is `timers_fired`,
    ``numValuesRemovedDueToTTLExpiry`` `ttl_removed`)."""
    rescale: dict[str, Any] | None = None
    """When the operator was rescaled at this restart: what moved and how long it took
    (`statekeeper.store.rescale.RescaleResult.to_json`)."""

    @classmethod
    def of_partitions(
        cls,
        base: dict[str, Any],
        mode: str,
        metas: list[PartitionMetrics],
        *,
        attempts: int,
        job_ms: float,
        job_started_at_ms: float,
        upload_wait_ms: float | None,
        commit_record_ms: float,
        watermark_ms: int,
    ) -> BatchProgress:
        """The batch's progress from its partitions' metrics: sums of counts, the slowest partition's phases.

        `base` holds the batch's identity (operator, batch_id, version, ...); `upload_wait_ms` is the
        driver's wait for async uploads (None in sync mode: then the slowest task's upload counts).
        """
        return cls(
            mode=mode,
            input_rows=sum(m.input_rows for m in metas),
            output_rows=sum(m.output_rows for m in metas),
            num_rows_total=sum(m.rows_total for m in metas),
            num_rows_updated=sum(m.rows_updated for m in metas),
            num_rows_removed=sum(m.rows_removed for m in metas),
            ttl_removed=sum(m.ttl_removed for m in metas),
            timers_fired=sum(m.timers_fired for m in metas),
            changelog_bytes=sum(m.changelog_bytes for m in metas),
            load_ms=max(m.load_ms for m in metas),
            process_ms=max(m.process_ms for m in metas),
            commit_ms=max(m.commit_ms for m in metas),
            upload_ms=max(m.upload_ms for m in metas) if upload_wait_ms is None else upload_wait_ms,
            stores_reused=sum(1 for m in metas if m.reused_local),
            replayed_changelogs=sum(m.replayed_changelogs for m in metas),
            followed_changelogs=sum(m.followed_changelogs for m in metas),
            num_rows_dropped_by_watermark=sum(m.late_rows for m in metas),
            job_ms=job_ms,
            job_started_at_ms=job_started_at_ms,
            commit_record_ms=commit_record_ms,
            attempts=attempts,
            watermark_ms=watermark_ms,
            partitions=metas,
            api_counts={n: c for n in TWS_METRICS if (c := sum(m.api_counts.get(n, 0) for m in metas))},
            **base,
        )

    @property
    def repaired_snapshots(self) -> int:
        """Unreadable snapshots the batch's loads passed over (each a repair, logged as a warning)."""
        return sum(p.repaired_snapshots for p in self.partitions)

    @property
    def load_replans(self) -> int:
        """Loads that started over from a newer snapshot after expiry removed a file they needed."""
        return sum(p.load_replans for p in self.partitions)

    def state_operator_progress(self) -> dict[str, Any]:
        """The same figures under the names of Spark's ``StateOperatorProgress`` JSON."""
        return {
            "operatorName": f"statekeeper:{self.operator}",
            "numRowsTotal": self.num_rows_total,
            "numRowsUpdated": self.num_rows_updated,
            "numRowsRemoved": self.num_rows_removed,
            "numRowsDroppedByWatermark": self.num_rows_dropped_by_watermark,
            "allUpdatesTimeMs": round(self.process_ms),
            "commitTimeMs": round(self.commit_ms + self.upload_ms + self.commit_record_ms),
            "numShufflePartitions": self.num_partitions,
            "numStateStoreInstances": self.num_partitions,
            "customMetrics": {
                "loadMs": round(self.load_ms),
                "localCommitMs": round(self.commit_ms),
                "uploadMs": round(self.upload_ms),
                "commitRecordMs": round(self.commit_record_ms),
                "changelogBytes": self.changelog_bytes,
                "storesReused": self.stores_reused,
                "replayedChangelogs": self.replayed_changelogs,
                "followedChangelogs": self.followed_changelogs,
                "repairedSnapshots": self.repaired_snapshots,
                "loadReplans": self.load_replans,
                "rescaleMs": round(1000 * float(self.rescale["seconds"])) if self.rescale else 0,
                "rescaleMovedKeyGroups": int(self.rescale["moved_key_groups"]) if self.rescale else 0,
                "rescaleBytesRead": int(self.rescale["bytes_read"]) if self.rescale else 0,
                "rescaleBytesWritten": int(self.rescale["bytes_written"]) if self.rescale else 0,
                **{name: self.api_counts.get(name, 0) for name in TWS_METRICS},
                "numExpiredTimers": self.timers_fired,
                "numValuesRemovedDueToTTLExpiry": self.ttl_removed,
            },
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One log line."""
        d = {k: v for k, v in self.to_dict().items() if k != "partitions"}
        d["repaired_snapshots"] = self.repaired_snapshots
        d["load_replans"] = self.load_replans
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 1)
        return json.dumps(d, sort_keys=False)


__all__ = ["TWS_METRICS", "BatchProgress", "PartitionMetrics"]
