"""The state reader: any committed version of an operator's state as a DataFrame, and its change feed.

A PySpark Python Data Source (``pyspark.sql.datasource``) named ``statekeeper``; one input partition
per state partition, each read by loading that partition's store at the requested committed version
(snapshot + changelog replay) in a temporary directory (the change feed reads changelogs only).
Options are named as Spark's state data source names them::

    spark.dataSource.register(StateDataSource)
    df = (spark.read.format("statekeeper").option("root", root).option("operator", "sessions")
          .option("stateVarName", "totals").load())       # default: the latest committed version

- ``stateVarName``: typed columns ``key`` (struct of the grouping columns), ``value`` (the variable's
  current schema; old values read through it), ``expiration_timestamp`` (TTL) and ``partition_id``.
  ListState gives one row per element (``list_element``) and MapState one per entry (``user_map_key``,
  ``user_map_value``); ``flattenCollectionTypes=false`` gives ``list_value`` / ``map_value`` columns.
- ``readRegisteredTimers=true``: ``key``, ``expiration_timestamp_ms``, ``partition_id``.
- ``readChangeFeed=true`` with ``changeStartBatchId`` (and ``changeEndBatchId``, default the latest):
  ``batch_id``, ``change_type`` (update / delete), ``key``, [``user_map_key``], ``value``,
  ``partition_id`` from the committed changelogs of the head's history (store/batch_history.py), one
  Spark input partition per (layout segment, partition). Rescale and rollback versions only copy state
  and are not reported: a feed across a rescale reads the batches before it from the old layout's
  partitions and those after from the new one's; across a rollback it follows the head's history (the
  abandoned branch is not in it). The value schema is the end version's; each task decodes changelogs
  with schemas read once on the driver, without loading a store (docs/rescale.md).
- ``batchId`` b reads the latest version of the head's history carrying batch b (usually b + 1; after
  a rescale or rollback of b, that version); ``version`` v reads v directly (any retained version).
- Without ``stateVarName``: every variable as untyped rows (partition, state, kind, key, user_key,
  value as JSON, expires_at_ms); ``raw=true`` gives the stored bytes instead.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from statekeeper.store.batch_history import BatchHistory, Segment
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import ConfigurationError, LineageError
from statekeeper.store.files import open_file_manager
from statekeeper.store.formats.typed_schema import DataType
from statekeeper.store.layout import StoreId
from statekeeper.store.load_plan import committed_range
from statekeeper.store.spark.schemas import VariableRecord, expiry_of
from statekeeper.store.spark.state_view import Change, StateView, TypedSchemas
from statekeeper.store.spark.worker_cache import use_worker_memory
from statekeeper.store.state_store import StateStore, StoreConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

SCHEMA = "partition INT, state STRING, kind STRING, key STRING, user_key STRING, value STRING, expires_at_ms BIGINT"
RAW_SCHEMA = "partition INT, state STRING, kind STRING, key BINARY, user_key BINARY, value BINARY, expires_at_ms BIGINT"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _flag(options: Any, name: str, default: bool = False) -> bool:
    return str(options.get(name, str(default))).strip().lower() in ("1", "true", "yes")


def _int_option(options: Any, name: str) -> int | None:
    raw = options.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"state reader option {name}={raw!r} is not an integer") from None


def _expiry_ts(ms: int | None) -> dt.datetime | None:
    return None if ms is None else _EPOCH + dt.timedelta(milliseconds=ms)


class _Options:
    """The parsed options, and the committed checkpoint ids they select."""

    def __init__(self, given: Any) -> None:
        options = {str(k).lower(): v for k, v in dict(given).items()}  # Spark's options ignore case
        root = options.get("root") or options.get("path")
        operator = options.get("operator")
        if not root or not operator:
            raise ConfigurationError("the statekeeper state reader needs the options 'root' and 'operator'")
        self.root = str(root)
        self.operator = str(operator)
        self.raw = _flag(options, "raw")
        state = options.get("state")
        self.states = [s.strip() for s in str(state).split(",") if s.strip()] if state else None
        self.var = options.get("statevarname") or None
        self.timers = _flag(options, "readregisteredtimers")
        self.flatten = _flag(options, "flattencollectiontypes", True)
        self.change_feed = _flag(options, "readchangefeed")
        log = CommitLog(open_file_manager(self.root))
        history = BatchHistory(log, self.operator, self.root)
        version = _int_option(options, "version")
        batch_id = _int_option(options, "batchid")
        if version is None and batch_id is not None:
            version = history.version_of(batch_id)
        self.change_start = _int_option(options, "changestartbatchid")
        end_batch = _int_option(options, "changeendbatchid")
        self.segments: list[Segment] = []
        if self.change_feed:
            if not self.var:
                raise ConfigurationError("readChangeFeed needs the option stateVarName")
            if self.change_start is None or self.change_start < 0:
                raise ConfigurationError("readChangeFeed needs the option changeStartBatchId (a batch id >= 0)")
            end = history.head_record.batch if end_batch is None else end_batch
            self.segments = history.changes(self.change_start, end)
            version = history.version_of(end)
        if version is None:
            version = history.head_record.version
        self.version = version
        if self.version <= 0:
            raise LineageError(f"no committed version of {self.operator!r} in {self.root}")
        self.ids = self._ids(log, self.version)

    def _ids(self, log: CommitLog, version: int) -> list[str]:
        record = log.get(version)
        if record is None:
            raise LineageError(f"version {version} is not committed in {self.root} (expired or not yet written)")
        ids = record.checkpoint_ids.get(self.operator)
        if ids is None:
            raise ConfigurationError(
                f"operator {self.operator!r} is not in the commit of version {version} in {self.root} "
                f"(it has {sorted(record.checkpoint_ids)})"
            )
        return list(ids)


def _open_view(opts: _Options, partition: int, ckpt: str, work: str) -> tuple[StateStore, StateView]:
    store = StateStore(opts.root, opts.operator, partition, config=StoreConfig(local_dir=work))
    try:
        store.load(opts.version, ckpt)
        return store, StateView(store)
    except BaseException:
        store.close()
        raise


def _typed_columns(opts: _Options, view: TypedSchemas) -> list[tuple[str, Any]]:
    """(name, Spark JSON type) of the typed output."""
    key = view.key_schema.json_value() if view.key_schema is not None else "string"
    if opts.timers:
        return [("key", key), ("expiration_timestamp_ms", "long"), ("partition_id", "integer")]
    assert opts.var is not None
    record = view.records.get(opts.var)
    if record is None:
        raise ConfigurationError(
            f"state variable {opts.var!r} is not in {opts.operator!r} at version {opts.version} "
            f"(it has {sorted(view.records)})"
        )
    value_schema: DataType | None = record.schemas.get(record.schema_id)
    value = value_schema.json_value() if value_schema is not None else "string"
    uk = record.user_key_schema.json_value() if record.user_key_schema is not None else "string"
    if opts.change_feed:
        if record.kind == "list":
            value = {"type": "array", "elementType": value, "containsNull": True}
        cols = [("batch_id", "long"), ("change_type", "string"), ("key", key)]
        if record.kind == "map":
            cols.append(("user_map_key", uk))
        return [*cols, ("value", value), ("partition_id", "integer")]
    if record.kind == "value":
        cols = [("key", key), ("value", value)]
    elif record.kind == "list":
        cols = (
            [("key", key), ("list_element", value)]
            if opts.flatten
            else [("key", key), ("list_value", {"type": "array", "elementType": value, "containsNull": True})]
        )
    elif opts.flatten:
        cols = [("key", key), ("user_map_key", uk), ("user_map_value", value)]
    else:
        cols = [
            ("key", key),
            ("map_value", {"type": "map", "keyType": uk, "valueType": value, "valueContainsNull": True}),
        ]
    return [*cols, ("expiration_timestamp", "timestamp"), ("partition_id", "integer")]


def _end_schemas(opts: _Options) -> TypedSchemas:
    """The recorded schemas at the end version (first partition that has the variable, or timers)."""
    work = tempfile.mkdtemp(prefix="statekeeper-reader-")
    try:
        for p, ckpt in enumerate(opts.ids):
            store, view = _open_view(opts, p, ckpt, f"{work}/{p}")
            try:
                if opts.timers or opts.var in view.records:
                    return TypedSchemas(view.key_schema, view.records, view.where)
            finally:
                store.close()
        raise ConfigurationError(
            f"state variable {opts.var!r} is not in {opts.operator!r} at version {opts.version} in {opts.root}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _typed_schema(opts: _Options) -> Any:
    """The Spark schema of a typed read, from the schema records of the end version."""
    from pyspark.sql.types import StructType

    found = _end_schemas(opts)
    fields = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in _typed_columns(opts, found)]
    return StructType.fromJson({"type": "struct", "fields": fields})


class StateDataSource(DataSource):
    """``spark.read.format("statekeeper")``: the options of the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "statekeeper"

    def schema(self) -> Any:
        opts = _Options(dict(self.options))
        if opts.var or opts.timers:
            return _typed_schema(opts)
        return RAW_SCHEMA if opts.raw else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _StateReader(_Options(dict(self.options)))


