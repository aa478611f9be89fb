"""Import a Spark streaming query's state into a statekeeper operator: one Spark job, all partitions or none.

A job that ran for months on Spark's own state store moves over without replaying its input:

1. Spark's state data source reads the state of the checkpoint's last committed batch ``B``
   (store/spark/spark_checkpoint.py): every variable of a ``transformWithState`` operator, the group state
   of ``applyInPandasWithState``, or an aggregation's buffer, with the timers (a TTL'd value with the
   expiry Spark gave it).
2. The rows go through the same tasks job as a batch of `StatefulOperator` (`TasksPlan`, `run_task`): routed
   to the partition that owns their key group, sorted by key in the task, converted per partition within
   ``task_input_budget_bytes``, written by `_StateWriter` through the typed state variables (schemas
   recorded as a first batch records them) and committed as version 1 of each partition under a fresh
   checkpoint id. Nothing but one result row per partition reaches the driver.
3. The driver then writes ONE commit record naming every partition's id and the layout, with batch id
   ``B``: the import is committed only if every partition committed, and a failed import leaves only
   uncommitted files (orphans for maintenance) and can be run again. Before it, the event-time record of
   batch ``B`` (Spark's watermarks of ``B`` and ``B + 1``) is written as a batch writes its own, so a
   query with event time continues from Spark's watermark, and the progress is copied to the continuation
   (removed again if the copy or the commit fails).

The statekeeper query continues at batch ``B + 1`` from a copy of the Spark checkpoint's progress
(``continuation_checkpoint``): batch ``B + 1`` loads version 1 (store/spark/restart.py maps batch ids to
versions through the commit records), so no input is lost or processed twice.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import CheckpointFileExistsError, ConfigurationError, StatekeeperError
from statekeeper.store.files import open_file_manager
from statekeeper.store.files.paths import validate_component
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.layout import event_time_path
from statekeeper.store.spark.api import BatchStatefulProcessor, TimerValues, keys_of
from statekeeper.store.spark.batch_records import BatchRecords
from statekeeper.store.spark.event_time import NEXT_WATERMARK_FIELD
from statekeeper.store.spark.executor import META_COL, TaskSpec, run_task
from statekeeper.store.spark.metrics import PartitionMetrics
from statekeeper.store.spark.routing import routable, stored_key_column
from statekeeper.store.spark.schemas import DEFAULT_MAX_KEY_GROUPS, NEVER, Runs, merge_runs, runs_earliest
from statekeeper.store.spark.spark_checkpoint import (
    COPIED,
    TIMER_COL,
    TTL_FIELD,
    VALUE_PREFIX,
    VAR_COL,
    CheckpointFiles,
    SparkOperatorState,
    SparkVariable,
    describe_operator,
    last_committed_batch,
    state_rows,
)
from statekeeper.store.spark.state import check_max_key_groups
from statekeeper.store.spark.task_input import BATCH_INPUT_BUDGET_BYTES, pylist, run_starts, struct_tuples
from statekeeper.store.spark.tasks_plan import TasksPlan, sort_in_task, tasks_job_settings
from statekeeper.store.spark.worker_cache import FileManagerFactory
from statekeeper.store.state_store import StoreConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from statekeeper.store.spark.handle import StatefulProcessorHandle

log = logging.getLogger(__name__)

KEYS_COL = "keys"
TIMERS_COL = "timers"
STORED_KEY_COL = "__skimp_stored_key"
"""Each row's stored grouping key, computed by Spark (routing.stored_key_column) for routable keys."""
IMPORTED_VERSION = 1


class SparkImportError(StatekeeperError):
    """The import job failed: nothing was committed, and the import can be run again."""


