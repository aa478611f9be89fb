"""Executor side: one partition task of one micro-batch, run inside ``mapInArrow``.

A task gets every row of its state partition (plus one marker row naming the partition), loads the
partition's store at version = batch id with the committed checkpoint id the driver passed, runs the
user's processor, commits (or, when re-running an already committed batch for its output, aborts) and
yields the output rows followed by one metadata row (checkpoint id and metrics) for the driver.

Store instances are cached per (root, operator, partition) in the Python worker process (Spark reuses
workers), so the warm path reuses the open RocksDB. Spark gives no affinity between a partition and a
worker process, so a cached store may be a few versions behind: it then catches up by replaying only
the missing changelogs, when its version is on the requested version's lineage (else it rebuilds).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import gc
import importlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from statekeeper.store.async_upload import AsyncUploader
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import LineageError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.formats.typed_schema import Field, from_arrow, struct
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.rescale import PartitionBuild, RescalePlan, SourceStores, build_partition
from statekeeper.store.rocks import current_rss, peak_rss, release_free_heap, reset_peak_rss, shared_memory
from statekeeper.store.spark.api import (
    ApplyInPandasWithState,
    BatchStatefulProcessor,
    ExpiredTimerInfo,
    StatefulProcessor,
    TimerValues,
)
from statekeeper.store.spark.event_time import TaskTime
from statekeeper.store.spark.follow import FOLLOWER, follows
from statekeeper.store.spark.handle import StatefulProcessorHandle
from statekeeper.store.spark.initial_state import in_time_zone
from statekeeper.store.spark.pandas_frames import PandasSettings
from statekeeper.store.spark.rescale_rules import TypedStateKeys
from statekeeper.store.spark.schemas import DEFAULT_MAX_KEY_GROUPS
from statekeeper.store.spark.state import StateContext
from statekeeper.store.spark.state_view import check_typed_state
from statekeeper.store.spark.task_input import (
    DEFAULT_INPUT_BUDGET_BYTES,
    MARKER_COL,
    PID_COL,
    InputPhases,
    TaskInput,
    groups_of,
    row_class,
)
from statekeeper.store.spark.task_output import META_COL, OUTPUT_BATCH_ROWS, OutputBuffer, OutputClock
from statekeeper.store.spark.worker_cache import CACHE, FileManagerFactory, use_worker_memory
from statekeeper.store.spark.worker_gc import WORKER_GC
from statekeeper.store.state_store import StateStore, StoreConfig

if TYPE_CHECKING:
    from pyspark.accumulators import Accumulator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSpec:
    """Everything a partition task needs; pickled into the mapInArrow closure."""

    root: str
    operator: str
    num_partitions: int
    version: int
    """The version to load (= batch id); the task commits version + 1."""
    load_ids: tuple[str, ...]
    """Committed checkpoint id of `version` per partition ("" for version 0)."""
    commit: bool
    """False when re-running an already committed batch only for its output (the store is aborted)."""
    batch_ts_ms: int
    key_columns: tuple[str, ...]
    processor: StatefulProcessor | BatchStatefulProcessor
    output_schema: pa.Schema
    input_format: str = "rows"
    async_upload: bool = False
    store_config: StoreConfig = field(default_factory=StoreConfig)
    fm_factory: FileManagerFactory | None = None
    local_dir: str | None = None
    max_key_groups: int = DEFAULT_MAX_KEY_GROUPS
    """Key groups of the grouping-key hash; recorded in the checkpoint at the first batch."""
    input_budget_bytes: int = DEFAULT_INPUT_BUDGET_BYTES
    """Arrow bytes of input the task converts at once (whole key groups): bounds its memory."""
    sort_input: bool = False
    """The input comes unsorted and the task sorts it by key (`tasks_plan.sort_in_task`)."""
    routing: KeyGroupLayout | None = None
    """The key groups the driver routed the rows by (None: Spark's hash of the key): the task checks its rows'."""
    time: TaskTime = field(default_factory=TaskTime)
    """Time mode, watermarks and event-time column of the batch (store/spark/event_time.py)."""
    session_time_zone: str = "UTC"
    """Spark's ``spark.sql.session.timeZone``: pandas frames hold timestamps in it, as PySpark's do."""
    pandas_settings: PandasSettings = field(default_factory=PandasSettings)
    """The session's pandas settings: the Arrow batch limits a key's input frames are cut at, and whether an
    integer output column may fill a decimal field."""
    nullable_state_fields: bool = False
    """``spark.sql.streaming.stateStore.encodingFormat=avro``: state schemas must have nullable fields only, as
    Spark's Avro state encoding requires (statekeeper's own encoding has no such limit)."""
    initial_state: pa.Table | None = None
    """First batch only: the initial state rows, with the state partition of each in PID_COL."""
    results: Accumulator[list[str]] | None = None
    """Where the task reports its result when the sink's own job runs it (store/spark/tasks_job.py): its output
    is then the processor's rows only (`output_schema` without META_COL), else one more row carries the result."""
    rescale: RescalePlan | None = None
    """The rescale this batch starts with: each task first builds its new partition (`version` is the
    rescale's new version, which the driver commits just before the batch's)."""


