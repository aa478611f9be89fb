"""The Python values a processor's input holds, for every Spark type, are PySpark's (issue 64): one processor
describes each value it is handed (its Python type and value, nested values included) and emits the
description; PySpark's operator (RocksDB provider) and ours run it over the same input, in the Row flavour
(transformWithState: PySpark hands over each column's Arrow value, so structs as dicts and maps as lists of
pairs) and the pandas flavour (transformWithStateInPandas), and every description must be the same."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from statekeeper.store.spark import StatefulOperator
from tests.spark.test_pyspark_suite_parity import CONF, _Collect, _run

FIELDS = [
    "id string",
    "s struct<x:int, inner:struct<y:string>, t:timestamp, tn:timestamp_ntz>",
    "li array<bigint>",
    "lt array<timestamp>",
    "mt map<string,timestamp>",
    "m map<string, struct<x:int>>",
    "l array<struct<x:int, tags:map<string,int>>>",
    "b binary",
    "d date",
    "n decimal(10,2)",
    "ts timestamp",
    "ntz timestamp_ntz",
    "f double",
    "i bigint",
]
INPUT = ", ".join(FIELDS)
COLUMNS = [f.split()[0] for f in FIELDS]
T = dt.datetime(2026, 1, 2, 3, 4, 5)
ROWS = [
    (
        "a",
        Row(x=1, inner=Row(y="q"), t=T, tn=dt.datetime(2026, 1, 2)),
        [1, None],
        [T, None],
        {"k": T},
        {"u": Row(x=2)},
        [Row(x=3, tags={"t": 4})],
        b"\x00\x01",
        dt.date(2026, 1, 2),
        decimal.Decimal("12.34"),
        T.replace(microsecond=6),
        T,
        1.5,
        7,
    ),
    ("a", *[None] * (len(FIELDS) - 1)),
    # nulls inside values; key "b" shares the task with "a", whose nulls make its integers floats in pandas
    (
        "b",
        Row(x=None, inner=None, t=None, tn=None),
        [2],
        [],
        {},
        {},
        [],
        b"",
        dt.date(1970, 1, 1),
        decimal.Decimal("0.00"),
        None,
        None,
        0.0,
        -1,
    ),
]


def describe(v: Any) -> str:
    """A value's Python type and content, recursively; datetimes by instant and offset (not the tz's name)."""
    name = type(v).__name__
    if isinstance(v, dict):
        return f"{name}{{{', '.join(f'{describe(k)}: {describe(x)}' for k, x in sorted(v.items(), key=repr))}}}"
    if isinstance(v, list | tuple):
        return f"{name}[{', '.join(map(describe, v))}]"
    if isinstance(v, dt.datetime) and v == v:  # (pandas.NaT is a datetime unequal to itself)
        return f"{name}({v.replace(tzinfo=None).isoformat()}, offset={v.utcoffset()})"
    if hasattr(v, "tolist") and not isinstance(v, bytes | str):  # NumPy arrays and scalars
        return f"{name}<{describe(v.tolist())}>"
    return f"{name}({v!r})"


class Describe(StatefulProcessor):
    def __init__(self, use_pandas: bool) -> None:
        self.use_pandas = use_pandas

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd  # type: ignore[import-untyped]

        for part in rows:
            if self.use_pandas:
                seen = [
                    f"{c}: {describe(v)} / {part[c].dtype}" for c in part.columns for v in part[c].tolist()
                ]  # tolist: the Python values a pandas user reads
                yield pd.DataFrame({"id": [key[0]] * len(seen), "what": seen})
            else:
                for c in COLUMNS:
                    yield Row(id=key[0], what=f"{c}: {describe(getattr(part, c))}")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("flavour", ["rows", "pandas"])
def test_the_values_a_processor_is_handed_are_pysparks(spark: Any, tmp_path: Path, flavour: str) -> None:
    use_pandas = flavour == "pandas"
    spark.createDataFrame(ROWS, INPUT).coalesce(1).write.parquet(str(tmp_path / "in"))
    output = "id string, what string"

    def stream() -> Any:
        return spark.readStream.schema(INPUT).parquet(str(tmp_path / "in"))

    # both keys in one task on each side, as pandas converts a task's Arrow batch at once (a key's nullable
    # integers are floats if another key has a null); timestamps in a session time zone other than UTC
    changed = {"spark.sql.shuffle.partitions": "1", "spark.sql.session.timeZone": "America/Los_Angeles"}
    before = {key: spark.conf.get(key) for key in changed}
    for key, value in {**CONF, **changed}.items():
        spark.conf.set(key, value)
    try:
        expected = _Collect()
        grouped = stream().groupBy("id")
        tws = grouped.transformWithStateInPandas if use_pandas else grouped.transformWithState
        query = tws(Describe(use_pandas), output, "Append", "None")
        _run(
            query.writeStream.foreachBatch(expected)
            .option("checkpointLocation", str(tmp_path / "ref-ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        got = _Collect()
        op = StatefulOperator(
            (tmp_path / "state").as_uri(),
            "describe",
            key="id",
            processor=Describe(use_pandas),
            output_schema=output,
            input_format=flavour,
            num_partitions=1,
            sink=got,
        )
        _run(op.start(stream(), str(tmp_path / "ckpt"), trigger={"availableNow": True}))
    finally:
        for key in CONF:
            spark.conf.unset(key)
        for key, value in before.items():
            spark.conf.set(key, value)
    assert list(expected.batches) == [0]
    ours, theirs = set(got.batches[0]), set(expected.batches[0])
    assert ours == theirs, f"ours only: {sorted(ours - theirs)}\nPySpark's only: {sorted(theirs - ours)}"
    assert len(got.batches[0]) == len(expected.batches[0])