class _StateReader(DataSourceReader):
    def __init__(self, opts: _Options) -> None:
        self.opts = opts
        self.feed_schemas: tuple[DataType | None, dict[str, VariableRecord]] | None = None
        if opts.change_feed:  # read once here: the feed's tasks decode changelogs without loading a store
            schemas = _end_schemas(opts)
            self.feed_schemas = (schemas.key_schema, schemas.records)

    def partitions(self) -> list[InputPartition]:
        """One per state partition; for the change feed one per (layout segment, partition of it)."""
        if not self.opts.change_feed:
            return [InputPartition((p, ckpt)) for p, ckpt in enumerate(self.opts.ids)]
        parts = [
            InputPartition((p, seg.parent(p), tuple((r.version, r.checkpoint_id, r.batch_id) for r in seg.refs(p))))
            for seg in self.opts.segments
            for p in range(seg.partitions)
        ]
        return parts or [InputPartition((0, None, ()))]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        opts = self.opts
        use_worker_memory()
        if self.feed_schemas is not None:
            p, parent, refs = partition.value
            key_schema, records = self.feed_schemas
            where = f" (operator {opts.operator}, change feed of partition {p})"
            yield from _change_rows(opts, TypedSchemas(key_schema, records, where), p, parent, refs)
            return
        p, ckpt = partition.value
        work = tempfile.mkdtemp(prefix="statekeeper-reader-")
        store, view = _open_view(opts, p, ckpt, work)
        try:
            if opts.timers:
                for key, expiry in view.timers():
                    yield key, expiry, p
            elif opts.var:
                yield from _typed_rows(opts, view, p)
            else:
                yield from _untyped_rows(store, view, p, opts.states, opts.raw)
        finally:
            store.close()
            shutil.rmtree(work, ignore_errors=True)


