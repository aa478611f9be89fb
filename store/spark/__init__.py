"""Spark Structured Streaming on the statekeeper store.

    from store.spark import StatefulOperator, StatefulProcessor

    class Counter(StatefulProcessor):
        def init(self, handle):
            self.count = handle.getValueState("count", "n long")   # StructType or DDL
        def handleInputRows(self, key, rows, timerValues):
            n = (self.count.get() or (0,))[0] + sum(1 for _ in rows)
            self.count.update((n,))
            yield (key[0], n)

    op = StatefulOperator("file:///tmp/state", "counts", key="user", processor=Counter(),
                          output_schema="user string, count long", sink=lambda df, batch_id: ...)
    query = op.start(stream_df, checkpoint_location="/tmp/spark-ckpt")

Three ways to write the logic, all on the same state encoding:

- :class:`StatefulProcessor` -- per key, after PySpark's ``transformWithState``: ``init`` /
  ``handleInputRows`` / ``handleExpiredTimer`` / ``handleInitialState`` / ``close``; ValueState,
  ListState, MapState with TTL; time modes "None" / "ProcessingTime" / "EventTime" with watermarks,
  late-row dropping and event-time timers (store/spark/event_time.py); ``initial_state``. Rows are
  ``pyspark.sql.Row`` (``input_format="rows"``) or pandas DataFrames
  (``input_format="pandas"``, as ``transformWithStateInPandas``).
- :class:`ApplyInPandasWithState` -- runs an ``applyInPandasWithState`` function unchanged.
- :class:`BatchStatefulProcessor` -- vectorized: the partition's whole batch as an Arrow table, with
  bulk state access (``getMany`` / ``updateMany`` / ``clearMany``).

Progress per batch (``op.last_progress``, ``op.recent_progress``, ``on_progress=``, and the log) has the
figures of Spark's ``stateOperators`` progress. ``read_state(spark, root, operator, stateVarName=...)`` returns
any committed version of a state variable as a typed DataFrame, or its change feed (Python Data Source
``statekeeper``, with the options of Spark's state data source; see store/spark/reader.py). State is typed
by schemas recorded in the checkpoint (store/spark/schemas.py); nothing persisted is pickle.
``store.spark.testing.TwsTester`` runs a processor over batches without Spark, for unit tests.

Migrating from ``transformWithState``: the README's "Moving a transformWithState job over" lists what is
the same, what differs (no no-data batches under foreachBatch) and what PySpark has that this does not.
"""

from store.spark.api import (
    ApplyInPandasWithState,
    BatchStatefulProcessor,
    ExpiredTimerInfo,
    GroupState,
    StatefulProcessor,
    TimerValues,
    keys_of,
)
from store.spark.driver import StatefulOperator, UploadTimeoutError
from store.spark.handle import StatefulProcessorHandle
from store.spark.metrics import BatchProgress, PartitionMetrics
from store.spark.reader import StateDataSource, read_state
from store.spark.state import ListState, MapState, ValueState
from store.spark.time_mode import TimeMode

__all__ = [
    "ApplyInPandasWithState",
    "BatchProgress",
    "BatchStatefulProcessor",
    "ExpiredTimerInfo",
    "GroupState",
    "ListState",
    "MapState",
    "PartitionMetrics",
    "StateDataSource",
    "StatefulOperator",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "TimeMode",
    "TimerValues",
    "UploadTimeoutError",
    "ValueState",
    "keys_of",
    "read_state",
]
