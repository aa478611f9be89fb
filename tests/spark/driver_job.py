"""A streaming job the driver-kill test runs in its own process (and kills with SIGKILL).

python -m tests.spark.driver_job INPUT_DIR STATE_ROOT SPARK_CHECKPOINT OUTPUT_DIR TASK_SLEEP SINK_SLEEP [async]

Environment: ``JOB_PARTITIONS`` (default 3) the operator's ``num_partitions``; ``JOB_KILL_AT`` =
``POINT:PREFIX:N`` kills the job's process group with SIGKILL the N-th time the fault point POINT
(statekeeper.store.faults) is reached for a file whose path starts with PREFIX, in the driver or in
any one Python worker (each counts its own).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from statekeeper.store import faults
from statekeeper.store.spark import StatefulOperator
from testkit.processors import SlowCountSum
from tests.spark.helpers import SCHEMA


def session() -> SparkSession:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
    )
    if os.environ.get("JOB_KILL_AT"):
        builder = builder.config("spark.python.daemon.module", "tests.spark.kill_daemon")  # in executors too
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def file_sink(output_dir: str, sink_sleep: str) -> Callable[[Any, int], None]:
    """Writes each batch's sorted rows to OUTPUT_DIR/batch-<id>.json and logs the delivery."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)

    def sink(df: Any, batch_id: int) -> None:
        rows = sorted([list(r) for r in df.collect()])
        tmp = out / f".batch-{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, out / f"batch-{batch_id:05d}.json")
        with open(out / "deliveries.log", "a") as f:
            f.write(f"{batch_id} {os.getpid()}\n")
        time.sleep(float(sink_sleep))

    return sink


def arm_kill(spec: str) -> None:
    """Install the ``JOB_KILL_AT`` hook (see the module docstring)."""
    point, prefix, n = spec.split(":")
    seen = 0

    def hook(reached: str, subject: str) -> None:
        nonlocal seen
        if reached == point and subject.startswith(prefix):
            seen += 1
            if seen == int(n):
                os.killpg(os.getpgid(0), signal.SIGKILL)

    faults.arm(hook)


def main(argv: list[str]) -> int:
    input_dir, root, checkpoint, output_dir, task_sleep, sink_sleep = argv[:6]
    async_checkpoint = argv[6:] == ["async"]
    if os.environ.get("JOB_KILL_AT"):
        arm_kill(os.environ["JOB_KILL_AT"])
    spark = session()
    sink = file_sink(output_dir, sink_sleep)
    op = StatefulOperator(
        root,
        "counts",
        "user",
        SlowCountSum(float(task_sleep)),
        "user string, count long, total long",
        num_partitions=int(os.environ.get("JOB_PARTITIONS", "3")),
        sink=sink,
        async_checkpoint=async_checkpoint,
    )
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(input_dir)
    query = op.start(df, checkpoint, trigger={"availableNow": True})
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
