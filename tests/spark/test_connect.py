"""The stateful operator, its sink and the state reader from a Spark Connect client.

The client (`SparkSession.builder.remote("sc://127.0.0.1:PORT")`) holds no SparkContext: the operator's
batches run in the Connect server's Python process (see store.spark.connect), so the sink and the progress
callback write files the test reads; `last_progress` on the client raises a clear error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.rescale import execute_rescale, plan_rescale
from statekeeper.store.spark import StatefulOperator, read_state
from statekeeper.store.spark.connect import ConnectProgressError
from statekeeper.store.spark.rescale_rules import TypedStateKeys
from statekeeper.store.spark.restart import on_executors
from testkit.processors import CountSum, SeededCountSum
from tests.spark.helpers import (
    SCHEMA,
    JsonFileSink,
    JsonLinesProgress,
    read_batch_output,
    reference,
    stage_files,
    write_inputs,
)

OUT = "user string, count long, total long"


CONNECT_MODE_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")
"""Set by PySpark when a Connect session is created; left set, every later builder in this process would
ask for a Connect session too (the suite's classic `spark` session included)."""


@pytest.fixture
def remote(spark_connect_url: str) -> Iterator[Any]:
    # The suite's classic session is active in this process, and `pyspark.sql.SparkSession.builder.remote`
    # refuses to start a Connect session beside it (SESSION_ALREADY_EXIST): build the Connect session directly,
    # in Connect mode, as a client process of its own would.
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    saved = {k: os.environ.get(k) for k in CONNECT_MODE_ENV}
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session = RemoteSparkSession.builder.remote(spark_connect_url).getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run(
    remote: Any, tmp_path: Path, root: str, partitions: int = 3, processor: Any = None, **options: Any
) -> StatefulOperator:
    op = StatefulOperator(
        root,
        "counts",
        "user",
        processor or CountSum(),
        OUT,
        num_partitions=partitions,
        sink=JsonFileSink(str(tmp_path / "out")),
        on_progress=JsonLinesProgress(str(tmp_path / "progress.jsonl")),
        **options,
    )
    df = remote.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in"))
    query = op.start(df, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    try:
        assert query.awaitTermination(300), "query did not finish in time"
        assert query.exception() is None, f"query failed: {query.exception()}"
    finally:
        query.stop()
    return op


def _check(remote: Any, tmp_path: Path, root: str, batches: list[list[tuple[str, int]]]) -> None:
    expected = reference(batches)
    assert CommitLog(open_file_manager(root)).latest() == len(batches)
    rows = read_state(remote, root, "counts").collect()
    assert {json.loads(r["key"])[0]: tuple(json.loads(r["value"])) for r in rows} == expected
    rows = read_state(remote, root, "counts", version=1).collect()
    assert {json.loads(r["key"])[0]: tuple(json.loads(r["value"])) for r in rows} == reference(batches[:1])
    for b in range(len(batches)):
        running = reference(batches[: b + 1])
        assert read_batch_output(tmp_path / "out", b) == {u: running[u] for u, _ in batches[b]}
    progress = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [(p["batch_id"], p["mode"]) for p in progress] == [(b, "commit") for b in range(len(batches))]


def test_operator_sink_and_reader_over_spark_connect(remote: Any, tmp_path: Path) -> None:
    batches = write_inputs(tmp_path / "in", files=2, rows=200, keys=30, seed=51)
    root = (tmp_path / "state").as_uri()
    op = _run(remote, tmp_path, root)
    _check(remote, tmp_path, root, batches)
    with pytest.raises(ConnectProgressError, match="on_progress"):
        _ = op.last_progress


def test_initial_state_over_spark_connect(remote: Any, tmp_path: Path) -> None:
    """The client's initial-state DataFrame reaches handleInitialState in the server's copy, on the first batch only."""
    batches = write_inputs(tmp_path / "in", files=2, rows=100, keys=10, seed=52)
    root = (tmp_path / "state").as_uri()
    seed = remote.createDataFrame([("u1", 100, 5), ("seed-only", 7, 1)], "user string, count long, total long")
    _run(remote, tmp_path, root, processor=SeededCountSum(), initial_state=seed.groupBy("user"))
    expected = reference(batches)
    expected["u1"] = (expected["u1"][0] + 100, expected["u1"][1] + 5)
    expected["seed-only"] = (7, 1)
    rows = read_state(remote, root, "counts").collect()
    assert {json.loads(r["key"])[0]: tuple(json.loads(r["value"])) for r in rows} == expected
    assert read_batch_output(tmp_path / "out", 1)["u1"] == expected["u1"]


def test_rescale_at_restart_over_spark_connect(remote: Any, tmp_path: Path) -> None:
    """A restart with another num_partitions over Connect: the first batch's tasks (planned by the driver in
    the server's foreachBatch process) build their new partitions, then run the batch on them."""
    batches = write_inputs(tmp_path / "all", files=2, rows=200, keys=30, seed=52)
    root = (tmp_path / "state").as_uri()
    stage_files(tmp_path / "all", tmp_path / "in", range(1))
    _run(remote, tmp_path, root)
    stage_files(tmp_path / "all", tmp_path / "in", range(1, 2))
    _run(remote, tmp_path, root, partitions=5)
    record = CommitLog(open_file_manager(root)).get(3)
    assert record is not None and record.change.get("counts") is None and len(record.checkpoint_ids["counts"]) == 5
    rescaled = CommitLog(open_file_manager(root)).get(2)
    assert rescaled is not None and rescaled.change == {"counts": "rescale"}
    rows = read_state(remote, root, "counts").collect()
    assert {json.loads(r["key"])[0]: tuple(json.loads(r["value"])) for r in rows} == reference(batches)
    for b in range(2):
        running = reference(batches[: b + 1])
        assert read_batch_output(tmp_path / "out", b) == {u: running[u] for u, _ in batches[b]}


def test_offline_rescale_as_a_spark_job_over_connect(remote: Any, tmp_path: Path) -> None:
    """`on_executors` with a Connect session (no SparkContext): the builds run as a `mapInArrow` job, and the
    rescaled state reads back whole on the new layout."""
    batches = write_inputs(tmp_path / "in", files=2, rows=200, keys=30, seed=53)
    root = (tmp_path / "state").as_uri()
    _run(remote, tmp_path, root)
    fm = open_file_manager(root)
    plan = plan_rescale(fm, "counts", 5, rules=TypedStateKeys())
    result = execute_rescale(fm, plan, rules=TypedStateKeys(), runner=on_executors(remote))
    assert result.committed and len(result.checkpoint_ids) == 5
    rows = read_state(remote, root, "counts").collect()
    assert {json.loads(r["key"])[0]: tuple(json.loads(r["value"])) for r in rows} == reference(batches)


@pytest.mark.slow
def test_async_operator_on_s3_over_spark_connect(remote: Any, tmp_path: Path, s3_bucket: str) -> None:
    batches = write_inputs(tmp_path / "in", files=3, rows=300, keys=40, seed=53)
    root = f"s3://{s3_bucket}/counts"
    _run(remote, tmp_path, root, async_checkpoint=True)
    _check(remote, tmp_path, root, batches)
