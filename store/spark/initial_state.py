"""Initial state of an operator, as PySpark's ``transformWithState(initialState=...)`` takes it.

The initial state is a DataFrame (or ``GroupedData``) grouped by the operator's key columns. On the
query's first batch (version 0) every row reaches ``handleInitialState(key, row, timerValues)`` in the
state partition that owns its key, before the batch's input rows; later batches never see it.

The rows are collected on the driver once, tagged with their state partition by the same hash the
input is routed with, and shipped with the first batch's task spec: fine for the seed state of a
migration (thousands to a few million rows), not for a state larger than the driver's memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statekeeper.store.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def initial_state_frame(initial_state: Any) -> DataFrame:
    """The DataFrame of a ``GroupedData`` (``df.groupBy(key)``) or a DataFrame."""
    from pyspark.sql import DataFrame, GroupedData

    if isinstance(initial_state, GroupedData):
        return initial_state._df
    if isinstance(initial_state, DataFrame):
        return initial_state
    raise ConfigurationError(
        f"initial_state must be a DataFrame or df.groupBy(<key columns>), got {type(initial_state).__name__}"
    )


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


__all__ = ["collect_initial_state", "initial_state_frame"]
