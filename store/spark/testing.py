"""Unit-test a processor without Spark: :class:`TwsTester`, after Spark's ``TwsTester``.

    >>> from statekeeper.store.spark import StatefulProcessor
    >>> from statekeeper.store.spark.testing import TwsTester
    >>> class Counter(StatefulProcessor):
    ...     def init(self, handle):
    ...         self.count = handle.getValueState("count", "n long")
    ...
    ...     def handleInputRows(self, key, rows, timerValues):
    ...         n = (self.count.get() or (0,))[0] + sum(1 for _ in rows)
    ...         self.count.update((n,))
    ...         yield (key[0], n)
    >>> with TwsTester(Counter(), key="user", output_schema="user string, count long") as t:
    ...     assert t.run([{"user": "a"}, {"user": "a"}], processing_time_ms=1000) == [("a", 2)]
    ...     assert t.value_state("count") == {("a",): (2,)}  # key tuple -> value tuple
    ...     assert t.timers() == []

Each :meth:`TwsTester.run` is one micro-batch: the rows run through the same partition task code a
Spark executor runs (store/spark/executor.py) on a real :class:`~store.StateStore` in a temporary
checkpoint root, with one state partition, then the batch is committed. Processing time and
watermark are set per batch (or the watermark is computed from an event-time column as Spark does);
the output comes back as tuples in output-schema order, and state and timers can be inspected
between batches. Nothing here starts a JVM.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats.typed_schema import to_schema
from statekeeper.store.spark.api import BatchStatefulProcessor, StatefulProcessor
from statekeeper.store.spark.event_time import (
    INITIAL_WATERMARK_MS,
    TaskTime,
    max_event_ms,
    next_watermark,
    parse_delay_ms,
)
from statekeeper.store.spark.executor import CACHE, PID_COL, TaskSpec, _run_partition
from statekeeper.store.spark.metrics import PartitionMetrics
from statekeeper.store.spark.schemas import DEFAULT_MAX_KEY_GROUPS
from statekeeper.store.spark.state_view import StateView
from statekeeper.store.spark.task_input import TaskInput
from statekeeper.store.spark.task_output import META_COL
from statekeeper.store.spark.time_mode import TimeMode
from statekeeper.store.state_store import StateStore

if TYPE_CHECKING:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as PySparkStatefulProcessor

OPERATOR = "tester"


class TwsTester:
    """Runs a processor over input batches in-process, with controlled processing time and watermark.

    `rows` of a batch: a ``pyarrow.Table``, a ``pandas.DataFrame`` or a list of dicts. `output_schema`:
    a DDL string, a PySpark ``StructType`` or a ``pyarrow.Schema``. `initial_state` (rows in the same
    forms) reaches ``handleInitialState`` in the first batch. With ``event_time_column`` and
    ``watermark_delay`` the watermark and late rows follow Spark's rules unless a batch sets
    ``watermark_ms`` itself. `session_time_zone` is Spark's ``spark.sql.session.timeZone``.
    """

    def __init__(
        self,
        processor: StatefulProcessor | BatchStatefulProcessor | PySparkStatefulProcessor,
        key: str | list[str],
        output_schema: Any,
        *,
        time_mode: str = "ProcessingTime",
        input_format: str = "rows",
        event_time_column: str | None = None,
        watermark_delay: str | int | None = None,
        initial_state: Any = None,
        max_key_groups: int = DEFAULT_MAX_KEY_GROUPS,
        directory: str | Path | None = None,
        session_time_zone: str = "UTC",
    ) -> None:
        if input_format not in ("rows", "pandas"):
            raise ConfigurationError(f"input_format must be 'rows' or 'pandas', got {input_format!r}")
        self.processor = processor
        self.key = (key,) if isinstance(key, str) else tuple(key)
        self.output_schema = _arrow_output_schema(output_schema)
        self.time_mode = TimeMode.parse(time_mode)
        self.input_format = input_format
        self.event_time_column = event_time_column
        self.delay_ms = 0 if watermark_delay is None else parse_delay_ms(watermark_delay)
        self.initial_state = None if initial_state is None else _to_table(initial_state)
        self.max_key_groups = max_key_groups
        self.session_time_zone = session_time_zone
        """Spark's ``spark.sql.session.timeZone``: the zone of pandas frames' naive timestamps, in and out."""
        self._tmp = None if directory is not None else tempfile.TemporaryDirectory(prefix="statekeeper-tws-")
        base = Path(directory if directory is not None else self._tmp.name)  # type: ignore[union-attr]
        self.root = (base / "checkpoint").as_uri()
        self.local_dir = str(base / "local")
        self.fm = open_file_manager(self.root)
        self.commit_log = CommitLog(self.fm)
        self.batch_id = 0
        self.processing_time_ms = 0
        event_time = self.time_mode is TimeMode.EVENT_TIME or event_time_column is not None
        self.watermark_ms = INITIAL_WATERMARK_MS if event_time else -1
        self._max_event: int | None = None
        self._checkpoint_id = ""
        self.last_metrics: PartitionMetrics | None = None
        """The last batch's figures (late rows dropped, timers fired, rows updated, ...)."""

    # -- running batches ------------------------------------------------------------------------
    def run(
        self, rows: Any = (), *, processing_time_ms: int | None = None, watermark_ms: int | None = None
    ) -> list[tuple[Any, ...]]:
        """One micro-batch: its output rows as tuples in output-schema order."""
        if processing_time_ms is not None:
            self.processing_time_ms = int(processing_time_ms)
        previous = self.watermark_ms
        if watermark_ms is not None:
            if watermark_ms < previous:
                raise ConfigurationError(f"the watermark never goes back: {watermark_ms} < {previous}")
            self.watermark_ms = int(watermark_ms)
        elif self.event_time_column is not None and self.batch_id > 0:
            self.watermark_ms = next_watermark(previous, self._max_event, self.delay_ms)
        data = _to_table(rows)
        if data.num_rows == 0 and not data.column_names:
            data = self._empty_input()
        self._input_schema = data.schema
        late = previous if self.event_time_column is not None and self.batch_id > 0 else -1
        if self.event_time_column is not None and self.batch_id == 0:
            late = INITIAL_WATERMARK_MS
        if self.event_time_column is not None and data.num_rows:
            seen = max_event_ms(data.column(self.event_time_column))
            if seen is not None:
                self._max_event = seen if self._max_event is None else max(self._max_event, seen)
        task_time = TaskTime(self.time_mode, self.event_time_column, self.watermark_ms, late)
        spec = self._spec(task_time)
        output: list[pa.RecordBatch] = []
        meta: dict[str, Any] = {}
        task_input = TaskInput.of_table(data, 0, spec.key_columns, spec.input_budget_bytes)
        for batch in _run_partition(spec, 0, task_input, time.perf_counter()):
            metas = batch.column(META_COL)
            if metas.null_count < batch.num_rows:
                meta = json.loads(metas[0].as_py())
            else:
                output.append(batch.drop_columns([META_COL]))
        self._checkpoint_id = str(meta["checkpoint_id"])
        self.commit_log.commit(self.batch_id + 1, {OPERATOR: [self._checkpoint_id]})
        self.last_metrics = PartitionMetrics.from_meta(meta)
        self.batch_id += 1
        rows_out: list[tuple[Any, ...]] = []
        for b in output:
            rows_out.extend(zip(*(c.to_pylist() for c in b.columns), strict=True))
        return rows_out

    def _spec(self, task_time: TaskTime) -> TaskSpec:
        initial = None
        if self.batch_id == 0 and self.initial_state is not None:
            initial = self.initial_state.append_column(PID_COL, pa.array([0] * self.initial_state.num_rows, pa.int32()))
        return TaskSpec(
            root=self.root,
            operator=OPERATOR,
            num_partitions=1,
            version=self.batch_id,
            load_ids=(self._checkpoint_id,),
            commit=True,
            batch_ts_ms=self.processing_time_ms,
            key_columns=self.key,
            processor=cast("StatefulProcessor | BatchStatefulProcessor", self.processor),  # PySpark's: same methods
            output_schema=self.output_schema,
            input_format=self.input_format,
            local_dir=self.local_dir,
            max_key_groups=self.max_key_groups,
            time=task_time,
            session_time_zone=self.session_time_zone,
            initial_state=initial,
        )

    def _empty_input(self) -> pa.Table:
        schema = getattr(self, "_input_schema", None)
        if schema is not None:
            return schema.empty_table()
        if self.initial_state is not None:
            return self.initial_state.select(list(self.key)).schema.empty_table()
        raise ConfigurationError("the first batch needs rows (or an initial state) to know the input columns")

    # -- inspecting state -----------------------------------------------------------------------
    def _view(self) -> StateView:
        store = CACHE.store(self._spec(TaskTime(self.time_mode)), 0)
        store.load(self.batch_id, self._checkpoint_id or None)
        return StateView(store)

    def _live(self, name: str) -> Iterable[tuple[Any, Any, Any]]:
        now = self.processing_time_ms
        for key, uk, value, expiry in self._view().rows(name):
            if expiry is None or expiry > now:
                yield key, uk, value

    def value_state(self, name: str) -> dict[tuple[Any, ...], Any]:
        """Every key's value of a ValueState (tuples for struct schemas), expired values left out."""
        return {k: v for k, _, v in self._live(name)}

    def list_state(self, name: str) -> dict[tuple[Any, ...], list[Any]]:
        """Every key's live elements of a ListState (each element expires on its own)."""
        out: dict[tuple[Any, ...], list[Any]] = {}
        for k, element, expiry in self._view().elements(name):
            if expiry is None or expiry > self.processing_time_ms:
                out.setdefault(k, []).append(element)
        return out

    def map_state(self, name: str) -> dict[tuple[Any, ...], dict[Any, Any]]:
        out: dict[tuple[Any, ...], dict[Any, Any]] = {}
        for k, uk, v in self._live(name):
            out.setdefault(k, {})[uk] = v
        return out

    def timers(self) -> list[tuple[tuple[Any, ...], int]]:
        """Every registered timer as (key, expiry ms), in key order."""
        return list(self._view().timers())

    @property
    def store(self) -> StateStore:
        """The partition's store, loaded at the last committed version (read it; do not commit)."""
        return self._view().store

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        CACHE.drop(self._spec(TaskTime(self.time_mode)), 0)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> TwsTester:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _to_table(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    if type(rows).__name__ == "DataFrame" and type(rows).__module__.startswith("pandas"):
        return pa.Table.from_pandas(rows, preserve_index=False)
    rows = list(rows)
    if rows and not isinstance(rows[0], dict):
        raise ConfigurationError(f"give rows as dicts (column -> value), not {type(rows[0]).__name__}")
    return pa.Table.from_pylist(rows)


def _arrow_output_schema(schema: Any) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    if isinstance(schema, pa.Schema):
        arrow = schema
    else:
        if not isinstance(schema, StructType):
            parsed = to_schema(schema, "output_schema")
            if parsed is None or not parsed.is_struct:
                raise ConfigurationError(f"output_schema must be a struct, got {schema!r}")
            schema = StructType.fromJson(parsed.json_value())
        arrow = to_arrow_schema(schema, timezone="UTC")
    return arrow.append(pa.field(META_COL, pa.string()))


__all__ = ["TwsTester"]
