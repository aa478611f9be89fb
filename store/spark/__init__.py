"""Spark Structured Streaming on the statekeeper store.

    from statekeeper.store.spark import StatefulOperator, StatefulProcessor

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
- :class:`BatchStatefulProcessor` -- vectorized: the partition's batch as Arrow tables (one, or several
  when it exceeds ``task_input_budget_bytes``; each key in exactly one), with bulk state access
  (``getMany`` / ``updateMany`` / ``clearMany``); :func:`keys_of` gives a table's keys in the form they take,
  :func:`values_of` a column's values as Python objects, many times faster than ``to_pylist``.

A task sorts its input by key (store/spark/task_input.py: in Arrow, spilling to local files beyond 64 MiB)
and converts about ``task_input_budget_bytes`` of Arrow data at a time, cut on key boundaries.

Progress per batch (``op.last_progress``, ``op.recent_progress``, ``on_progress=``, and the log) has the
figures of Spark's ``stateOperators`` progress. ``read_state(spark, root, operator, stateVarName=...)`` returns
any committed version of a state variable as a typed DataFrame, or its change feed (Python Data Source
``statekeeper``, with the options of Spark's state data source; see store/spark/reader.py). State is typed
by schemas recorded in the checkpoint (store/spark/schemas.py); nothing persisted is pickle.
``statekeeper.store.spark.testing.TwsTester`` runs a processor over batches without Spark, for unit tests.

Timers while the input is quiet: foreachBatch queries get no no-data batches; with ``quiet_timers=True``
``op.start`` unions a tick stream that makes Spark run a batch with no input when a timer is due (a
processing-time timer at its time, an event-time timer once the watermark passes it), exactly once, within a
trigger interval (store/spark/ticks.py).

Migrating from ``transformWithState``: the README's "Moving a transformWithState job over" lists what is
the same, what differs and what PySpark has that this does not.

Everything works from a Spark Connect client too; there the batches (and the sink and ``on_progress``)
run in the Connect server's Python process, see :mod:`statekeeper.store.spark.connect`.

The names below load on first use (PEP 562), and the check that names the missing ``[spark]`` extra runs
then: the typed-state modules of this package (schemas, state views, rescale rules) need no PySpark, so
maintenance (``verify --rebuild``, ``rescale``) can read typed state on an install without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from statekeeper.store.extras import require

if TYPE_CHECKING:
    from statekeeper.store.spark.api import (
        ApplyInPandasWithState,
        BatchStatefulProcessor,
        ExpiredTimerInfo,
        GroupState,
        StatefulProcessor,
        TimerValues,
        keys_of,
        values_of,
    )
    from statekeeper.store.spark.batch_records import UploadTimeoutError
    from statekeeper.store.spark.driver import StatefulOperator
    from statekeeper.store.spark.handle import StatefulProcessorHandle
    from statekeeper.store.spark.metrics import BatchProgress, PartitionMetrics
    from statekeeper.store.spark.reader import StateDataSource, read_state
    from statekeeper.store.spark.spark_import import ImportSummary, import_spark_state
    from statekeeper.store.spark.state_variables import ListState, MapState, ValueState
    from statekeeper.store.spark.time_mode import TimeMode

_EXPORTS = {
    "ApplyInPandasWithState": "api",
    "BatchStatefulProcessor": "api",
    "ExpiredTimerInfo": "api",
    "GroupState": "api",
    "StatefulProcessor": "api",
    "TimerValues": "api",
    "keys_of": "api",
    "values_of": "api",
    "StatefulOperator": "driver",
    "UploadTimeoutError": "batch_records",
    "StatefulProcessorHandle": "handle",
    "BatchProgress": "metrics",
    "PartitionMetrics": "metrics",
    "StateDataSource": "reader",
    "read_state": "reader",
    "ImportSummary": "spark_import",
    "import_spark_state": "spark_import",
    "ListState": "state_variables",
    "MapState": "state_variables",
    "ValueState": "state_variables",
    "TimeMode": "time_mode",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require(("pyspark", "pandas"), "spark", "statekeeper.store.spark (the Spark Structured Streaming integration)")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ApplyInPandasWithState",
    "BatchProgress",
    "BatchStatefulProcessor",
    "ExpiredTimerInfo",
    "GroupState",
    "ImportSummary",
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
    "import_spark_state",
    "keys_of",
    "read_state",
    "values_of",
]
