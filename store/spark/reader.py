"""The state reader: any committed version of an operator's state as a DataFrame.

A PySpark Python Data Source (``pyspark.sql.datasource``) named ``statekeeper``; one input partition
per state partition, each read by loading that partition's store at the requested committed version
(snapshot + changelog replay) in a temporary directory::

    spark.dataSource.register(StateDataSource)
    df = (spark.read.format("statekeeper").option("root", root).option("operator", "sessions")
          .option("version", 12).load())          # default: the latest committed version

Columns: partition, state (variable name), kind (value / list / map), key (JSON of the grouping-key
tuple), user_key (JSON of the map key; null otherwise), value (JSON), expires_at_ms (TTL; null when
none). With ``raw=true`` key, user_key and value are the stored bytes instead (values keep their
1-byte tag; see store.spark.state). Version v is the state after batch v - 1.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from store.commit_log import CommitLog
from store.errors import ConfigurationError, LineageError
from store.files import open_file_manager
from store.spark.state import INTERNAL_PREFIX, META_CF, STATE_META_PREFIX, decode_key, decode_value, split_map_key
from store.state_store import StateStore, StoreConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

SCHEMA = "partition INT, state STRING, kind STRING, key STRING, user_key STRING, value STRING, expires_at_ms BIGINT"
RAW_SCHEMA = "partition INT, state STRING, kind STRING, key BINARY, user_key BINARY, value BINARY, expires_at_ms BIGINT"


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _flag(options: Any, name: str) -> bool:
    return str(options.get(name, "false")).strip().lower() in ("1", "true", "yes")


class StateDataSource(DataSource):
    """``spark.read.format("statekeeper")``: options root (or the load path), operator, version, state, raw."""

    @classmethod
    def name(cls) -> str:
        return "statekeeper"

    def schema(self) -> str:
        return RAW_SCHEMA if _flag(self.options, "raw") else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _StateReader(dict(self.options))


class _StateReader(DataSourceReader):
    def __init__(self, options: dict[str, Any]) -> None:
        root = options.get("root") or options.get("path")
        operator = options.get("operator")
        if not root or not operator:
            raise ConfigurationError("the statekeeper state reader needs the options 'root' and 'operator'")
        self.root = str(root)
        self.operator = str(operator)
        self.raw = _flag(options, "raw")
        state = options.get("state")
        self.states = [s.strip() for s in str(state).split(",") if s.strip()] if state else None
        log = CommitLog(open_file_manager(self.root))
        raw_version = options.get("version")
        try:
            self.version = int(raw_version) if raw_version not in (None, "") else log.latest()
        except ValueError:
            raise ConfigurationError(f"state reader option version={raw_version!r} is not an integer") from None
        if self.version <= 0:
            raise LineageError(f"no committed version of {self.operator!r} in {self.root}")
        record = log.get(self.version)
        if record is None:
            raise LineageError(f"version {self.version} is not committed in {self.root}")
        ids = record.checkpoint_ids.get(self.operator)
        if ids is None:
            raise ConfigurationError(
                f"operator {self.operator!r} is not in the commit of version {self.version} in {self.root} "
                f"(it has {sorted(record.checkpoint_ids)})"
            )
        self.ids = list(ids)

    def partitions(self) -> list[InputPartition]:
        return [InputPartition((p, ckpt)) for p, ckpt in enumerate(self.ids)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        p, ckpt = partition.value
        work = tempfile.mkdtemp(prefix="statekeeper-reader-")
        store = StateStore(self.root, self.operator, p, config=StoreConfig(local_dir=work))
        try:
            store.load(self.version, ckpt)
            yield from _rows(store, p, self.states, self.raw)
        finally:
            store.close()
            shutil.rmtree(work, ignore_errors=True)


def _rows(store: StateStore, partition: int, states: list[str] | None, raw: bool) -> Iterator[tuple[Any, ...]]:
    kinds: dict[str, str] = {}
    if META_CF in store.column_families():
        for k, v in store.column_family(META_CF).items(prefix=STATE_META_PREFIX):
            kinds[k[len(STATE_META_PREFIX) :].decode()] = json.loads(v).get("kind", "value")
    for name in store.column_families():
        if name.startswith(INTERNAL_PREFIX) or name == "default" or (states is not None and name not in states):
            continue
        kind = kinds.get(name, "value")
        for k, stored in store.column_family(name).items():
            gk, uk = split_map_key(k) if kind == "map" else (k, None)
            value, expiry = decode_value(stored)
            if raw:
                yield partition, name, kind, gk, uk, stored, expiry
            else:
                yield (
                    partition,
                    name,
                    kind,
                    _json(decode_key(gk)),
                    None if uk is None else _json(decode_key(uk)),
                    _json(value),
                    expiry,
                )


_registered: set[int] = set()


def read_state(
    spark: SparkSession,
    root: str,
    operator: str,
    *,
    version: int | None = None,
    state: str | None = None,
    raw: bool = False,
) -> DataFrame:
    """Committed state of `operator` at `version` (default: latest) as a DataFrame."""
    if id(spark) not in _registered:
        spark.dataSource.register(StateDataSource)
        _registered.add(id(spark))
    reader = spark.read.format("statekeeper").option("root", root).option("operator", operator)
    if version is not None:
        reader = reader.option("version", str(version))
    if state is not None:
        reader = reader.option("state", state)
    if raw:
        reader = reader.option("raw", "true")
    return reader.load()


__all__ = ["RAW_SCHEMA", "SCHEMA", "StateDataSource", "read_state"]
