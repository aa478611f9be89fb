"""Initial state of an operator, as PySpark's ``transformWithState(initialState=...)`` takes it.

The initial state is a DataFrame (or ``GroupedData``) grouped by the operator's key columns. On the
query's first batch (version 0) every row reaches ``handleInitialState(key, row, timerValues)`` in the
state partition that owns its key, before the batch's input rows; later batches never see it.

The rows are collected on the driver once, tagged with their state partition by the same hash the
input is routed with, and shipped with the first batch's task spec: fine for the seed state of a
migration (thousands to a few million rows), not for a state larger than the driver's memory (a Spark
checkpoint's state moves over with the import instead, store/spark/spark_import.py).

Over Spark Connect the batches run in the server's copy of the operator, which cannot read a DataFrame of
the client's session: `start` collects the initial state on the client (a `Seed`: Arrow rows and their Spark
schema) and the copy sent to the server turns it back into a DataFrame of the server's session, bounded by
the Connect server's message limit (``spark.connect.grpc.maxInboundMessageSize``, 128 MiB by default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statekeeper.store.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class Seed:
    """An initial state collected where the query starts (a Spark Connect client), to be planned elsewhere."""

    rows: pa.Table
    schema_json: str
    """The initial state's Spark schema (JSON), so that its types survive the trip through Arrow exactly."""

    def frame(self, spark: SparkSession) -> DataFrame:
        from pyspark.sql.types import StructType

        return spark.createDataFrame(self.rows, StructType.fromJson(json.loads(self.schema_json)))


def seed_of(initial: DataFrame) -> Seed:
    return Seed(initial.toArrow(), initial.schema.json())


def initial_state_frame(initial_state: Any) -> DataFrame:
    """The DataFrame of a ``GroupedData`` (``df.groupBy(key)``) or a DataFrame."""
    from pyspark.sql import DataFrame, GroupedData

    if isinstance(initial_state, GroupedData) or _is_connect_grouped(initial_state):
        frame: DataFrame = initial_state._df
        return frame
    if isinstance(initial_state, DataFrame):
        return initial_state
    raise ConfigurationError(
        f"initial_state must be a DataFrame or df.groupBy(<key columns>), got {type(initial_state).__name__}"
    )


def _is_connect_grouped(value: Any) -> bool:
    """A Spark Connect client's ``df.groupBy(...)`` (its GroupedData is no subclass of the classic one)."""
    cls = type(value)
    return cls.__name__ == "GroupedData" and cls.__module__.startswith("pyspark.sql.connect.")


def collect_initial_state(
    initial: DataFrame, input_df: DataFrame, key: tuple[str, ...], partition_of: Any, pid_col: str
) -> pa.Table:
    """The initial-state rows with the state partition of each (`partition_of`: the routing Column)."""
    from pyspark.sql import functions as sf

    missing = [k for k in key if k not in initial.columns]
    if missing:
        raise ConfigurationError(
            f"the initial state lacks the key columns {missing}: it must be grouped by the operator's key {list(key)}"
        )
    input_types = dict(input_df.dtypes)
    # the same key types as the input, so that a key hashes to the same partition
    cols = [sf.col(c).cast(input_types[c]).alias(c) if c in key else sf.col(c) for c in initial.columns]
    table: pa.Table = initial.select(*cols).select("*", partition_of.alias(pid_col)).toArrow()
    return table


def in_time_zone(table: pa.Table, zone: str) -> pa.Table:
    """`table` with its zoned timestamps (nested ones too) in `zone`, the session time zone: the driver collects the
    rows in UTC, while a processor gets its input's timestamps in the session time zone, and PySpark hands it the
    initial state's the same way (the same instants, another ``tzinfo``)."""
    schema = pa.schema([f.with_type(_zoned(f.type, zone)) for f in table.schema], metadata=table.schema.metadata)
    return table if schema.equals(table.schema) else table.cast(schema)


def _zoned(t: pa.DataType, zone: str) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return t if t.tz is None else pa.timestamp(t.unit, zone)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_zoned(f.type, zone)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(_zoned(t.key_type, zone)), t.item_field.with_type(_zoned(t.item_type, zone))
        )
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_zoned(t.value_type, zone)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_zoned(t.value_type, zone)))
    return t


__all__ = ["Seed", "collect_initial_state", "in_time_zone", "initial_state_frame", "seed_of"]
