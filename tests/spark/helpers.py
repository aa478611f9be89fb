"""Input files, a query runner and the batch-computed reference for the Spark tests."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from statekeeper.store.spark import StatefulOperator, read_state

SCHEMA = "user string, value long"


def write_inputs(directory: Path, files: int, rows: int, keys: int, seed: int = 7) -> list[list[tuple[str, int]]]:
    """`files` parquet files of `rows` (user, value) rows; returns their rows in file order."""
    directory.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)
    batches = []
    for f in range(files):
        data = [(f"u{rnd.randrange(keys)}", f * 1_000_000 + i) for i in range(rows)]
        pq.write_table(
            pa.table({"user": [u for u, _ in data], "value": pa.array([v for _, v in data], pa.int64())}),
            directory / f"part-{f:05d}.parquet",
        )
        # the file source takes files in modification-time order: make it the file order
        os.utime(directory / f"part-{f:05d}.parquet", (1_700_000_000 + f, 1_700_000_000 + f))
        batches.append(data)
    return batches


def stage_files(all_dir: Path, input_dir: Path, files: range) -> None:
    """Copy files `files` of `write_inputs`'s `all_dir` into `input_dir` (the query's source), in order."""
    input_dir.mkdir(exist_ok=True)
    for f in files:
        name = f"part-{f:05d}.parquet"
        shutil.copy2(all_dir / name, input_dir / name)
        os.utime(input_dir / name, (1_700_000_000 + f, 1_700_000_000 + f))


def reference(batches: list[list[tuple[str, int]]]) -> dict[str, tuple[int, int]]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for batch in batches:
        for user, value in batch:
            totals[user][0] += 1
            totals[user][1] += value
    return {u: (c, s) for u, (c, s) in totals.items()}


class CollectingSink:
    """Keeps each batch's output on the driver (a re-delivered batch replaces its earlier delivery)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[Any, ...]]] = {}
        self.deliveries: list[int] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = [tuple(r) for r in df.collect()]
        self.deliveries.append(batch_id)

    def latest_per_key(self) -> dict[str, tuple[Any, ...]]:
        out: dict[str, tuple[Any, ...]] = {}
        for b in sorted(self.batches):
            for row in self.batches[b]:
                out[row[0]] = tuple(row[1:])
        return out


def run_query(spark: Any, op: StatefulOperator, input_dir: Path, checkpoint: Path, timeout: float = 240) -> None:
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(input_dir))
    query = op.start(df, str(checkpoint), trigger={"availableNow": True})
    try:
        assert query.awaitTermination(int(timeout)), "query did not finish in time"
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
    finally:
        query.stop()


def state_of(spark: Any, root: str, operator: str, version: int | None = None, state: str = "totals") -> dict[str, Any]:
    rows = read_state(spark, root, operator, version=version, state=state).collect()
    return {json.loads(r["key"])[0]: tuple(json.loads(r["value"])) for r in rows}


class JsonFileSink:
    """Writes each batch's output sorted to `directory`/batch-NNNNN.json (for sinks that run in another process)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, df: Any, batch_id: int) -> None:
        out = Path(self.directory)
        out.mkdir(parents=True, exist_ok=True)
        rows = sorted([list(r) for r in df.collect()])
        tmp = out / f".batch-{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, out / f"batch-{batch_id:05d}.json")


def read_batch_output(directory: Path, batch_id: int) -> dict[str, tuple[int, int]]:
    rows = json.loads((directory / f"batch-{batch_id:05d}.json").read_text())
    return {r[0]: (r[1], r[2]) for r in rows}


class JsonLinesProgress:
    """An ``on_progress`` callback appending each batch's progress to a JSON-lines file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, progress: Any) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(progress.to_dict()) + "\n")
