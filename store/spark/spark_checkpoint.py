"""What an import reads of a Spark streaming checkpoint: its last committed batch, its stateful operator
and that operator's state as rows (through Spark's own state data source), and the copy of its source
progress that lets a statekeeper query continue where the Spark query stopped.

Spark writes a query's progress as ``offsets/<batch>`` (what each batch reads), ``commits/<batch>`` (the
batches done), ``sources/`` (a file source's log of the files it has seen) and ``metadata`` (the query's
id), and its operators' state under ``state/``. The state of the last committed batch ``B`` is read with
``spark.read.format("statestore")`` at ``batchId = B``: one reader per state variable of a
``transformWithState`` operator (``stateVarName``, lists and maps unflattened), one for the group state
of ``applyInPandasWithState`` / ``flatMapGroupsWithState`` and for the aggregation buffer of a
``groupBy().agg()``, plus the registered timers; a TTL'd variable's values come with their expiries
(``struct<value, ttlExpirationMs>``). Everything is read by Spark tasks; the driver only lists ``commits/``,
reads the operator's metadata row and the watermarks of batch ``B`` (``offsets/B``'s ``batchWatermarkMs``,
``commits/B``'s ``nextBatchWatermarkMs``), which the import records so that event time continues.

The continuation copies everything but ``state/`` to a new checkpoint location: a query started there
with the same sources sees batches ``0..B`` committed and runs batch ``B + 1`` with the same offsets the
Spark query would have (re-running it if the Spark query had planned it but not committed it), so no
input is lost or read twice. Spark refuses the old location itself: its ``state/`` metadata names a
stateful operator the new plan does not have.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statekeeper.store.errors import ConfigurationError, CorruptFileError
from statekeeper.store.formats.framing import parse_json
from statekeeper.store.formats.typed_schema import DataType, to_schema
from statekeeper.store.spark.state import validate_state_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

VAR_COL = "__skimp_var"
"""Which variable a row holds (its index in `SparkOperatorState.variables`; -1: a timer only)."""
TIMER_COL = "__skimp_timer"
"""A timer of the row's key (ms), or null."""
VALUE_PREFIX = "__skimp_value_"
"""The value column of variable i: ``VALUE_PREFIX + str(i)``."""
COPIED = ("metadata", "offsets", "commits", "sources")
"""What the continuation copies of a Spark checkpoint (everything but ``state/``)."""
TWS_OPERATORS = ("transformWithStateExec", "transformWithStateInPandasExec", "transformWithStateInPySparkExec")
GROUP_STATE_OPERATORS = ("applyInPandasWithState", "flatMapGroupsWithState")
AGGREGATION_OPERATORS = ("stateStoreSave",)
TTL_FIELD = "ttlExpirationMs"
"""The expiry beside each value of a TTL'd variable, as Spark's state data source reads it."""
MAX_LOG_BYTES = 1 << 20
"""The most of a Spark offset or commit log file the import reads (their metadata line comes second)."""
MAX_PROGRESS_DEPTH = 3
"""The depth of Spark's progress layout (``sources/<source>/<batch>``): the continuation copies no deeper."""
NO_TIMEOUT = -1
"""Spark's timeout timestamp of a group state without a pending timeout."""


@dataclass(frozen=True)
class SparkVariable:
    """One state variable as statekeeper stores it, and where its values are in Spark's state rows."""

    name: str
    kind: str
    """``value``, ``list`` or ``map``."""
    schema: DataType
    """A value's schema (a list's element, a map's value)."""
    user_key_schema: DataType | None
    """A map's key schema."""
    spark_name: str | None
    """Spark's ``stateVarName`` (transformWithState), None for the operator's single state."""
    column: str
    """The column of Spark's state rows holding the value (``value``, ``list_value``, ``map_value``,
    ``value.groupState``)."""
    ttl: bool = False
    """Declared with a TTL: each value (list element, map entry) of the column is a struct of ``value`` and
    ``ttlExpirationMs``, the expiry Spark set at its write."""


