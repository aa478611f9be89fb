"""Work per batch on real Spark: each partition's task runs once (in the sink's own job), whatever the sink does
the state takes each batch once, and the trace."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import accumulators

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


@pytest.mark.parametrize("adaptive", ["false", "true"])
def test_the_sinks_job_runs_the_tasks_under_the_sessions_settings(spark: Any, tmp_path: Path, adaptive: str) -> None:
    """With a sink, a steady batch is the sink's own job: its tasks' output reaches the sink as it comes out of
    them (nothing cached, no job of the operator's own, only the processor's rows: the tasks' results go by an
    accumulator), under the session's settings (adaptive execution splits the sink's job into its shuffle's map
    stage and the rest, as it would any query's)."""
    seen: list[str | None] = []
    columns: list[list[str]] = []

    def sink(df: Any, batch_id: int) -> None:
        seen.append(df.sparkSession.conf.get("spark.sql.adaptive.enabled"))
        columns.append(df.columns)
        df.write.format("noop").mode("overwrite").save()

    op = StatefulOperator((tmp_path / "state").as_uri(), "counts", "user", CountSum(), OUT, num_partitions=3, sink=sink)
    sc = spark.sparkContext
    registered = len(accumulators._accumulatorRegistry)
    before = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", adaptive)
    try:
        for b in range(2):
            sc.setJobGroup(f"batch-{b}-{tmp_path.name}", "one batch")
            try:
                df = spark.createDataFrame([(f"u{i % 7}", i) for i in range(50)], "user string, value long")
                op.process_batch(df, b)
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", before)

    assert seen == [adaptive, adaptive]
    assert columns == [["user", "count", "total"]] * 2
    assert len(accumulators._accumulatorRegistry) == registered, "a batch's accumulator outlived it"
    assert [p.tasks_in_sink for p in op.recent_progress] == [True, True]
    assert [p.attempts for p in op.recent_progress] == [1, 1] and op.recent_progress[-1].sink_ms < 50
    jobs = sc.statusTracker().getJobIdsForGroup(f"batch-1-{tmp_path.name}")
    expected = 2 if adaptive == "true" else 1
    assert len(jobs) == expected, f"a steady batch ran {len(jobs)} Spark jobs, expected the sink's {expected}"


SINKS = ("reads all", "reads one row", "reads nothing", "reads it twice", "fails")


def test_a_sink_that_reads_part_of_the_output_or_reads_it_twice_changes_no_state(spark: Any, tmp_path: Path) -> None:
    """Whatever the sink does with the tasks' output, each batch is applied to the state exactly once: a sink that
    leaves a partition unread (``limit``, nothing at all) makes the driver run the tasks again for their results;
    one that reads the output twice runs them twice, the last attempt named by the commit record; one that fails
    fails the batch, which runs again from the same version."""
    from statekeeper.store.spark import read_state

    runs = tmp_path / "runs.txt"
    behaviour: list[str] = []
    delivered: dict[int, list[tuple[Any, ...]]] = {}

    def sink(df: Any, batch_id: int) -> None:
        what = behaviour[-1]
        if what == "reads all":
            delivered[batch_id] = sorted(tuple(r) for r in df.collect())
        elif what == "reads one row":
            assert len(df.limit(1).collect()) == 1
        elif what == "reads it twice":
            df.write.format("noop").mode("overwrite").save()
            delivered[batch_id] = sorted(tuple(r) for r in df.collect())
        elif what == "fails":
            df.limit(1).collect()
            raise RuntimeError("the sink failed")

    root = (tmp_path / "state").as_uri()
    op = StatefulOperator(root, "counts", "user", CountingCountSum(str(runs)), OUT, num_partitions=3, sink=sink)
    totals: dict[str, list[int]] = {}
    for b, what in enumerate([*SINKS, "reads all"]):
        rows = [(f"u{(i * 7 + b) % 11}", i) for i in range(b * 40, b * 40 + 40)]
        behaviour.append(what)
        if what == "fails":
            with pytest.raises(Exception, match="the sink failed"):
                op.process_batch(spark.createDataFrame(rows, "user string, value long"), b)
            behaviour.append("reads all")  # Spark runs the batch again
        op.process_batch(spark.createDataFrame(rows, "user string, value long"), b)
        for user, value in rows:
            count, total = totals.setdefault(user, [0, 0])
            totals[user] = [count + 1, total + value]
        if behaviour[-1] in ("reads all", "reads it twice"):
            expected = sorted((u, *totals[u]) for u in {u for u, _ in rows})
            assert delivered[b] == expected, f"batch {b}: the sink read {delivered[b]}"

    progress = {p.batch_id: p for p in op.recent_progress}
    assert progress[1].attempts == progress[2].attempts == 2, "a partly read output's results come from a second job"
    assert all(p.tasks_in_sink for p in progress.values())
    state = {json.loads(r["key"])[0]: json.loads(r["value"]) for r in read_state(spark, root, "counts").collect()}
    assert state == totals


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
