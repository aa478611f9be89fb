"""Work per batch on real Spark: each partition's task runs once (the sink reuses its output), and the trace."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store.spark import StatefulOperator, StatefulProcessor
from statekeeper.store.spark.driver import TRACE_ENV
from testkit.processors import CountSum
from tests.spark.helpers import CollectingSink

OUT = "user string, count long, total long"


class CountingCountSum(CountSum):
    """CountSum that appends a line to `path` each time a task starts it (tasks run in other processes)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def init(self, handle: Any) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("task\n")
        super().init(handle)


def test_each_partition_task_runs_once_per_batch_and_traces_its_phases(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(trace))
    runs = tmp_path / "runs.txt"
    sink = CollectingSink()
    op = StatefulOperator(
        (tmp_path / "state").as_uri(), "counts", "user", CountingCountSum(str(runs)), OUT, num_partitions=3, sink=sink
    )
    batches = [[(f"u{i % 17:02d}", i) for i in range(b * 100, b * 100 + 100)] for b in range(2)]
    for b, rows in enumerate(batches):
        op.process_batch(spark.createDataFrame(rows, "user string, value long"), b)

    assert runs.read_text().count("task") == 3 * 2, "the sink recomputed the stateful tasks"
    assert [len(sink.batches[b]) for b in (0, 1)] == [17, 17]
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [t["batch_id"] for t in lines] == [0, 1]
    for t in lines:
        assert len(t["partitions"]) == 3 and sum(p["input_rows"] for p in t["partitions"]) == 100
        for p in t["partitions"]:
            traced = {"first_batch_ms", "convert_ms", "user_state_ms", "output_emit_ms"}
            assert traced | {"worker_start_rss_mb", "worker_peak_rss_mb", "rocksdb_mb"} <= set(p["phases"])
            assert p["phases"]["input_chunks"] == (1 if p["input_rows"] else 0)
            # each task placed within its batch's tasks job (wall clock, one machine here)
            assert t["job_started_at_ms"] <= p["phases"]["started_at_ms"] <= p["phases"]["ended_at_ms"]
            assert p["phases"]["ended_at_ms"] <= t["job_started_at_ms"] + t["job_ms"]


def test_a_batch_is_one_tasks_job_and_the_sink_keeps_the_sessions_adaptive_setting(spark: Any, tmp_path: Path) -> None:
    """Adaptive execution would split the tasks job into three (shuffle map stage, cached tasks, the driver's
    read of their results); the operator plans it without, and gives the session's own setting back before
    the user's sink runs."""
    seen: list[str | None] = []

    def sink(df: Any, batch_id: int) -> None:
        seen.append(df.sparkSession.conf.get("spark.sql.adaptive.enabled"))
        df.write.format("noop").mode("overwrite").save()

    op = StatefulOperator((tmp_path / "state").as_uri(), "counts", "user", CountSum(), OUT, num_partitions=3, sink=sink)
    sc = spark.sparkContext
    spark.conf.set("spark.sql.adaptive.enabled", "true")
    for b in range(2):
        sc.setJobGroup(f"batch-{b}-{tmp_path.name}", "one batch")
        try:
            op.process_batch(spark.createDataFrame([(f"u{i % 7}", i) for i in range(50)], "user string, value long"), b)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)

    assert seen == ["true", "true"]
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
    jobs = sc.statusTracker().getJobIdsForGroup(f"batch-1-{tmp_path.name}")
    assert len(jobs) == 2, f"a steady batch ran {len(jobs)} Spark jobs, expected the tasks job and the sink's"


class KeyCount(StatefulProcessor):
    """Rows per (user, region) key, either part possibly null."""

    def init(self, handle: Any) -> None:
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        n = (self.n.get() or (0,))[0] + sum(1 for _ in rows)
        self.n.update((n,))
        yield (*key, n)


def test_keys_with_nulls_group_and_count_across_batches(spark: Any, tmp_path: Path) -> None:
    """Each partition is sorted by key with nulls first and its marker row (all-null key) ahead of any equal
    key: rows whose key is wholly or partly null still reach their partition's task after its marker, as
    one group per key."""
    sink = CollectingSink()
    out = "user string, region string, n long"
    op = StatefulOperator(
        (tmp_path / "state").as_uri(), "counts", ["user", "region"], KeyCount(), out, num_partitions=2, sink=sink
    )
    keys = [(None, None), (None, "eu"), ("a", None), ("a", "eu"), ("b", "us")]
    rows = [(*keys[i % len(keys)], i) for i in range(40)]
    for b in range(2):
        op.process_batch(spark.createDataFrame(rows, "user string, region string, value long"), b)
    assert sorted(sink.batches[1], key=repr) == sorted([(*k, 16) for k in keys], key=repr)


def test_an_operator_without_a_sink_runs_each_task_once_and_keeps_no_output(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a sink nothing reads the tasks' output after the driver collects their results: the batch neither
    caches it nor runs a task twice, and the state is the same."""
    from statekeeper.store.spark import read_state

    cached: list[int] = []
    frame = type(spark.range(1))  # the session's DataFrame class (PySpark 4: pyspark.sql.classic's)
    real_cache = frame.cache

    def cache(self: Any) -> Any:
        cached.append(1)
        return real_cache(self)

    monkeypatch.setattr(frame, "cache", cache)
    runs = tmp_path / "runs.txt"
    root = (tmp_path / "state").as_uri()
    op = StatefulOperator(root, "counts", "user", CountingCountSum(str(runs)), OUT, num_partitions=2)
    for b in range(2):
        op.process_batch(spark.createDataFrame([(f"u{i % 5}", i) for i in range(20)], "user string, value long"), b)

    assert runs.read_text().count("task") == 2 * 2 and not cached
    state = {json.loads(r["key"])[0]: json.loads(r["value"]) for r in read_state(spark, root, "counts").collect()}
    assert state == {f"u{k}": [8, sum(i for i in range(20) if i % 5 == k) * 2] for k in range(5)}