@dataclass(frozen=True)
class SparkOperatorState:
    """A stateful operator of a Spark checkpoint, as the import reads it."""

    checkpoint: str
    operator_id: int
    operator_name: str
    flavour: str
    """``transformWithState``, ``applyInPandasWithState`` or ``aggregation``."""
    batch_id: int
    """The last committed batch: its state is what is imported."""
    partitions: int
    key_columns: tuple[str, ...]
    variables: tuple[SparkVariable, ...]
    timers: str
    """Where timers come from: ``registered`` (transformWithState with a time mode), ``group_timeout``
    (the group state's timeout) or ``""`` (none)."""
    watermark_ms: int = 0
    """The event-time watermark the imported batch ran with (rows at or before it are late in the next)."""
    next_watermark_ms: int = 0
    """The watermark Spark's next batch runs with: the statekeeper query's first batch starts from it."""
    other_operators: tuple[str, ...] = ()
    """The checkpoint's other stateful operators (``"1 (dedupe)"``), whose state is not imported."""

    def describe(self) -> str:
        names = ", ".join(f"{v.name} ({v.kind})" for v in self.variables)
        return (
            f"{self.operator_name} (operator {self.operator_id}, {self.partitions} partitions, key "
            f"{list(self.key_columns)}) at batch {self.batch_id}: {names}"
            + (f"; timers: {self.timers}" if self.timers else "")
            + (f"; next watermark: {self.next_watermark_ms} ms" if self.next_watermark_ms else "")
        )


