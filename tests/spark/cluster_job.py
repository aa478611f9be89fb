"""A streaming job the cluster tests run as the driver of an application on the standalone cluster.

python -m tests.spark.cluster_job SETTINGS_JSON

SETTINGS_JSON: {"conf": {spark settings}, "input": dir, "root": state root, "checkpoint": Spark checkpoint,
"out": output dir, "task_sleep": seconds each partition task sleeps before it commits, "async": bool,
"markers": dir for task markers, "partitions": state partitions}. The driver runs in its own process:
one SparkContext per process, and the test process keeps its local one.

Writes out/batch-NNNNN.json (each batch's output, by the sink), out/progress.jsonl (each batch's
progress), out/state.json (the final state through the reader) and, per partition task, a marker
naming the executor JVM and Python worker that ran it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from pyspark.sql import SparkSession

from statekeeper.store.spark import StatefulOperator, StatefulProcessorHandle, read_state
from testkit.processors import CountSum
from tests.spark.helpers import SCHEMA, JsonFileSink, JsonLinesProgress

OUT = "user string, count long, total long"


def executor_pid() -> int:
    """The executor JVM this Python worker belongs to (0 when there is none, e.g. local mode)."""
    proc = psutil.Process()
    for parent in proc.parents():
        if "CoarseGrainedExecutorBackend" in " ".join(parent.cmdline()):
            return int(parent.pid)
    return 0


class TaggedCountSum(CountSum):
    """CountSum that leaves a marker per partition task (which executor ran it) and may sleep before commit."""

    def __init__(self, marker_dir: str, sleep_s: float) -> None:
        self.marker_dir = marker_dir
        self.sleep_s = sleep_s

    def init(self, handle: StatefulProcessorHandle) -> None:
        super().init(handle)
        name = f"task-{executor_pid()}-{os.getpid()}-{time.time_ns()}"
        Path(self.marker_dir, name).touch()
        time.sleep(self.sleep_s)


def main(argv: list[str]) -> int:
    settings: dict[str, Any] = json.loads(argv[0])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    builder = SparkSession.builder.appName("statekeeper-cluster-test")
    for key, value in settings["conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    out = Path(settings["out"])
    out.mkdir(parents=True, exist_ok=True)
    Path(settings["markers"]).mkdir(parents=True, exist_ok=True)

    op = StatefulOperator(
        settings["root"],
        "counts",
        "user",
        TaggedCountSum(settings["markers"], float(settings.get("task_sleep", 0))),
        OUT,
        num_partitions=int(settings.get("partitions", 4)),
        async_checkpoint=bool(settings.get("async", False)),
        sink=JsonFileSink(str(out)),
        on_progress=JsonLinesProgress(str(out / "progress.jsonl")),
    )
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(settings["input"])
    query = op.start(df, settings["checkpoint"], trigger={"availableNow": True})
    query.awaitTermination()
    rows = read_state(spark, settings["root"], "counts").collect()
    state = {json.loads(r["key"])[0]: json.loads(r["value"]) for r in rows}
    (out / "state.json").write_text(json.dumps(state, sort_keys=True))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
