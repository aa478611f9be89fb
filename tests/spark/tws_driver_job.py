"""An event-time streaming job the timer kill test runs in its own process (and kills with SIGKILL).

python -m tests.spark.tws_driver_job INPUT_DIR STATE_ROOT SPARK_CHECKPOINT OUTPUT_DIR TASK_SLEEP SINK_SLEEP
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from store.spark import StatefulOperator
from tests.spark.tws_processors import INPUT, OUTPUT, SlowSessions


def main(argv: list[str]) -> int:
    input_dir, root, checkpoint, output_dir, task_sleep, sink_sleep = argv[:6]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
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

    op = StatefulOperator(
        root,
        "sessions",
        "user",
        SlowSessions(float(task_sleep)),
        OUTPUT,
        num_partitions=2,
        sink=sink,
        time_mode="EventTime",
    )
    df = (
        spark.readStream.schema(INPUT)
        .option("maxFilesPerTrigger", 1)
        .parquet(input_dir)
        .withWatermark("ts", "5 seconds")
    )
    query = op.start(df, checkpoint, trigger={"availableNow": True})
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
