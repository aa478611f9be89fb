"""An event-time streaming job the timer kill test runs in its own process (and kills with SIGKILL).

python -m tests.spark.tws_driver_job INPUT_DIR STATE_ROOT SPARK_CHECKPOINT OUTPUT_DIR TASK_SLEEP SINK_SLEEP
"""

from __future__ import annotations

import sys

from statekeeper.store.spark import StatefulOperator
from tests.spark.driver_job import file_sink, session
from tests.spark.tws_processors import INPUT, OUTPUT, SlowSessions


def main(argv: list[str]) -> int:
    input_dir, root, checkpoint, output_dir, task_sleep, sink_sleep = argv[:6]
    spark = session()
    sink = file_sink(output_dir, sink_sleep)
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