class CheckpointFiles:
    """Files of a Spark checkpoint through Hadoop's FileSystem in the driver's JVM (any scheme Spark reads:
    file, s3a, hdfs, abfs ...); through the local file system where there is no JVM (Spark Connect)."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.location = location.rstrip("/")
        self._jvm: Any = None
        self._conf: Any = None
        try:
            self._jvm = spark._jvm
            self._conf = spark._jsc.hadoopConfiguration()
        except Exception:  # Spark Connect: no JVM on this side
            self._jvm = None
        if self._jvm is None and "://" in self.location and not self.location.startswith("file:"):
            raise ConfigurationError(
                f"Spark checkpoint {location!r}: without a driver JVM (Spark Connect) only local checkpoints can be "
                "imported; run the import from a classic Spark session"
            )

    def _local(self, name: str) -> str:
        base = self.location[len("file://") :] if self.location.startswith("file://") else self.location
        base = base[len("file:") :] if base.startswith("file:") else base
        return os.path.join(base, name) if name else base

    def _path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(f"{self.location}/{name}" if name else self.location)

    def names(self, directory: str) -> list[str]:
        """Names in `directory` of the checkpoint ([] when it does not exist)."""
        if self._jvm is None:
            path = self._local(directory)
            return sorted(os.listdir(path)) if os.path.isdir(path) else []
        path = self._path(directory)
        fs = path.getFileSystem(self._conf)
        if not fs.exists(path):
            return []
        return sorted(str(s.getPath().getName()) for s in fs.listStatus(path))

    def exists(self, name: str = "") -> bool:
        if self._jvm is None:
            return os.path.exists(self._local(name))
        path = self._path(name)
        return bool(path.getFileSystem(self._conf).exists(path))

    def read_text(self, name: str, limit: int = MAX_LOG_BYTES) -> str | None:
        """The first `limit` bytes of the checkpoint's file `name` as text (None when it does not exist)."""
        if self._jvm is None:
            path = self._local(name)
            if not os.path.isfile(path):
                return None
            with open(path, "rb") as f:
                return f.read(limit).decode("utf-8", "replace")
        jpath = self._path(name)
        fs = jpath.getFileSystem(self._conf)
        if not fs.exists(jpath):
            return None
        stream = fs.open(jpath)
        try:
            data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(
                stream, min(limit, fs.getFileStatus(jpath).getLen())
            )
        finally:
            stream.close()
        return bytes(data).decode("utf-8", "replace")

    def _kind(self, name: str) -> str:
        """``file``, ``dir``, ``link`` (not followed), ``other`` or ``missing``."""
        if self._jvm is None:
            try:
                mode = os.lstat(self._local(name)).st_mode
            except FileNotFoundError:
                return "missing"
            return next((k for k, test in _KINDS if test(mode)), "other")
        path = self._path(name)
        fs = path.getFileSystem(self._conf)
        try:
            status = fs.getFileLinkStatus(path)
        except Exception:  # Py4J: java.io.FileNotFoundException
            if fs.exists(path):
                raise
            return "missing"
        return (
            "link" if status.isSymlink() else "file" if status.isFile() else "dir" if status.isDirectory() else "other"
        )

    def progress_files(self) -> list[str]:
        """The files of `COPIED` (names relative to the checkpoint). The checkpoint is untrusted: a symlink (its
        target, anywhere, would be copied into the continuation), a special file or a tree deeper than Spark's
        layout (``sources/<source>/<batch>``) is refused, naming it."""
        found: list[str] = []
        todo = list(COPIED)
        while todo:
            name = todo.pop()
            kind = self._kind(name)
            if kind == "missing":  # a log Spark has not written (a query without a file source: no sources/)
                continue
            if kind == "file":
                found.append(name)
            elif kind == "dir" and name.count("/") < MAX_PROGRESS_DEPTH - 1:
                todo.extend(f"{name}/{child}" for child in self.names(name))
            else:
                what = {"dir": "a directory deeper than Spark's progress layout", "link": "a symlink"}.get(
                    kind, "not a file or directory"
                )
                raise ConfigurationError(
                    f"the Spark checkpoint {self.location!r} has {name!r}, {what}: Spark's progress "
                    f"({', '.join(COPIED)}) holds only its own files, and the continuation copies nothing else"
                )
        return sorted(found)

    def copy_progress(self, target: CheckpointFiles, files: list[str]) -> None:
        """Copy `files` (`progress_files`, file by file: nothing is followed) into `target`, which must be empty."""
        if target.names(""):
            raise ConfigurationError(
                f"the continuation checkpoint {target.location!r} is not empty: give a new location for the "
                "statekeeper query (the Spark query's own location keeps its state, which the new plan refuses)"
            )
        for name in files:
            if self._jvm is None or target._jvm is None:
                dst = target._local(name)
                os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
                shutil.copyfile(self._local(name), dst, follow_symlinks=False)
                continue
            src_path, dst_path = self._path(name), target._path(name)
            src_fs, dst_fs = src_path.getFileSystem(self._conf), dst_path.getFileSystem(target._conf)
            self._jvm.org.apache.hadoop.fs.FileUtil.copy(src_fs, src_path, dst_fs, dst_path, False, self._conf)

    def remove(self, names: Iterable[str]) -> None:
        """Delete `names` (files or trees) of this location, where they exist."""
        for name in names:
            if self._jvm is None:
                path = self._local(name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    os.remove(path)
                continue
            jpath = self._path(name)
            jpath.getFileSystem(self._conf).delete(jpath, True)


_KINDS: tuple[tuple[str, Callable[[int], bool]], ...] = (
    ("link", stat.S_ISLNK),
    ("file", stat.S_ISREG),
    ("dir", stat.S_ISDIR),
)


def _log_entry(files: CheckpointFiles, name: str, field: str) -> int | None:
    """`field` of the JSON line after the version line (``v1``) of Spark's log file `name`, when an integer."""
    text = files.read_text(name)
    lines = text.splitlines() if text else []
    if len(lines) < 2:
        return None
    try:  # nesting capped before parsing: the checkpoint is untrusted input
        value = parse_json(lines[1].encode(), name, "log entry").get(field)
    except (CorruptFileError, AttributeError):
        return None
    return value if type(value) is int else None


def watermarks(files: CheckpointFiles, batch: int) -> tuple[int, int]:
    """The event-time watermark batch `batch` ran with (``offsets/<batch>``'s ``batchWatermarkMs``) and the one
    Spark's next batch runs with (``commits/<batch>``'s ``nextBatchWatermarkMs``, else the planned next batch's
    ``batchWatermarkMs``); 0 (Spark's initial watermark) where the log has none."""
    ran = _log_entry(files, f"offsets/{batch}", "batchWatermarkMs") or 0
    following = _log_entry(files, f"commits/{batch}", "nextBatchWatermarkMs")
    if following is None:
        following = _log_entry(files, f"offsets/{batch + 1}", "batchWatermarkMs")
    return ran, max(ran, following or 0)


def batch_numbers(names: list[str]) -> list[int]:
    """The batch ids among a Spark log directory's file names (``0``, ``1``, ... ; not ``.crc`` or temp files)."""
    return sorted(int(n) for n in names if n.isascii() and n.isdigit())  # str.isdigit takes "²", int() does not


def last_committed_batch(files: CheckpointFiles) -> int:
    committed = batch_numbers(files.names("commits"))
    if not committed:
        raise ConfigurationError(
            f"the Spark checkpoint {files.location!r} has no committed batch (no commits/): nothing to import"
        )
    return committed[-1]


def describe_operator(
    spark: SparkSession,
    checkpoint: str,
    *,
    operator_id: int = 0,
    state_name: str | None = None,
    batch_id: int | None = None,
) -> SparkOperatorState:
    """The stateful operator `operator_id` of the Spark checkpoint and what the import will read of it.

    `state_name` names the statekeeper ValueState that takes the single state of an
    ``applyInPandasWithState`` (default ``group_state``, as `ApplyInPandasWithState` names it) or of an
    aggregation (default ``agg``). What Spark cannot read of the checkpoint (a malformed log or metadata file)
    is a `CorruptFileError` naming it, not a Py4J stack trace."""
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    try:
        return _describe(spark, checkpoint, operator_id, state_name, batch_id)
    except (Py4JError, PySparkException) as e:
        raise CorruptFileError(
            f"Spark's state data source cannot read operator {operator_id}: {spark_error(e)}; the checkpoint",
            checkpoint,
        ) from e


def spark_error(e: BaseException) -> str:
    """A Spark error's first informative line (not Py4J's "An error occurred while calling" or a stack frame)."""
    lines = (ln.strip().removeprefix(": ") for ln in str(e).splitlines())
    useful = [ln for ln in lines if ln and not ln.startswith(("An error occurred while calling", "at "))]
    return (useful[0] if useful else type(e).__name__)[:1000]


def _describe(
    spark: SparkSession, checkpoint: str, operator_id: int, state_name: str | None, batch_id: int | None
) -> SparkOperatorState:
    files = CheckpointFiles(spark, checkpoint)
    if not files.exists():
        raise ConfigurationError(f"the Spark checkpoint {checkpoint!r} does not exist")
    last = last_committed_batch(files)
    batch = last if batch_id is None else batch_id
    if not 0 <= batch <= last:
        raise ConfigurationError(f"batch {batch_id} is not committed in {checkpoint!r} (the last committed is {last})")
    every = spark.read.format("state-metadata").load(checkpoint).collect()
    rows = [r for r in every if int(r["operatorId"]) == operator_id]
    others = {int(r["operatorId"]): str(r["operatorName"]) for r in every if int(r["operatorId"]) != operator_id}
    if not rows:  # Spark's state-metadata source lists none at all when state/ holds a stray directory
        raise ConfigurationError(
            f"the Spark checkpoint {checkpoint!r} has no stateful operator {operator_id} (Spark's state-metadata "
            f"source lists {sorted(others) or 'none'}; state/ holds {files.names('state')[:20]})"
        )
    meta = rows[0]
    name = str(meta["operatorName"])
    partitions = int(meta["numPartitions"])
    props = _operator_properties(meta["operatorProperties"], f"{checkpoint}/state/{operator_id}/_metadata")
    if name in TWS_OPERATORS:
        if state_name is not None:
            raise ConfigurationError(
                f"state_name {state_name!r}: operator {operator_id} of {checkpoint!r} is a {name}, whose state "
                "variables keep their own names (state_name names an applyInPandasWithState's or aggregation's state)"
            )
        variables, timers = _tws_variables(spark, checkpoint, operator_id, batch, props)
        flavour = "transformWithState"
        probe = variables[0].spark_name if variables else None
    elif name in GROUP_STATE_OPERATORS or name in AGGREGATION_OPERATORS:
        group = name in GROUP_STATE_OPERATORS
        flavour = "applyInPandasWithState" if group else "aggregation"
        value = state_reader(spark, checkpoint, operator_id, batch).load().schema["value"].dataType
        fields = value.fieldNames()
        column = "value.groupState" if group and "groupState" in fields else "value"
        spark_type = value["groupState"].dataType if column != "value" else value
        spark_type = spark_type if group else unique_fields(spark_type)
        timers = "group_timeout" if group and "timeoutTimestamp" in fields else ""
        var_name = validate_state_name(state_name or ("group_state" if group else "agg"))  # not in every task
        variables = [SparkVariable(var_name, "value", _schema(spark_type, var_name), None, None, column)]
        probe = None
    else:
        raise ConfigurationError(
            f"operator {operator_id} of {checkpoint!r} is a {name}: the import takes transformWithState, "
            "applyInPandasWithState / flatMapGroupsWithState and groupBy().agg() state"
        )
    key_type = state_reader(spark, checkpoint, operator_id, batch, probe).load().schema["key"].dataType
    keys = tuple(key_type.fieldNames())
    clash = [k for k in keys if k.startswith("__sk")]
    if clash:
        raise ConfigurationError(f"grouping key columns {clash} use statekeeper's reserved prefix '__sk'")
    nested = [f for f in key_type.fields if f.dataType.typeName() in ("struct", "array", "map")]
    if nested:  # refused here, not by every task of the job after it
        raise ConfigurationError(
            f"grouping key column {nested[0].name!r} of operator {operator_id} of {checkpoint!r} is a "
            f"{nested[0].dataType.simpleString()} (a window() key is a struct): the import takes atomic key "
            "columns only, so this state is not imported"
        )
    marks = watermarks(files, batch)
    return SparkOperatorState(
        checkpoint,
        operator_id,
        name,
        flavour,
        batch,
        partitions,
        keys,
        tuple(variables),
        timers,
        *marks,
        other_operators=tuple(f"{i} ({others[i]})" for i in sorted(others)),
    )


def _tws_variables(
    spark: SparkSession, checkpoint: str, operator_id: int, batch: int, props: dict[str, Any]
) -> tuple[list[SparkVariable], str]:
    declared = props.get("stateVariables") or []
    if not declared:
        raise ConfigurationError(f"the transformWithState operator of {checkpoint!r} declares no state variables")
    where = f"{checkpoint}/state/{operator_id}/_metadata"
    found = []
    for v in declared if isinstance(declared, list) else [declared]:
        fields = (v.get("stateName"), v.get("stateVariableType")) if isinstance(v, dict) else (None, None)
        if not all(isinstance(f, str) for f in fields):
            raise CorruptFileError(f"operatorProperties declares a state variable as {str(v)[:200]}", where)
        name, kind = str(fields[0]), str(fields[1])
        if kind == "TimerState" or name.startswith("$"):  # Spark's own: timers (read as registered timers)
            continue
        try:
            validate_state_name(name)
        except ConfigurationError as e:
            raise CorruptFileError(f"operatorProperties declares {e}", where) from None
        ttl = bool(v.get("ttlEnabled"))
        schema = state_reader(spark, checkpoint, operator_id, batch, name).load().schema
        if kind == "ValueState":
            value = _ttl_inner(schema["value"].dataType, name, checkpoint) if ttl else schema["value"].dataType
            found.append(SparkVariable(name, "value", _schema(value, name), None, name, "value", ttl))
        elif kind == "ListState":
            element = schema["list_value"].dataType.elementType
            element = _ttl_inner(element, name, checkpoint) if ttl else element
            found.append(SparkVariable(name, "list", _schema(element, name), None, name, "list_value", ttl))
        elif kind == "MapState":
            m = schema["map_value"].dataType
            user_key = _schema(m.keyType, f"the map key of {name}")
            value = _ttl_inner(m.valueType, name, checkpoint) if ttl else m.valueType
            found.append(SparkVariable(name, "map", _schema(value, name), user_key, name, "map_value", ttl))
        else:
            raise ConfigurationError(f"state variable {name!r} of {checkpoint!r} is a {kind}, which is not imported")
    time_mode = str(props.get("timeMode", "NoTime"))
    return found, "" if time_mode in ("NoTime", "None") else "registered"


def _operator_properties(raw: str | None, where: str) -> dict[str, Any]:
    """Spark's operatorProperties JSON of a stateful operator, read as untrusted checkpoint content."""
    props = parse_json((raw or "{}").encode(), where, "operatorProperties")
    if not isinstance(props, dict):
        raise CorruptFileError(f"operatorProperties is {type(props).__name__}, not an object", where)
    return props


def _ttl_inner(spark_type: Any, name: str, checkpoint: str) -> Any:
    """The user's value type inside Spark's TTL'd value ``struct<value, ttlExpirationMs>`` (PySpark 4.x)."""
    fields: list[str] = getattr(spark_type, "fieldNames", list)()
    if fields != ["value", TTL_FIELD]:
        raise ConfigurationError(
            f"state variable {name!r} of {checkpoint!r} has a TTL, but Spark's state data source reads its values as "
            f"{spark_type.simpleString()}, not struct<value, {TTL_FIELD}>: this Spark version's TTL'd state is not "
            "imported"
        )
    return spark_type["value"].dataType


def unique_fields(spark_type: Any) -> Any:
    """An aggregation buffer's struct with each repeated field name suffixed by its position (``count(*), avg(v)``
    buffers as ``count, sum, count``: read as ``count, sum, count_2``), which a statekeeper schema needs unique;
    the processor replacing the aggregation declares these names."""
    from pyspark.sql.types import StructField, StructType

    seen: set[str] = set()
    fields = []
    for i, f in enumerate(spark_type.fields):
        name = f.name
        while name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        fields.append(StructField(name, f.dataType, f.nullable))
    return StructType(fields)


def _schema(spark_type: Any, what: str) -> DataType:
    schema = to_schema(spark_type, f"the schema of state {what!r}")
    assert schema is not None
    return schema


def state_reader(
    spark: SparkSession, checkpoint: str, operator_id: int, batch: int, var: str | None = None, **options: str
) -> Any:
    """Spark's state data source at `batch` (a DataFrameReader; ``.load()`` plans it, no job)."""
    reader = (
        spark.read.format("statestore")
        .option("path", checkpoint)
        .option("operatorId", str(operator_id))
        .option("batchId", str(batch))
    )
    if var is not None:
        reader = reader.option("stateVarName", var).option("flattenCollectionTypes", "false")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader


def state_rows(spark: SparkSession, source: SparkOperatorState) -> DataFrame:
    """Every variable's state (and the timers) of `source` as one DataFrame: the key columns, `VAR_COL`, one
    value column per variable (null in the others' rows) and `TIMER_COL`; nothing collected."""
    from pyspark.sql import functions as sf

    parts = []
    for i, var in enumerate(source.variables):
        df = state_reader(spark, source.checkpoint, source.operator_id, source.batch_id, var.spark_name).load()
        timer = sf.lit(None).cast("long")
        if source.timers == "group_timeout":
            t = sf.col("value.timeoutTimestamp")
            timer = sf.when(t != sf.lit(NO_TIMEOUT), t)
        value = sf.col(var.column)
        if source.flavour == "aggregation":  # its buffer's names, made unique as describe_operator read them
            value = value.cast(unique_fields(df.schema[var.column].dataType))
        parts.append(
            df.select(
                "key.*",
                sf.lit(i).alias(VAR_COL),
                value.alias(f"{VALUE_PREFIX}{i}"),
                timer.alias(TIMER_COL),
            )
        )
    if source.timers == "registered":
        timers = state_reader(
            spark, source.checkpoint, source.operator_id, source.batch_id, readRegisteredTimers="true"
        ).load()
        parts.append(
            timers.select(
                "key.*", sf.lit(-1).alias(VAR_COL), sf.col("expiration_timestamp_ms").cast("long").alias(TIMER_COL)
            )
        )
    rows: DataFrame = parts[0]
    for p in parts[1:]:
        rows = rows.unionByName(p, allowMissingColumns=True)
    return rows


__all__ = [
    "COPIED",
    "TIMER_COL",
    "TTL_FIELD",
    "VALUE_PREFIX",
    "VAR_COL",
    "CheckpointFiles",
    "SparkOperatorState",
    "SparkVariable",
    "describe_operator",
    "last_committed_batch",
    "state_rows",
    "watermarks",
]