def _typed_rows(opts: _Options, view: StateView, p: int) -> Iterator[tuple[Any, ...]]:
    assert opts.var is not None
    record = view.records.get(opts.var)
    if record is None:
        return
    rows = view.rows(opts.var)
    if record.kind == "value":
        for key, _, value, expiry in rows:
            yield key, value, _expiry_ts(expiry), p
    elif record.kind == "list" and opts.flatten:
        for key, element, expiry in view.elements(opts.var):
            yield key, element, _expiry_ts(expiry), p
    elif record.kind == "list":
        for key, _, value, expiry in rows:
            yield key, value, _expiry_ts(expiry), p
    elif opts.flatten:
        for key, uk, value, expiry in rows:
            yield key, uk, value, _expiry_ts(expiry), p
    else:
        current: Any = None
        entries: dict[Any, Any] = {}
        for key, uk, value, _ in rows:
            if entries and key != current:
                yield current, entries, None, p
                entries = {}
            current = key
            entries[uk] = value
        if entries:
            yield current, entries, None, p


def change_feed(view: StateView, name: str, first_batch: int) -> Iterator[Change]:
    """The committed changes of variable `name` from batch `first_batch` up to the version the view's
    store loaded, in batch order.

    The (version, checkpoint id) of each batch come from the lineage the load already read (the loaded
    changelog names its committed ancestors), not from one commit record per version: the feed costs
    the load plus one read per changelog it decodes. Batches are numbered ``version - 1`` and the range
    is one store's: valid within one layout and no rollback. The reader's feed (``readChangeFeed``)
    resolves batch ids and layouts through the commit records instead (store/batch_history.py).
    """
    store = view.store
    plan = store.last_plan
    if plan is None:
        raise LineageError(f"the change feed of store {store.store_id} needs a loaded committed version")
    refs = committed_range(store.plan_source, plan, first_batch + 1)
    return view.changes(store.fm, name, list(refs))


