"""Driver side: the ``foreachBatch`` function that runs one stateful operator on the store.

Per micro-batch ``b`` (version ``b`` is loaded, ``b + 1`` committed):

1. The batch is repartitioned by key into the operator's fixed number of state partitions (fixed by
   its first commit record). One marker row per partition guarantees every partition's task runs,
   even with no data, because every partition must commit every version.
2. Each partition task (``mapInArrow``) loads its store at version ``b`` with the committed checkpoint
   id, runs the processor, commits under a fresh id and returns its output rows plus its result. With a sink
   the sink's own job runs the tasks and each reports its result through an accumulator
   (store/spark/tasks_job.py); otherwise (or when the sink left a partition unread) the driver's own job
   runs them, its output persisted for the sink, so each partition's output and id come from the same winning
   attempt; retried, speculative or failed attempts leave only uncommitted files (orphans for maintenance).
3. In async mode the driver waits until every partition's changelog is durable in the checkpoint
   location; a failed or lost upload fails the attempt and the whole batch is re-run from version ``b``.
4. Only then the driver writes the commit record of version ``b + 1`` with every partition's id and, when
   its job ran the tasks, passes the output to the user's sink with the batch id.

Restart: Spark re-runs its last uncommitted batch ``b``. If our commit record ``b + 1`` exists, the
state of ``b`` is already applied and is not applied again; the output is recomputed from version
``b`` without committing (the sink sees the batch again: at-least-once, as foreachBatch documents).
The batch's processing time is recorded before its first attempt, so a re-run sees the same time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.files.paths import validate_component
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.rescale import PartitionBuild, RescalePlan, commit_rescale, plan_rescale
from statekeeper.store.spark.api import BatchStatefulProcessor, StatefulProcessor
from statekeeper.store.spark.batch_records import BatchRecords, UploadTimeoutError
from statekeeper.store.spark.connect import is_connect_dataframe, progress_unavailable
from statekeeper.store.spark.event_time import (
    EventTime,
    TaskTime,
    WatermarkLog,
    next_watermark,
    parse_delay_ms,
    watermark_of,
)
from statekeeper.store.spark.executor import PID_COL, TaskSpec
from statekeeper.store.spark.heartbeat import DEFAULT_INTERVAL_SECONDS, Heartbeat
from statekeeper.store.spark.initial_state import Seed, collect_initial_state, initial_state_frame, seed_of
from statekeeper.store.spark.metrics import BatchProgress, PartitionMetrics
from statekeeper.store.spark.pandas_frames import PandasSettings
from statekeeper.store.spark.rescale_rules import TypedStateKeys
from statekeeper.store.spark.restart import read_head
from statekeeper.store.spark.routing import partition_column, routable
from statekeeper.store.spark.schemas import DEFAULT_MAX_KEY_GROUPS
from statekeeper.store.spark.state import check_max_key_groups
from statekeeper.store.spark.task_input import BATCH_INPUT_BUDGET_BYTES, DEFAULT_INPUT_BUDGET_BYTES
from statekeeper.store.spark.task_output import META_COL
from statekeeper.store.spark.tasks_job import Sink, TasksJob
from statekeeper.store.spark.tasks_plan import OutputFilters, TasksPlan, note_worker_sockets, sort_in_task
from statekeeper.store.spark.ticks import TickChannel, TickRecord, channel_path, due_at_ms, with_ticks, without_ticks
from statekeeper.store.spark.time_mode import TimeMode
from statekeeper.store.spark.worker_cache import FileManagerFactory
from statekeeper.store.state_store import StoreConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as PySparkStatefulProcessor
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

TRACE_ENV = "STATEKEEPER_SPARK_TRACE"


def _pyspark_processor(processor: object) -> bool:
    """A processor written for PySpark's transformWithState runs unchanged: same methods, same handle."""
    try:
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor as PySparkProcessor
    except ImportError:  # PySpark before 4.0
        return False
    return isinstance(processor, PySparkProcessor)


def _streams_active(spark: SparkSession) -> bool:
    """Whether a streaming query runs in `spark`; a stopped session (its RPC environment gone) runs none,
    so the heartbeat goes instead of failing every poll until the process exits (the next batch starts
    it again if that was wrong)."""
    try:
        return bool(spark.streams.active)
    except Exception as e:  # py4j / Connect errors of a stopped session
        log.debug("statekeeper: no active streams (%s)", e)
        return False