def _key_schema(schema: pa.Schema, key_columns: tuple[str, ...]) -> Any:
    """The grouping key's struct: the types of the key columns."""
    return struct(*(Field(c, from_arrow(schema.field(c).type, f"grouping key column {c!r}")) for c in key_columns))


# -- output ---------------------------------------------------------------------------------------
# -- the task -------------------------------------------------------------------------------------
@dataclass
class _LateRows:
    """Drops late rows chunk by chunk (event time); counts them and keeps the max event time seen."""

    time: TaskTime
    rows: int = 0
    max_event_ms: int | None = None

    def drop(self, chunk: pa.Table) -> pa.Table:
        kept, late, max_event = self.time.drop_late(chunk)
        self.rows += late
        if max_event is not None:
            self.max_event_ms = max_event if self.max_event_ms is None else max(self.max_event_ms, max_event)
        return kept


_WORKER = {"tasks": 0}
"""Tasks this Python worker process ran before (0: a fresh worker, paying its start-up)."""


def run_task(spec: TaskSpec, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The body of the mapInArrow function for one Spark partition."""
    t_start = time.perf_counter()
    reset_peak_rss()  # the trace shows what this task needed, not an earlier task of the reused worker
    use_worker_memory()
    task_input = TaskInput(
        batches,
        spec.key_columns,
        spec.input_budget_bytes,
        sort=spec.sort_input,
        spill_dir=CACHE.process_dir(spec.local_dir),
        layout=spec.routing,
    )
    if task_input.partition is None:
        return  # no state partition routed here
    attempt = _task_attempt()
    in_worker = attempt[1] >= 0  # a Spark task's (its attempt id), not one run in-process
    if in_worker:
        WORKER_GC.task_started()
    # Many small objects, no cycles worth collecting mid-task: pause the cyclic GC for the task.
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        with CACHE.task():
            yield from _run_partition(spec, task_input.partition, task_input, t_start, attempt)
        if spec.commit and spec.rescale is None and follows():
            FOLLOWER.follow(spec.root, spec.operator, spec.version + 1)
    finally:
        _WORKER["tasks"] += 1
        if gc_enabled:
            gc.enable()
        # Spark reuses the worker for the next task: what this one freed goes back to the OS, or the worker's
        # RSS stays at its high-water mark between tasks (1-3 ms a task).
        pa.default_memory_pool().release_unused()
        release_free_heap()
        if in_worker:
            WORKER_GC.task_ended()


def _run_partition(
    spec: TaskSpec, partition: int, data: TaskInput, t_start: float, task_attempt: tuple[int, int] = (0, -1)
) -> Iterator[pa.RecordBatch]:
    start_rss = current_rss() or 0  # what the worker holds as the task begins (earlier tasks' stores, the cache)
    attempt, task_attempt_id = task_attempt
    uploader = CACHE.uploader(spec)
    build = None
    if spec.rescale is not None:
        store, build = _build(spec, partition)
    else:
        store = _load(spec, partition)
    load = store.last_load
    followed = CACHE.followed_by(spec, partition)
    out = OutputBuffer(spec.output_schema, spec.pandas_settings.int_to_decimal, spec.session_time_zone)
    clock = OutputClock()
    assert data.schema is not None
    ctx = StateContext(store, spec.batch_ts_ms, _key_schema(data.schema, spec.key_columns), spec.max_key_groups)
    late = _LateRows(spec.time)
    data.transform = late.drop
    timer_values = spec.time.timer_values(spec.batch_ts_ms)
    processor = spec.processor
    committed = False
    fired: list[tuple[bytes, int]] = []
    phases = data.phases
    try:
        t_proc = time.perf_counter()
        state_handle = StatefulProcessorHandle(ctx, spec.time.mode, spec.nullable_state_fields)
        processor.init(state_handle)
        state_handle.initialized = True
        if isinstance(processor, BatchStatefulProcessor):
            calls = 0
            for chunk in data.chunks():
                calls += 1
                out.add(processor.handleBatch(chunk, timer_values))
                yield from clock.drain(out)
            if not calls:
                out.add(processor.handleBatch(data.empty_table(), timer_values))
                yield from clock.drain(out)
            keys = -1  # not counted by the vectorized API
        else:
            keys = 0
            # an applyInPandasWithState function keeps its keys as they were; PySpark's TWS ones are shaped as its
            own_keys = isinstance(processor, ApplyInPandasWithState)
            frame_key = None if own_keys else _frame_key(spec, data.schema)
            if spec.initial_state is not None:
                initial = spec.initial_state.filter(pc.equal(spec.initial_state.column(PID_COL), partition))
                initial = in_time_zone(initial.drop_columns([PID_COL]), spec.session_time_zone)
                initial_groups = groups_of(
                    initial, spec.key_columns, spec.input_format, time_zone=spec.session_time_zone
                )
                for key, states in initial_groups:
                    ctx.set_key(key)
                    for one in states:
                        processor.handleInitialState(key if frame_key is None else frame_key(key), one, timer_values)
            set_key, add, handle, buffered = ctx.set_key, out.add, processor.handleInputRows, out.items
            for key, rows in data.groups(spec.input_format, spec.session_time_zone, spec.pandas_settings):
                keys += 1
                set_key(key)
                add(handle(key if frame_key is None else frame_key(key), rows, timer_values))
                if len(buffered) >= OUTPUT_BATCH_ROWS:
                    yield from clock.drain(out)
            fired = ctx.expired_timers(spec.time.timer_deadline_ms(spec.batch_ts_ms))
            timer_key = _timer_key(spec, data.schema) if fired and not own_keys else None
            for _ in fire_timers(ctx, processor, fired, timer_values, timer_key, out.add):
                if out.pending() >= OUTPUT_BATCH_ROWS:
                    yield from clock.drain(out)
            ctx.clear_key()
        timers_fired = len(fired)
        next_timer = None if isinstance(processor, BatchStatefulProcessor) else ctx.next_timer_ms()
        ctx.evict_expired()
        next_expiry = ctx.next_expiry_ms()
        rows_total = ctx.save_rows_total()
        process_ms = (time.perf_counter() - t_proc) * 1000
        meta: dict[str, Any] = {
            "partition": partition,
            "version": spec.version + 1,
            "attempt": attempt,
            "task_attempt_id": task_attempt_id,
            "worker_pid": os.getpid(),
            "input_rows": phases.rows,
            "late_rows": late.rows,
            "max_event_ms": late.max_event_ms,
            "keys": keys,
            "rows_total": rows_total,
            "rows_updated": ctx.rows_updated,
            "rows_removed": ctx.rows_removed,
            "ttl_removed": ctx.ttl_removed,
            "timers_fired": timers_fired,
            "next_timer_ms": next_timer,
            "next_expiry_ms": next_expiry,
            "api_counts": ctx.api_counts,
            "process_ms": process_ms,
            "load_ms": load.load_ms if load else 0.0,
            "reused_local": bool(load and load.reused_local),
            "replayed_changelogs": load.replayed_changelogs if load else 0,
            "replayed_records": load.replayed_records if load else 0,
            "repaired_snapshots": load.repaired_snapshots if load else 0,
            "followed_changelogs": followed.replayed_changelogs if followed else 0,
            "followed_records": followed.replayed_records if followed else 0,
            "follow_ms": followed.load_ms if followed else 0.0,
            "load_replans": load.replans if load else 0,
            "rescale_build": dataclasses.asdict(build) if build else None,
        }
        if spec.commit:
            result = store.commit()
            committed = True
            path = store.store_id.changelog(result.version, result.checkpoint_id)
            if spec.async_upload:
                upload_ms = 0.0
                _forget_when_done(uploader, path)
            else:
                upload_ms = _await_upload(uploader, path)
            meta.update(
                checkpoint_id=result.checkpoint_id,
                commit_ms=result.metrics.commit_ms,
                upload_ms=upload_ms,
                changelog_bytes=result.metrics.changelog_bytes,
                changelog_records=result.metrics.records,
            )
        else:
            store.abort()
            meta.update(checkpoint_id=None, commit_ms=0.0, upload_ms=0.0, changelog_bytes=0, changelog_records=0)
        processor.close()
        yield from clock.drain(out)
        meta["output_rows"] = out.count
        meta["task_ms"] = (time.perf_counter() - t_start) * 1000
        meta["phases"] = _task_phases(phases, clock, process_ms, meta["task_ms"], start_rss)
        if spec.results is not None:  # the sink's job runs this task: its result goes to the driver this way
            spec.results.add([json.dumps(meta)])
        else:
            yield out.meta(meta)
    except CorruptStateError as e:
        where = _locate_corrupt_changelog(spec, store)
        if not committed:
            store.abort()
        raise CorruptStateError(f"{e}{where}") from None
    except BaseException:
        if not committed:
            store.abort()
        raise


def fire_timers(
    ctx: StateContext,
    processor: StatefulProcessor,
    fired: list[tuple[bytes, int]],
    timer_values: TimerValues,
    handler_key: Callable[[tuple[Any, ...]], Any] | None,
    add: Callable[[Any], None],
) -> Iterator[None]:
    """Run ``handleExpiredTimer`` for each fired ``(gk, expiry)`` (`StateContext.expired_timers`), in time order, with
    its key current; `add` takes (and consumes) each handler's output. As in PySpark, the firing timer is listed
    while its handler runs, and deleted after it. Yields after each timer: the task drains its output then. Shared
    with the tester (store/spark/tws_tester.py); `handler_key` shapes the key the handler gets (None: the tuple)."""
    for gk, expiry in fired:
        key = ctx.decode_gk(gk)
        ctx.set_key(key)
        add(
            processor.handleExpiredTimer(
                key if handler_key is None else handler_key(key), timer_values, ExpiredTimerInfo(expiry)
            )
        )
        ctx.delete_timer(expiry)
        yield


def _timer_key(spec: TaskSpec, schema: pa.Schema) -> Callable[[tuple[Any, ...]], Any]:
    """The key handleExpiredTimer gets, as PySpark's operator hands it: a ``Row`` of the key columns (the JVM
    sends the timer's key back as one), its timestamps naive -- in local time in transformWithState
    (``TimestampType.fromInternal``), wall times in the session time zone in transformWithStateInPandas."""
    make = functools.partial(tuple.__new__, row_class(spec.key_columns))
    types = [schema.field(c).type for c in spec.key_columns]
    zoned = [i for i, t in enumerate(types) if pa.types.is_timestamp(t) and t.tz is not None]
    if not zoned:
        return make
    zone = spec.session_time_zone if spec.input_format == "pandas" else None

    def key(values: tuple[Any, ...]) -> Any:
        out = list(values)
        for i in zoned:
            if out[i] is not None:
                out[i] = _naive(out[i], zone)
        return make(out)

    return key


def _frame_key(spec: TaskSpec, schema: pa.Schema) -> Callable[[tuple[Any, ...]], tuple[Any, ...]] | None:
    """The key PySpark's operators hand handleInputRows and handleInitialState, where it is not the key as it is
    (None): a struct is a ``dict`` (the task keeps it as a ``Row``, which hashes and encodes in field order); and
    transformWithStateInPandas takes the key from the frame's rows, so a timestamp is a naive ``pandas.Timestamp``
    (a ``TIMESTAMP`` a wall time in the session time zone)."""
    types = [schema.field(c).type for c in spec.key_columns]
    structs = [i for i, t in enumerate(types) if pa.types.is_struct(t)]
    stamps = [i for i, t in enumerate(types) if pa.types.is_timestamp(t)] if spec.input_format == "pandas" else []
    if not stamps and not structs:
        return None
    timestamp: Any = importlib.import_module("pandas").Timestamp if stamps else None
    zone = spec.session_time_zone

    def key(values: tuple[Any, ...]) -> tuple[Any, ...]:
        out = list(values)
        for i in stamps:
            if out[i] is not None:
                ts = timestamp(out[i])
                out[i] = ts if ts.tzinfo is None else ts.tz_convert(zone).tz_localize(None)
        for i in structs:
            if out[i] is not None:
                out[i] = out[i].asDict(recursive=True)
        return tuple(out)

    return key


def _naive(value: dt.datetime, zone: str | None) -> dt.datetime:
    """`value` as a naive wall time in `zone` (None: local time)."""
    if zone is None:
        return value.astimezone().replace(tzinfo=None)
    pandas: Any = importlib.import_module("pandas")
    converted: dt.datetime = pandas.Timestamp(value).tz_convert(zone).tz_localize(None).to_pydatetime()
    return converted


def _build(spec: TaskSpec, partition: int) -> tuple[StateStore, PartitionBuild]:
    """New partition `partition` of the rescale the batch starts with, built into this worker's store of
    it (`build_partition`) and left loaded at the new version for the batch: no job of its own, no load
    of what was just written. Its changelog is uploaded before the task goes on (the driver commits the
    rescale's record after the job, then the batch's)."""
    assert spec.rescale is not None
    uploader = CACHE.uploader(spec)
    store = CACHE.store(spec, partition)
    try:
        sources = SourceStores(uploader, spec.rescale, spec.store_config, functools.partial(_cached, spec))
        try:
            build = build_partition(
                uploader, spec.rescale, TypedStateKeys(), spec.store_config, partition, sources, into=store
            )
        finally:
            sources.close()
        _await_upload(uploader, store.store_id.changelog(spec.rescale.new_version, build.checkpoint_id))
        store.load(spec.rescale.new_version, build.checkpoint_id)  # what it holds: a reuse
    except BaseException:
        CACHE.drop(spec, partition)
        raise
    return store, build


def _cached(spec: TaskSpec, partition: int) -> StateStore | None:
    """This worker's store of `partition` if it holds one (an old partition it ran before a rescale)."""
    return CACHE.store(spec, partition) if CACHE.holds(spec, partition) else None


def _load(spec: TaskSpec, partition: int) -> StateStore:
    """The partition's store loaded at the batch's version, from this worker's cache when it can.

    A cached store that contradicts the root (its commit records or snapshots name other attempts: the
    root was deleted and written again, as in a notebook that starts over) is dropped and the load redone
    from the root alone, once.
    """
    warm = CACHE.holds(spec, partition)
    try:
        return _load_cached(spec, partition)
    except LineageError as e:
        if not warm:
            raise
        log.warning(
            "statekeeper %s/%d: this worker's cached store disagrees with %s (%s); loading it afresh",
            spec.operator,
            partition,
            spec.root,
            e,
        )
    return _load_cached(spec, partition)


def _load_cached(spec: TaskSpec, partition: int) -> StateStore:
    """Load the cached (or a new) store of `partition`; a failed load drops it from the cache."""
    store = CACHE.store(spec, partition)
    try:
        return store.load(spec.version, spec.load_ids[partition] or None)
    except BaseException:
        CACHE.drop(spec, partition)
        raise


def _task_phases(
    phases: InputPhases, clock: OutputClock, process_ms: float, task_ms: float, start_rss: int
) -> dict[str, float]:
    """The task's trace: where its time went (ms), when it ran (wall clock, epoch ms: places the task
    within its Spark job), its worker's reuse, its memory as the task began and its peak."""
    inside = phases.wait_ms - phases.first_batch_ms + phases.convert_ms + clock.build_ms + clock.emit_ms
    ended_at_ms = time.time() * 1000
    return {
        "started_at_ms": ended_at_ms - task_ms,
        "ended_at_ms": ended_at_ms,
        "first_batch_ms": phases.first_batch_ms,
        "input_wait_ms": max(0.0, phases.wait_ms - phases.first_batch_ms),
        "convert_ms": phases.convert_ms,
        "user_state_ms": max(0.0, process_ms - inside),
        "output_build_ms": clock.build_ms,
        "output_emit_ms": clock.emit_ms,
        "input_chunks": float(phases.chunks),
        "max_chunk_mb": phases.max_chunk_bytes / 2**20,
        "worker_tasks_before": float(_WORKER["tasks"]),
        "worker_peak_rss_mb": _peak_rss_mb(),
        "worker_start_rss_mb": start_rss / 2**20,
        "rocksdb_mb": shared_memory().cache.get_usage() / 2**20,
        "worker_open_stores": float(len(CACHE.stores)),
    }


def _peak_rss_mb() -> float:
    """The worker's peak RSS since this task started (`reset_peak_rss` in `run_task`; elsewhere since the worker
    started)."""
    peak = peak_rss()
    if peak is not None:
        return peak / 2**20
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _locate_corrupt_changelog(spec: TaskSpec, store: StateStore, window: int = 100) -> str:
    """On a value that does not decode: the committed changelog that wrote it (of the last `window`)."""
    try:
        fm = spec.fm_factory(spec.root) if spec.fm_factory else open_file_manager(spec.root)
        log = CommitLog(fm)
        partition = store.store_id.partition
        versions = []
        for v in range(max(1, spec.version - window + 1), spec.version + 1):
            record = log.get(v)
            ids = None if record is None else record.checkpoint_ids.get(spec.operator)
            if ids is not None and partition < len(ids):
                versions.append((v, ids[partition]))
        found = [e for e in check_typed_state(store, fm, versions) if " in changelog " in e]
    except Exception as e:
        return f" (could not locate the changelog: {e})"
    return f"; found: {found[0]}" if found else ""


def _await_upload(uploader: AsyncUploader, path: str) -> float:
    """Wait until the changelog at `path` is in the checkpoint; returns how long its upload took (ms)."""
    pending = uploader.pending(path)
    if pending is None:
        return 0.0
    upload_ms = pending.result().upload_ms
    uploader.forget(path)
    return upload_ms


def _forget_when_done(uploader: AsyncUploader, path: str) -> None:
    pending = uploader.pending(path)
    if pending is not None:
        pending._future.add_done_callback(lambda _f: uploader.forget(path))


def _task_attempt() -> tuple[int, int]:
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
    except ImportError:  # pragma: no cover - pyspark is a dependency
        tc = None
    if tc is None:
        return 0, -1
    return int(tc.attemptNumber()), int(tc.taskAttemptId())


__all__ = ["CACHE", "MARKER_COL", "META_COL", "PID_COL", "TaskSpec", "fire_timers", "run_task"]