def _change_rows(
    opts: _Options, schemas: TypedSchemas, p: int, parent: str | None, refs: tuple[tuple[int, str, int], ...]
) -> Iterator[tuple[Any, ...]]:
    """The change feed rows partition `p` wrote at `refs` ((version, checkpoint id, batch id)), the first
    extending the committed checkpoint id `parent` (None: not known)."""
    assert opts.var is not None
    record = schemas.records.get(opts.var)
    if record is None or not refs:
        return
    fm = open_file_manager(opts.root)
    for c in schemas.changes_of(fm, StoreId(opts.operator, p), opts.var, refs, parent):
        if record.kind == "map":
            yield c.batch_id, c.change_type, c.key, c.user_key, c.value, p
        else:
            yield c.batch_id, c.change_type, c.key, c.value, p


def _untyped_rows(
    store: StateStore, view: StateView, partition: int, states: list[str] | None, raw: bool
) -> Iterator[tuple[Any, ...]]:
    for name, record in sorted(view.records.items()):
        if states is not None and name not in states:
            continue
        if raw:
            for k, stored in store.column_family(name).items() if name in store.column_families() else ():
                yield partition, name, record.kind, k, None, stored, expiry_of(stored)
            continue
        for key, uk, value, expiry in view.rows(name):
            yield (
                partition,
                name,
                record.kind,
                _json(list(key)),
                None if uk is None else _json(uk),
                _json(value),
                expiry,
            )


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()
"""Sessions the data source is registered with; weak, so that a new session that happens to get the address
of a collected one (notebooks, test suites creating Connect sessions one after another) is not taken for it."""


def read_state(
    spark: SparkSession,
    root: str,
    operator: str,
    *,
    version: int | None = None,
    state: str | None = None,
    raw: bool = False,
    **options: Any,
) -> DataFrame:
    """Committed state of `operator` at `version` (default: latest) as a DataFrame.

    Extra keyword options are passed as reader options (``stateVarName="totals"``,
    ``readChangeFeed=True, changeStartBatchId=0``, ``flattenCollectionTypes=False``, ...).
    """
    if spark not in _registered:
        spark.dataSource.register(StateDataSource)
        _registered.add(spark)
    reader = spark.read.format("statekeeper").option("root", root).option("operator", operator)
    if version is not None:
        reader = reader.option("version", str(version))
    if state is not None:
        reader = reader.option("state", state)
    if raw:
        reader = reader.option("raw", "true")
    for name, value in options.items():
        reader = reader.option(name, str(value).lower() if isinstance(value, bool) else str(value))
    return reader.load()


__all__ = ["RAW_SCHEMA", "SCHEMA", "StateDataSource", "change_feed", "read_state"]