class StatefulOperator:
    """A stateful operator on the store, run through ``foreachBatch``.

    ``processor`` is a :class:`StatefulProcessor` (per key) or a :class:`BatchStatefulProcessor`
    (vectorized); ``key`` the grouping columns; ``output_schema`` a StructType or DDL string.
    ``sink(df, batch_id)`` gets each batch's output; its own job runs the tasks (store/spark/tasks_job.py).
    ``max_key_groups`` (the groups stored keys lead with) is recorded at the first batch and kept.
    ``task_input_budget_bytes`` bounds the Arrow input a task converts at once (whole key groups, once the
    task has sorted its input by key): the Python objects a task holds follow it, not the batch (default 2 MiB
    for per-key processors, whose rows become Python objects, 4 MiB for vectorized ones).
    With ``STATEKEEPER_SPARK_TRACE`` set to a file path, every batch's progress (with each partition's
    phase trace) is appended to that file as one JSON line.

    As PySpark's ``transformWithState``: ``time_mode`` "None" | "ProcessingTime" | "EventTime";
    event time from ``event_time_column`` + ``watermark_delay`` or the stream's ``withWatermark``
    (store/spark/event_time.py); ``initial_state`` a DataFrame or ``df.groupBy(key)`` delivered to
    ``handleInitialState`` on the first batch (store/spark/initial_state.py).

    ``quiet_timers=True``: timers fire while the input is quiet, as with Spark's no-data batches -- a due
    processing-time timer, an event-time timer the watermark passed, or a TTL'd value's expiry makes the query
    run a batch with no input rows within one trigger interval (store/spark/ticks.py). Off by default: the
    query's plan then unions a small tick stream, and its first start runs one empty batch.
    """

    def __init__(
        self,
        checkpoint_root: str,
        name: str,
        key: str | list[str],
        processor: StatefulProcessor | BatchStatefulProcessor | PySparkStatefulProcessor,
        output_schema: StructType | str,
        *,
        num_partitions: int = 4,
        input_format: str = "rows",
        async_checkpoint: bool = False,
        sink: Sink | None = None,
        store_config: StoreConfig | None = None,
        file_manager_factory: FileManagerFactory | None = None,
        upload_timeout_s: float = 120.0,
        max_batch_attempts: int = 3,
        on_progress: Callable[[BatchProgress], None] | None = None,
        local_dir: str | None = None,
        history: int = 200,
        max_key_groups: int = DEFAULT_MAX_KEY_GROUPS,
        task_input_budget_bytes: int | None = None,
        time_mode: str = "ProcessingTime",
        event_time_column: str | None = None,
        watermark_delay: str | int | None = None,
        initial_state: Any = None,
        output_mode: str = "Append",
        eventTimeColumnName: str = "",  # noqa: N803 - PySpark's argument name
        heartbeat_seconds: float = DEFAULT_INTERVAL_SECONDS,
        quiet_timers: bool = False,
    ) -> None:
        validate_component(name, "operator name")
        if eventTimeColumnName:
            raise NotImplementedError(
                "eventTimeColumnName (re-assigning the watermark on the output for a chained stateful operator) "
                "is not supported: the output goes to a foreachBatch sink, not to another operator"
            )
        if str(output_mode).lower() not in ("append", "update"):
            raise NotImplementedError(
                f"output_mode {output_mode!r}: transformWithState supports 'Append' and 'Update' (each batch's "
                "output goes to the sink as it is produced); 'Complete' is not supported"
            )
        if not isinstance(processor, StatefulProcessor | BatchStatefulProcessor) and not _pyspark_processor(processor):
            raise ConfigurationError(
                "processor must be a statekeeper StatefulProcessor or BatchStatefulProcessor, or PySpark's own "
                f"pyspark.sql.streaming.StatefulProcessor, got {type(processor).__name__}"
            )
        keys = [key] if isinstance(key, str) else list(key)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise ConfigurationError(f"key must name one or more grouping columns, got {key!r}")
        if input_format not in ("rows", "pandas"):
            raise ConfigurationError(f"input_format must be 'rows' or 'pandas', got {input_format!r}")
        if not isinstance(num_partitions, int) or not 1 <= num_partitions <= 10_000:
            raise ConfigurationError(f"num_partitions must be an integer in [1, 10000], got {num_partitions!r}")
        if task_input_budget_bytes is None:
            vectorized = isinstance(processor, BatchStatefulProcessor)
            task_input_budget_bytes = BATCH_INPUT_BUDGET_BYTES if vectorized else DEFAULT_INPUT_BUDGET_BYTES
        if not isinstance(task_input_budget_bytes, int) or task_input_budget_bytes < 1 << 16:
            raise ConfigurationError(
                f"task_input_budget_bytes must be an integer >= 65536, got {task_input_budget_bytes!r}"
            )
        if max_batch_attempts < 1:
            raise ConfigurationError(f"max_batch_attempts must be >= 1, got {max_batch_attempts}")
        self.root = checkpoint_root
        self.name = name
        self.key = tuple(keys)
        self.processor = processor
        self.output_schema = output_schema
        self.num_partitions = num_partitions
        self.input_format = input_format
        self.async_checkpoint = async_checkpoint
        self.sink = sink
        self.store_config = store_config or StoreConfig()
        self.fm_factory = file_manager_factory
        self.upload_timeout_s = upload_timeout_s
        self.max_batch_attempts = max_batch_attempts
        self.heartbeat_seconds = heartbeat_seconds
        self.on_progress = on_progress
        self.local_dir = local_dir
        self.max_key_groups = check_max_key_groups(max_key_groups)
        self.task_input_budget_bytes = task_input_budget_bytes
        self.time_mode = TimeMode.parse(time_mode)
        self.event_time: EventTime | None = None
        if (event_time_column is None) != (watermark_delay is None):
            raise ConfigurationError("event_time_column and watermark_delay go together (as in withWatermark)")
        if event_time_column is not None and watermark_delay is not None:
            self.event_time = EventTime(event_time_column, parse_delay_ms(watermark_delay))
        self.initial_state = None if initial_state is None else initial_state_frame(initial_state)
        self.history = history
        self.quiet_timers = quiet_timers
        self.ticks: TickChannel | None = None
        """Where the driver tells the tick source when a timer is due (set by `start` with quiet_timers)."""
        self.started_over_connect = False
        self._seed: Seed | None = None
        """The initial state collected on a Spark Connect client at `start`, for the server's copy."""
        self._reset_driver_state()

    def _reset_driver_state(self) -> None:
        """File manager, commit log and per-query caches: rebuilt, never pickled (see __getstate__)."""
        self.fm: CheckpointFileManager = (
            self.fm_factory(self.root) if self.fm_factory else (open_file_manager(self.root))
        )
        self.commit_log = CommitLog(self.fm)
        self.records = BatchRecords(self.fm, self.commit_log, self.name)
        self.recent_progress: deque[BatchProgress] = deque(maxlen=self.history)
        self._partitions: int | None = None
        self._next_batch: int | None = None
        self._plans: dict[tuple[str, int, KeyGroupLayout | None], TasksPlan] = {}
        self._struct: StructType | None = None
        self._shift = 0
        self._layout: KeyGroupLayout | None = None
        self._rescale_pending = False
        self._rescale: RescalePlan | None = None
        """The rescale the next batch starts with (planned at its restart)."""
        self._heartbeat: Heartbeat | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Spark Connect pickles the foreachBatch function (this operator) to run it in the server's Python
        process: send the configuration only; clients (S3) and Spark objects are rebuilt there."""
        skip = {"fm", "commit_log", "records", "recent_progress", "_partitions", "_next_batch"}
        skip |= {"_plans", "_filters", "_heartbeat"}
        if self.started_over_connect:
            skip.add("initial_state")  # a client DataFrame: the server's copy gets `_seed` instead
        return {k: v for k, v in self.__dict__.items() if k not in skip and k != "_struct"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.initial_state = None
        self.__dict__.update(state)
        self.started_over_connect = False  # this copy runs the batches: its progress is real
        self._reset_driver_state()

    # -- public ---------------------------------------------------------------------------------
    @property
    def last_progress(self) -> BatchProgress | None:
        if self.started_over_connect:
            raise progress_unavailable(self.name)
        return self.recent_progress[-1] if self.recent_progress else None

    def start(
        self,
        df: DataFrame,
        checkpoint_location: str,
        *,
        trigger: dict[str, Any] | None = None,
        query_name: str | None = None,
    ) -> StreamingQuery:
        """Start the streaming query: ``df.writeStream.foreachBatch(self.process_batch)``.

        Without explicit ``event_time_column`` / ``watermark_delay``, the ``withWatermark`` of `df` is used.
        Over Spark Connect the batches run in the server's Python process (see :mod:`statekeeper.store.spark.connect`).
        """
        self.started_over_connect = is_connect_dataframe(df)
        if not self.started_over_connect:
            note_worker_sockets(df.sparkSession)
        self._seed = None
        if self.started_over_connect and self.initial_state is not None:
            self._seed = seed_of(self.initial_state)  # the server's copy cannot read a client DataFrame
        if self.event_time is None:
            self.event_time = watermark_of(df)
        self.ticks = None
        ends = trigger is not None and any(trigger.get(k) for k in ("availableNow", "once"))
        if self.quiet_timers and self.time_mode is not TimeMode.NONE and not ends:  # a query that ends has no quiet
            self.ticks = TickChannel(channel_path(self.root, self.name, checkpoint_location, self.local_dir))
            df = with_ticks(df, self.ticks)
        writer = df.writeStream.foreachBatch(self.process_batch).option("checkpointLocation", checkpoint_location)
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        return writer.start()

    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        """The foreachBatch function."""
        t0 = time.perf_counter()
        if self.ticks is not None:
            df = without_ticks(df)  # a tick row only makes the batch run: the processor never sees it
        spark = df.sparkSession
        self._beat(spark)
        self._prepare(spark, df, batch_id)
        n = self._partitions
        assert n is not None
        ts = self.records.batch_timestamp(batch_id, n)
        version, target = batch_id + self._shift, batch_id + self._shift + 1
        already = self.commit_log.get(target) is not None
        base: dict[str, Any] = dict(
            operator=self.name,
            batch_id=batch_id,
            version=target,
            async_checkpoint=self.async_checkpoint,
            num_partitions=n,
            batch_timestamp_ms=ts,
        )
        rescale = self._rescale
        if already and self.sink is None:
            log.info("statekeeper %s: batch %d is already committed; nothing to do", self.name, batch_id)
            self._next_batch = batch_id + 1
            self._finish(BatchProgress(mode="skipped", duration_ms=(time.perf_counter() - t0) * 1000, **base))
            return
        if already and version > 0 and self.commit_log.get(version) is None:
            log.warning(
                "statekeeper %s: batch %d is already committed and version %d has expired, so its output cannot be "
                "recomputed for the sink; skipping it (keep at least 2 versions to re-deliver after a restart)",
                self.name,
                batch_id,
                version,
            )
            self._next_batch = batch_id + 1
            self._finish(BatchProgress(mode="skipped", duration_ms=(time.perf_counter() - t0) * 1000, **base))
            return
        load_ids = ("",) * n if rescale else self.records.load_ids(version, n)
        task_time, max_event_before = self._task_time(batch_id)
        spec = TaskSpec(
            root=self.root,
            operator=self.name,
            num_partitions=n,
            version=version,
            load_ids=load_ids,
            commit=not already,
            batch_ts_ms=ts,
            key_columns=self.key,
            processor=cast("StatefulProcessor | BatchStatefulProcessor", self.processor),  # PySpark's: same methods
            output_schema=self._arrow_schema(),
            input_format=self.input_format,
            async_upload=self.async_checkpoint,
            store_config=self.store_config,
            fm_factory=self.fm_factory,
            local_dir=self.local_dir,
            max_key_groups=self.max_key_groups,
            input_budget_bytes=self.task_input_budget_bytes,
            sort_input=sort_in_task(df.schema, self.key),
            routing=self._layout,
            time=task_time,
            session_time_zone=spark.conf.get("spark.sql.session.timeZone") or "UTC",
            pandas_settings=PandasSettings.of(spark.conf),
            nullable_state_fields=_avro_state_encoding(spark),
            initial_state=self._initial_rows(df, n) if version == 0 else None,
            rescale=rescale,
        )
        plan = self._plan(spark, df, n)
        job = TasksJob(
            self.name,
            self.records,
            self._filters,
            self._out_struct(),
            self.async_checkpoint,
            self.upload_timeout_s,
            self.max_batch_attempts,
        )
        if self.sink is not None and TasksJob.runs_in_sink(self.sink, df, spec):
            run = job.in_sink(self.sink, plan, spec, target, batch_id)
        else:
            run = job.own(plan, spec, target, batch_id, keep_output=self.sink is not None)
        out, metas = run.out, run.metas
        try:
            t_rec = time.perf_counter()
            max_event = self._record_event_time(batch_id, task_time, max_event_before, metas)
            if rescale is not None:  # the new layout first (invariant 11), then the batch on it
                builds = [PartitionBuild(**m.rescale_build) for m in metas if m.rescale_build]
                base["rescale"] = commit_rescale(self.fm, rescale, builds).to_json()
                self._rescale = None
            if spec.commit:
                ids = [m.checkpoint_id or "" for m in metas]
                self.records.commit(target, ids, batch_id, self._layout)
            self._tell_ticks(batch_id, task_time, max_event, metas)
            commit_record_ms = (time.perf_counter() - t_rec) * 1000
            progress = BatchProgress.of_partitions(
                base,
                "commit" if spec.commit else "replay",
                metas,
                attempts=run.attempts,
                job_ms=run.job_ms,
                job_started_at_ms=run.started_at_ms,
                upload_wait_ms=run.upload_wait_ms if self.async_checkpoint else None,
                commit_record_ms=commit_record_ms,
                watermark_ms=task_time.watermark_ms,
            )
            self._next_batch = batch_id + 1
            t_sink = time.perf_counter()
            if self.sink is not None and not run.in_sink:
                self.sink(self._filters.output(out), batch_id)
            sink_ms = (time.perf_counter() - t_sink) * 1000
        finally:
            out.unpersist()
        duration = (time.perf_counter() - t0) * 1000
        self._finish(dataclasses.replace(progress, sink_ms=sink_ms, duration_ms=duration, tasks_in_sink=run.in_sink))

    # -- batch phases ---------------------------------------------------------------------------
    def _watermarks(self) -> WatermarkLog | None:
        if self.event_time is None:
            return None
        return WatermarkLog(self.fm, self.name, self.event_time.delay_ms)

    def _task_time(self, batch_id: int) -> tuple[TaskTime, int | None]:
        """The batch's time mode and watermarks (recorded ones on a re-run), and the max event time before it."""
        marks = self._watermarks()
        if marks is None or self.event_time is None:
            if self.time_mode is TimeMode.EVENT_TIME:
                raise ConfigurationError(
                    f"operator {self.name!r} runs in timeMode 'EventTime' but has no event time: pass "
                    "event_time_column and watermark_delay, or start it on a stream with withWatermark(...)"
                )
            return TaskTime(self.time_mode), None
        watermark, late, max_before = marks.times(batch_id)
        return TaskTime(self.time_mode, self.event_time.column, watermark, late), max_before

    def _record_event_time(
        self, batch_id: int, task_time: TaskTime, max_before: int | None, metas: list[PartitionMetrics]
    ) -> int | None:
        """Record the batch's watermark; returns the max event time seen through the batch."""
        marks = self._watermarks()
        if marks is None:
            return None
        seen = [m.max_event_ms for m in metas if m.max_event_ms is not None]
        if max_before is not None:
            seen.append(max_before)
        max_event = max(seen) if seen else None
        marks.record(batch_id, task_time.watermark_ms, max_event)
        return max_event

    def _tell_ticks(
        self, batch_id: int, task_time: TaskTime, max_event: int | None, metas: list[PartitionMetrics]
    ) -> None:
        """With quiet_timers: when the state just committed (or re-run) has a timer or a TTL expiry due without new
        input."""
        if self.ticks is None:
            return
        pending = [m.next_timer_ms for m in metas if m.next_timer_ms is not None]
        expiries = [m.next_expiry_ms for m in metas if m.next_expiry_ms is not None]
        watermark = None
        if self.event_time is not None:  # what the next batch runs with (Spark's no-data batch: the same)
            watermark = next_watermark(task_time.watermark_ms, max_event, self.event_time.delay_ms)
        due = due_at_ms(self.time_mode, min(pending, default=None), watermark, min(expiries, default=None))
        try:
            self.ticks.write(TickRecord(batch_id, due))
        except OSError as e:  # a hint only: the next input still fires the timers
            log.warning("statekeeper %s: cannot write the tick record %s: %s", self.name, self.ticks.path, e)

    def _initial_rows(self, df: DataFrame, n: int) -> Any:
        initial = self.initial_state
        if initial is None and self._seed is not None:
            initial = self._seed.frame(df.sparkSession)
        if initial is None or isinstance(self.processor, BatchStatefulProcessor):
            return None
        pid = partition_column(df.schema, self.key, n, self._layout)
        return collect_initial_state(initial, df, self.key, pid, PID_COL)

    def _beat(self, spark: SparkSession) -> None:
        """Keep this driver's heartbeat alive while a query runs (an offline rescale refuses meanwhile)."""
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(
                self.fm, self.name, lambda: _streams_active(spark), interval=self.heartbeat_seconds
            )
        self._heartbeat.start()

    def _prepare(self, spark: SparkSession, df: DataFrame, batch_id: int) -> None:
        if self._struct is None:
            self._struct = _to_struct(spark, self.output_schema)
            reserved = [c for c in df.columns if c.startswith("__sk_")]
            if reserved:
                raise ConfigurationError(f"input columns {reserved} use the reserved prefix '__sk_'")
            missing = [k for k in self.key if k not in df.columns]
            if missing:
                raise ConfigurationError(f"key columns {missing} are not in the input columns {df.columns}")
        if self._next_batch == batch_id and self._partitions is not None and not self._rescale_pending:
            return
        head = read_head(self.commit_log, self.fm, self.name, batch_id)
        self._shift = head.shift
        layout, recorded = head.layout, head.partitions
        if recorded is None:
            recorded = self.records.intent_partitions(batch_id)
        self._rescale_pending = False
        if head.record is not None and recorded != self.num_partitions:
            if head.rerun:
                self._rescale_pending = True  # the re-run recomputes its output on the layout it ran on
            elif layout is None or self.num_partitions > layout.max_key_groups:
                log.warning(
                    "statekeeper %s: the state has %d partitions in a layout that cannot be rescaled (legacy, or more "
                    "partitions than its key groups); ignoring num_partitions=%d",
                    self.name,
                    recorded,
                    self.num_partitions,
                )
            else:  # the batch's tasks build the new partitions first; the job commits both versions
                self._rescale = plan_rescale(
                    self.fm, self.name, self.num_partitions, rules=TypedStateKeys(), config=self.store_config
                )
                log.info("statekeeper %s: rescaling in batch %d: %s", self.name, batch_id, self._rescale.describe())
                self._shift += 1
                layout, recorded = self._rescale.target_layout, self.num_partitions
        elif head.record is None:
            n = recorded or self.num_partitions
            routable_keys = routable(df.schema, self.key) and n <= self.max_key_groups
            layout = KeyGroupLayout(n, self.max_key_groups) if routable_keys else None
        self._layout = layout
        self._partitions = recorded or self.num_partitions
        self._next_batch = batch_id

    def _plan(self, spark: SparkSession, df: DataFrame, n: int) -> DataFrame:
        schema_key = (df.schema.json(), n, self._layout)
        plan = self._plans.get(schema_key)
        if plan is None:
            plan = self._plans[schema_key] = TasksPlan.build(spark, df.schema, self.key, n, self._layout)
        return plan.input(df)

    @functools.cached_property
    def _filters(self) -> OutputFilters:
        return OutputFilters.build()

    def _finish(self, progress: BatchProgress) -> None:
        self.recent_progress.append(progress)
        trace = os.environ.get(TRACE_ENV)
        if trace:
            with open(trace, "a", encoding="utf-8") as f:
                f.write(json.dumps(progress.to_dict()) + "\n")
        log.info("statekeeper batch progress: %s", progress.summary())
        if self.on_progress is not None:
            self.on_progress(progress)

    # -- schemas --------------------------------------------------------------------------------
    def _out_struct(self) -> StructType:
        from pyspark.sql.types import StringType, StructField, StructType

        assert self._struct is not None
        return StructType([*self._struct.fields, StructField(META_COL, StringType(), True)])

    def _arrow_schema(self) -> Any:
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(self._out_struct(), timezone="UTC")


def _avro_state_encoding(spark: SparkSession) -> bool:
    """Whether the session asks for Spark's Avro state encoding, whose rules a processor written for it expects."""
    value = spark.conf.get("spark.sql.streaming.stateStore.encodingFormat", None) or "unsaferow"
    return value.strip().lower() == "avro"


def _to_struct(spark: SparkSession, schema: StructType | str) -> StructType:
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        return schema
    parsed = spark.createDataFrame([], schema).schema
    if not isinstance(parsed, StructType):  # pragma: no cover - createDataFrame always gives a struct
        raise ConfigurationError(f"output schema {schema!r} is not a struct")
    return parsed


__all__ = ["StatefulOperator", "UploadTimeoutError"]