@dataclass(frozen=True)
class ImportSummary:
    """What an import did."""

    operator: str
    root: str
    spark_checkpoint: str
    spark_operator: str
    batch_id: int
    """The Spark batch whose state was imported: the statekeeper query continues at ``batch_id + 1``."""
    version: int
    partitions: int
    keys: int
    rows: int
    """State rows written (one per value or list, one per map entry), as ``numRowsTotal`` counts them."""
    timers: int
    bytes: int
    """Changelog bytes written to the root."""
    seconds: float
    worker_peak_rss_mb: float
    """The largest peak RSS of a Python worker that wrote a partition."""
    variables: dict[str, str]
    """Statekeeper variable name -> kind."""
    continuation_checkpoint: str | None
    next_watermark_ms: int = 0
    """The event-time watermark the statekeeper query's first batch runs with (Spark's next batch's)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        cont = (
            f"; continue the query from checkpoint {self.continuation_checkpoint} (its next batch: {self.batch_id + 1})"
            if self.continuation_checkpoint
            else ""
        )
        if self.next_watermark_ms:
            cont += f"; event-time watermark {self.next_watermark_ms} ms"
        return (
            f"imported {self.keys} keys ({self.rows} state rows, {self.timers} timers, {self.bytes} bytes) of "
            f"{self.spark_operator} at batch {self.batch_id} into {self.root} operator {self.operator!r} version "
            f"{self.version} ({self.partitions} partitions) in {self.seconds:.1f} s{cont}"
        )


class _StateWriter(BatchStatefulProcessor):
    """Writes the imported rows of one partition through the typed state variables: their schemas are
    declared (recorded in the store as a first batch records them), ValueStates in bulk (``updateMany``),
    lists and maps per key. Its output is the number of keys of each chunk (each key is in one chunk)."""

    def __init__(self, variables: tuple[SparkVariable, ...], key_columns: tuple[str, ...]) -> None:
        self.variables = variables
        self.key_columns = key_columns

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._ctx = handle._ctx
        self._states: list[Any] = []
        for v in self.variables:
            if v.kind == "value":
                self._states.append(handle.getValueState(v.name, v.schema))
            elif v.kind == "list":
                self._states.append(handle.getListState(v.name, v.schema))
            else:
                self._states.append(handle.getMapState(v.name, v.user_key_schema, v.schema))

    def handleBatch(self, rows: pa.Table, timerValues: TimerValues) -> pa.Table:  # noqa: N802, N803 - the API's names
        which = rows.column(VAR_COL)
        ctx = self._ctx
        for i, (var, state) in enumerate(zip(self.variables, self._states, strict=True)):
            part = rows.filter(pc.equal(which, i))
            if part.num_rows == 0:
                continue
            column = part.column(f"{VALUE_PREFIX}{i}")
            if var.kind == "value" and not var.ttl:  # a key once per variable, into an empty store: no reads
                state._write_many(self._stored_keys(part), struct_tuples(column), part.num_rows)
                continue
            keys = keys_of(part, list(self.key_columns))
            values = column.to_pylist()
            if var.ttl:
                _write_expiring(var, state, keys, values)
            elif var.kind == "list":
                for key, items in zip(keys, values, strict=True):
                    ctx.set_key(key)
                    state.put([_row(e) for e in items or ()])
            else:
                for key, entries in zip(keys, values, strict=True):
                    ctx.set_key(key)
                    for user_key, value in entries or ():
                        state.updateValue(_row(user_key), _row(value))
        timed = rows.filter(pc.is_valid(rows.column(TIMER_COL)))
        if timed.num_rows:
            for key, expiry in zip(
                keys_of(timed, list(self.key_columns)), timed.column(TIMER_COL).to_pylist(), strict=True
            ):
                ctx.set_key(key)
                ctx.register_timer(int(expiry))
        ctx.clear_key()
        keys_here = len(run_starts(rows, self.key_columns))
        return pa.table(
            {KEYS_COL: pa.array([keys_here], pa.int64()), TIMERS_COL: pa.array([timed.num_rows], pa.int64())}
        )

    def _stored_keys(self, part: pa.Table) -> list[bytes]:
        """The rows' stored grouping keys: Spark's (`STORED_KEY_COL`) where it computed them, checked against
        ours on the first row; else encoded here."""
        columns = list(self.key_columns)
        if STORED_KEY_COL not in part.column_names:
            return [self._ctx.encode_gk(k) for k in keys_of(part, columns)]
        gks: list[bytes] = pylist(part.column(STORED_KEY_COL))
        ours = self._ctx.encode_gk(keys_of(part.slice(0, 1), columns)[0])
        if gks[0] != ours:
            raise StatekeeperError(f"Spark encoded key {gks[0]!r} as stored key, statekeeper {ours!r}: a routing bug")
        return gks


def _write_expiring(var: SparkVariable, state: Any, keys: list[tuple[Any, ...]], values: list[Any]) -> None:
    """A TTL'd variable's values with the expiries Spark gave them, a list's per element (a later write resets
    them by the TTL the statekeeper query declares)."""
    ctx = state._ctx
    for key, value in zip(keys, values, strict=True):
        ctx.set_key(key)
        if var.kind == "value":
            _put_expiring(state, ctx.require_gk(), _row(value["value"]), [(value[TTL_FIELD], 1)])
        elif var.kind == "list" and value:
            runs = merge_runs([(e[TTL_FIELD], 1) for e in value])
            _put_expiring(state, ctx.require_gk(), [_row(e["value"]) for e in value], runs)
        elif var.kind == "map":
            for user_key, entry in value or ():
                _put_expiring(state, state._skey(_row(user_key)), _row(entry["value"]), [(entry[TTL_FIELD], 1)])


def _put_expiring(state: Any, storage_key: bytes, value: Any, runs: Runs) -> None:
    """What a write under a TTL stores (the value with its expiry, the eviction index entry): `runs` holds
    the expiry (a list's: of each run of its elements)."""
    ctx = state._ctx
    if len(runs) == 1:
        state._cf.put(storage_key, state._value_bytes(value, runs[0][0]))
    else:
        state._value_bytes(value[:1], None)  # records the schema of a variable declared without one
        state._cf.put(storage_key, state._fmt.encode_runs(value, runs))
    if runs_earliest(runs) != NEVER:
        ctx.index_ttl(state._name_b, storage_key, runs_earliest(runs))
    ctx.rows_updated += 1
    ctx.rows_delta += 1


def _row(value: Any) -> Any:
    """A struct value as a tuple in field order (Arrow gives dicts; nested structs stay dicts, which the
    typed codec takes by field name)."""
    return tuple(value.values()) if isinstance(value, dict) else value


def import_spark_state(
    spark: SparkSession,
    spark_checkpoint: str,
    root: str,
    operator: str,
    *,
    operator_id: int = 0,
    state_name: str | None = None,
    num_partitions: int | None = None,
    max_key_groups: int = DEFAULT_MAX_KEY_GROUPS,
    continuation_checkpoint: str | None = None,
    batch_id: int | None = None,
    store_config: StoreConfig | None = None,
    file_manager_factory: FileManagerFactory | None = None,
    task_input_budget_bytes: int = BATCH_INPUT_BUDGET_BYTES,
    on_progress: Callable[[str], None] | None = None,
) -> ImportSummary:
    """Import the state of stateful operator `operator_id` of the Spark checkpoint `spark_checkpoint` (at its
    last committed batch, or `batch_id`) into a new statekeeper operator `operator` under `root`.

    `num_partitions` defaults to the Spark operator's; `state_name` names the ValueState taking an
    ``applyInPandasWithState``'s group state (default ``group_state``) or an aggregation's buffer (``agg``).
    With `continuation_checkpoint`, the Spark checkpoint's progress (not its state) is copied there: start
    the statekeeper query on it, with the same sources, and it continues at the next batch.
    `on_progress` gets each progress line (they are logged too). The root must hold no committed state.
    """
    t0 = time.perf_counter()
    say = _Say(on_progress)
    validate_component(operator, "operator name")
    fm = file_manager_factory(root) if file_manager_factory else open_file_manager(root)
    commit_log = CommitLog(fm)
    if commit_log.latest() > 0:
        raise ConfigurationError(
            f"{root} already holds committed state (version {commit_log.latest()}): import into a new state root"
        )
    continuation = _prepare_continuation(spark, continuation_checkpoint, spark_checkpoint, batch_id)
    source = describe_operator(
        spark, spark_checkpoint, operator_id=operator_id, state_name=state_name, batch_id=batch_id
    )
    if continuation is not None and source.other_operators:
        raise ConfigurationError(
            f"{spark_checkpoint!r} has stateful operators besides {operator_id} ({source.operator_name}): "
            f"{', '.join(source.other_operators)}, whose state is not imported; the continuation holds no state/, "
            "so a query keeping them would not start on it (Spark: "
            "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY) and one dropping them would lose their state: "
            "import without continuation_checkpoint to read the state only"
        )
    say(f"reading {source.describe()}")
    n = num_partitions or source.partitions
    groups = check_max_key_groups(max_key_groups)
    if not isinstance(n, int) or not 1 <= n <= 10_000:
        raise ConfigurationError(f"num_partitions must be an integer in [1, 10000], got {n!r}")
    rows = state_rows(spark, source)
    layout = KeyGroupLayout(n, groups) if routable(rows.schema, source.key_columns) and n <= groups else None
    if layout is not None:  # Spark encodes the keys it routes anyway: the tasks take them as they are
        rows = rows.withColumn(STORED_KEY_COL, stored_key_column(rows.schema, source.key_columns, groups))
    spec = TaskSpec(
        root=root,
        operator=operator,
        num_partitions=n,
        version=IMPORTED_VERSION - 1,
        load_ids=("",) * n,
        commit=True,
        batch_ts_ms=int(time.time() * 1000),
        key_columns=source.key_columns,
        processor=_StateWriter(source.variables, source.key_columns),
        output_schema=pa.schema([(KEYS_COL, pa.int64()), (TIMERS_COL, pa.int64()), (META_COL, pa.string())]),
        input_format="rows",
        store_config=store_config or StoreConfig(),
        fm_factory=file_manager_factory,
        max_key_groups=groups,
        input_budget_bytes=task_input_budget_bytes,
        sort_input=sort_in_task(rows.schema, source.key_columns),
        routing=layout,
    )
    say(f"writing {n} partitions ({'key groups' if layout else 'hash routing'}) into {root} operator {operator!r}")
    with tasks_job_settings(rows), _StageProgress(spark, say):
        plan = TasksPlan.build(spark, rows.schema, source.key_columns, n, layout).input(rows)
        out_struct = f"{KEYS_COL} long, {TIMERS_COL} long, {META_COL} string"
        try:
            results = plan.mapInArrow(functools.partial(run_task, spec), out_struct).collect()
        except Exception as e:
            detail = str(e)
            refused = next((ln.strip() for ln in detail.splitlines() if "ConfigurationError:" in ln), "")
            raise SparkImportError(
                f"importing {spark_checkpoint} into {root} operator {operator!r} failed; nothing was committed (the "
                f"partitions' files are uncommitted orphans) and the import can be run again: "
                + (f"{refused}; " if refused else "")
                + detail[:2000]
            ) from e
    metas, keys, timers = _results(results, n)
    copied = continuation.copy_progress_from(spark, spark_checkpoint) if continuation else None
    try:
        _carry_watermark(fm, operator, source)
        BatchRecords(fm, commit_log, operator).commit(
            IMPORTED_VERSION, [m.checkpoint_id or "" for m in metas], source.batch_id, layout
        )
    except BaseException:
        if continuation is not None:  # nothing committed: neither is the copy, so the import runs again
            continuation.discard(spark)
        raise
    summary = ImportSummary(
        operator=operator,
        root=root,
        spark_checkpoint=spark_checkpoint,
        spark_operator=source.operator_name,
        batch_id=source.batch_id,
        version=IMPORTED_VERSION,
        partitions=n,
        keys=keys,
        rows=sum(m.rows_total for m in metas),
        timers=timers,
        bytes=sum(m.changelog_bytes for m in metas),
        seconds=time.perf_counter() - t0,
        worker_peak_rss_mb=max(m.phases.get("worker_peak_rss_mb", 0.0) for m in metas),
        variables={v.name: v.kind for v in source.variables},
        continuation_checkpoint=copied,
        next_watermark_ms=source.next_watermark_ms,
    )
    say(summary.summary())
    return summary


def _carry_watermark(fm: Any, operator: str, source: SparkOperatorState) -> None:
    """The imported batch's event-time record (before its commit record, as a batch writes it): a query with
    event time continues from Spark's watermarks (late rows, event-time timers), whatever its delay."""
    path = event_time_path(operator, source.batch_id)
    record = {
        "batch_id": source.batch_id,
        "watermark_ms": source.watermark_ms,
        "max_event_ms": None,
        NEXT_WATERMARK_FIELD: source.next_watermark_ms,
    }
    data = json.dumps(record).encode()
    try:
        with fm.create(path, exclusive=True) as f:
            f.write(data)
    except CheckpointFileExistsError:  # an earlier attempt of this import
        if fm.read_bytes(path) != data:
            raise ConfigurationError(
                f"{fm.root_uri} has an event-time record of batch {source.batch_id} of {operator!r} from another "
                "import: import into a new state root"
            ) from None


def _results(rows: Iterable[Any], n: int) -> tuple[list[PartitionMetrics], int, int]:
    """Each partition's result (exactly one of each of ``0..n-1``), and the keys and timers counted."""
    metas: dict[int, PartitionMetrics] = {}
    keys = timers = 0
    for r in rows:
        if r[META_COL] is None:
            keys += r[KEYS_COL]
            timers += r[TIMERS_COL]
            continue
        m = PartitionMetrics.from_meta(json.loads(r[META_COL]))
        metas[m.partition] = m
    if sorted(metas) != list(range(n)) or not all(m.checkpoint_id for m in metas.values()):
        raise ConfigurationError(f"the import job returned results of partitions {sorted(metas)}, expected 0..{n - 1}")
    return [metas[p] for p in range(n)], keys, timers


@dataclass(frozen=True)
class _Continuation:
    location: str
    files: list[str]
    """The Spark checkpoint's progress files, listed (and checked) before the job."""

    def copy_progress_from(self, spark: SparkSession, spark_checkpoint: str) -> str:
        """Before the commit record: a copy that fails is removed (the location was empty) and nothing is
        committed, so the import runs again as it would after a failed job."""
        target = CheckpointFiles(spark, self.location)
        try:
            CheckpointFiles(spark, spark_checkpoint).copy_progress(target, self.files)
        except ConfigurationError:  # occupied since the import started (another import's copy): not ours to remove
            raise
        except Exception as e:
            self.discard(spark)
            raise SparkImportError(
                f"copying the progress of {spark_checkpoint} to the continuation checkpoint {self.location} failed; "
                f"nothing was committed and the import can be run again: {str(e)[:2000]}"
            ) from e
        log.info("statekeeper import: copied %d files of %s to %s", len(self.files), spark_checkpoint, self.location)
        return self.location

    def discard(self, spark: SparkSession) -> None:
        """Remove the copy (the location was empty before it)."""
        CheckpointFiles(spark, self.location).remove(COPIED)


def _prepare_continuation(
    spark: SparkSession, location: str | None, spark_checkpoint: str, batch_id: int | None
) -> _Continuation | None:
    """Checked before the job (an occupied location fails the import before it writes anything). The copied
    progress continues after the last committed batch: the state of an earlier `batch_id` would skip the
    input of the batches after it."""
    if location is None:
        return None
    last = last_committed_batch(CheckpointFiles(spark, spark_checkpoint)) if batch_id is not None else None
    if last is not None and batch_id is not None and batch_id < last:
        raise ConfigurationError(
            f"batch_id {batch_id} with a continuation checkpoint: {spark_checkpoint!r} has committed batches up to "
            f"{last}, which the copied progress continues after; import the last committed batch to continue"
        )
    if CheckpointFiles(spark, location).names(""):
        raise ConfigurationError(
            f"the continuation checkpoint {location!r} is not empty: give a new location for the statekeeper query"
        )
    return _Continuation(location, CheckpointFiles(spark, spark_checkpoint).progress_files())


class _Say:
    """Progress lines: logged, and passed to the caller's callback."""

    def __init__(self, callback: Callable[[str], None] | None) -> None:
        self.callback = callback

    def __call__(self, line: str) -> None:
        log.info("statekeeper import: %s", line)
        if self.callback is not None:
            self.callback(line)


class _StageProgress:
    """While the job runs, a line every `interval` seconds with its tasks done (classic sessions)."""

    def __init__(self, spark: SparkSession, say: _Say, interval: float = 10.0) -> None:
        self.say = say
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._tracker: Any = spark.sparkContext.statusTracker()
        except Exception:  # Spark Connect
            self._tracker = None

    def __enter__(self) -> _StageProgress:
        if self._tracker is not None:
            self._thread = threading.Thread(target=self._run, name="statekeeper-import-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                stages = [self._tracker.getStageInfo(s) for s in self._tracker.getActiveStageIds()]
            except Exception as e:  # the session is going away
                log.debug("statekeeper import: no progress (%s)", e)
                return
            for st in stages:
                if st is not None:
                    self.say(f"stage {st.stageId}: {st.numCompletedTasks}/{st.numTasks} tasks done")


__all__ = ["ImportSummary", "SparkImportError", "import_spark_state"]
