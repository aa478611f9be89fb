"""Pandas frames in and out of a task: each key's frame is one of its own (indexed from 0, the chunk's dtypes,
writable without warnings or effect on another key's), and many small output frames convert as their
concatenation would."""

from __future__ import annotations

import datetime
import decimal
import tracemalloc
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]
import pyarrow as pa
import pytest

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.spark import ApplyInPandasWithState
from statekeeper.store.spark.pandas_frames import PandasSettings, gather_columns, key_frames, to_pandas
from statekeeper.store.spark.task_input import groups_of
from statekeeper.store.spark.task_output import META_COL, OutputBuffer
from statekeeper.store.spark.testing import TwsTester


def _chunk() -> pa.Table:
    return pa.table(
        {
            "k": pa.array(["a", "a", "b", "c", "c", "c"]),
            "n": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
            "x": pa.array([0.5, None, 1.5, 2.5, 3.5, 4.5]),
            "ts": pa.array([datetime.datetime(2024, 1, 1, i) for i in range(6)], pa.timestamp("us", "UTC")),
            "d": pa.array([datetime.date(2024, 1, i + 1) for i in range(6)]),
            "dec": pa.array([decimal.Decimal(i) for i in range(6)], pa.decimal128(5, 0)),
            "m": pa.array([[("p", i)] for i in range(6)], pa.map_(pa.string(), pa.int64())),
        }
    )


def test_each_key_frame_is_its_own_indexed_from_0_with_the_chunk_dtypes() -> None:
    pdf = to_pandas(_chunk(), "UTC")
    frames = {k: f for k, (f,) in key_frames(pdf, [(("a",), 2), (("b",), 1), (("c",), 3)])}
    for (key,), size, start in (("a", 2, 0), ("b", 1, 2), ("c", 3, 3)):
        frame = frames[(key,)]
        assert isinstance(frame.index, pd.RangeIndex) and list(frame.index) == list(range(size))
        assert frame.dtypes.equals(pdf.dtypes)
        pd.testing.assert_frame_equal(frame, pdf.iloc[start : start + size].reset_index(drop=True))
    assert frames[("c",)].at[0, "m"] == {"p": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no SettingWithCopyWarning: a frame of its own, as PySpark's are
        c = frames[("c",)]
        c.loc[0, "n"] = -1
        c.at[1, "x"] = -1.0
        c["extra"] = 1
    assert list(frames[("a",)]["n"]) == [1, 2] and list(frames[("b",)]["n"]) == [3]
    assert "extra" not in frames[("b",)].columns
    assert list(c["n"]) == [-1, 5, 6] and list(c.columns)[-1] == "extra"


def test_output_columns_are_gathered_only_where_concat_gives_the_same() -> None:
    names = ["k", "count"]
    same = [pd.DataFrame({"k": [f"k{i}"], "count": [i], "other": [object()]}) for i in range(5)]
    reordered = [*same, pd.DataFrame({"count": [9, 10], "k": ["x", "y"]})]
    got = gather_columns(reordered, names)
    assert got is not None
    want = pd.concat(reordered, ignore_index=True)
    assert got["k"].tolist() == want["k"].tolist() and got["count"].tolist() == want["count"].tolist()
    assert got["count"].dtype == np.int64
    assert gather_columns([*same, pd.DataFrame({"k": ["z"], "count": [1.5]})], names) is None  # promotion
    assert gather_columns([*same, pd.DataFrame({"k": ["z"]})], names) is None  # alignment
    nullable = pd.DataFrame({"k": ["z"], "count": pd.array([None], "Int64")})
    assert gather_columns([*same, nullable], names) is None  # an extension array
    dup = pd.DataFrame([["z", 1, 2]], columns=["k", "count", "count"])
    assert gather_columns([*same, dup], names) is None


@pytest.mark.parametrize(
    "frames",
    [
        [pd.DataFrame({"k": [f"k{i}"], "count": [i]}) for i in range(4)],
        [pd.DataFrame({"k": ["a"], "count": [1]}), pd.DataFrame({"count": [np.nan], "k": ["b"]})],
        [pd.DataFrame({"k": ["a"], "count": [1], "extra": [{"x": 1}]}), pd.DataFrame({"k": ["b"], "count": [2]})],
        [pd.DataFrame({"k": [k], "count": pd.array([v], "Int64")}) for k, v in (("a", 1), ("b", None))],
    ],
)
def test_many_frames_convert_as_their_concatenation(frames: list[Any]) -> None:
    schema = pa.schema([("k", pa.string()), ("count", pa.int64()), (META_COL, pa.string())])
    out = OutputBuffer(schema)
    for f in frames:
        out.add(f)
    got = pa.Table.from_batches(list(out.drain())).drop_columns([META_COL])
    one = OutputBuffer(schema)
    one.add(pd.concat(frames, ignore_index=True))
    want = pa.Table.from_batches(list(one.drain())).drop_columns([META_COL])
    assert got.equals(want) and out.count == sum(len(f) for f in frames)


def _group_state_calls(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    seen = [state.exists, state.getOption]
    n = sum(len(p) for p in pdfs)
    if key[0] == "gone":
        state.remove()
        seen += [state.exists, state.getOption]
    else:
        state.update([np.int64((state.get[0] if state.exists else 0) + n)])  # read back as stored: a tuple of int
        seen += [state.exists, state.get, type(state.get[0]).__name__]
    yield pd.DataFrame({"key": [key[0]], "seen": [repr(seen)]})


def test_group_state_reads_back_what_it_wrote_and_what_it_removed() -> None:
    proc = ApplyInPandasWithState(_group_state_calls)
    with TwsTester(proc, key="key", output_schema="key string, seen string", input_format="pandas") as t:
        first = dict(t.run([{"key": "a", "v": 1}, {"key": "a", "v": 2}, {"key": "gone", "v": 0}]))
        assert first == {"a": "[False, None, True, (2,), 'int']", "gone": "[False, None, False, None]"}
        second = dict(t.run([{"key": "a", "v": 3}, {"key": "gone", "v": 0}]))
        assert second == {"a": "[True, (2,), True, (3,), 'int']", "gone": "[False, None, False, None]"}


def test_a_chunks_keys_are_grouped_without_a_frame_each_held() -> None:
    """A task groups a whole chunk's keys at once; a key's frame is cut only when the processor takes it. A
    frame is a few KiB of pandas objects: a frame per key held at once took a 500k-row task of 200k keys to
    ~0.5 GiB more worker memory."""
    n = 50_000
    table = pa.table({"k": pa.array([f"k{i:06d}" for i in range(n)]), "v": pa.array(range(n), pa.int64())})
    tracemalloc.start()
    try:
        groups = list(groups_of(table, ("k",), "pandas"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20, f"{peak >> 20} MiB to group {n} keys (a frame each held: ~94 MiB)"
    key, frames = groups[123]
    (frame,) = list(frames)
    assert key == ("k000123",) and list(frame.index) == [0] and list(frame["v"]) == [123]
    assert list(frames) == []  # taken once, as an iterator


def test_a_keys_rows_come_in_frames_cut_at_sparks_arrow_batch_limits() -> None:
    """PySpark cuts a key's rows into frames at ``arrow.maxRecordsPerBatch`` / ``maxBytesPerBatch`` (its own
    suite's ChunkCount processors count them): so does the task, each frame indexed from 0."""
    table = pa.table({"k": ["a"] * 5 + ["b"], "n": list(range(6))})

    def cut(limits: PandasSettings) -> dict[str, list[list[int]]]:
        out = {}
        for (key,), frames in groups_of(table, ("k",), "pandas", frames=limits):
            listed = list(frames)
            assert all(list(f.index) == list(range(len(f))) for f in listed)
            out[key] = [list(f["n"]) for f in listed]
        return out

    assert cut(PandasSettings()) == {"a": [[0, 1, 2, 3, 4]], "b": [[5]]}
    assert cut(PandasSettings(max_records=2)) == {"a": [[0, 1], [2, 3], [4]], "b": [[5]]}
    assert cut(PandasSettings(max_records=-1)) == {"a": [[0, 1, 2, 3, 4]], "b": [[5]]}
    assert cut(PandasSettings(max_bytes=2)) == {"a": [[0], [1], [2], [3], [4]], "b": [[5]]}
    conf = {PandasSettings.RECORDS_CONF: "1", PandasSettings.BYTES_CONF: "64m"}
    assert PandasSettings.of(conf) == PandasSettings(1, 64 << 20)
    assert PandasSettings.of({}) == PandasSettings()
    for name, bad in ((PandasSettings.RECORDS_CONF, "ten"), (PandasSettings.BYTES_CONF, "64 parsecs")):
        with pytest.raises(ConfigurationError, match=name.replace(".", r"\.")):
            PandasSettings.of({name: bad})


def test_an_integer_column_fills_a_decimal_field_only_as_pysparks_setting_allows() -> None:
    """PySpark refuses an integer pandas output column for a decimal field unless
    ``spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled`` is true; then it holds the integers."""
    from pyspark.errors import PySparkValueError

    from statekeeper.store.spark.pandas_frames import OutputConversionError, from_pandas

    frame = pd.DataFrame({"id": ["a", "b"], "amount": [3, -7]})
    fields = [pa.field("id", pa.string()), pa.field("amount", pa.decimal128(10, 2))]
    with pytest.raises(OutputConversionError, match="'amount' with type 'int64'") as refused:
        from_pandas(frame, fields)
    assert isinstance(refused.value, PySparkValueError)
    _, amounts = from_pandas(frame, fields, int_to_decimal=True)
    assert amounts.to_pylist() == [decimal.Decimal("3.00"), decimal.Decimal("-7.00")]
    assert from_pandas(frame.astype({"amount": float}), fields)[1].to_pylist() == amounts.to_pylist()
    nullable = frame.astype({"amount": "Int64"}).assign(amount=pd.array([3, None], dtype="Int64"))
    assert from_pandas(nullable, fields, int_to_decimal=True)[1].to_pylist() == [decimal.Decimal("3.00"), None]
    wide = [fields[0], pa.field("amount", pa.decimal128(38, 2))]  # holds every int64: PySpark's cast takes it
    assert from_pandas(frame, wide)[1].to_pylist() == amounts.to_pylist()

    conf = PandasSettings.INT_TO_DECIMAL_CONF
    assert not PandasSettings.of({}).int_to_decimal
    assert PandasSettings.of({conf: "True"}).int_to_decimal
    with pytest.raises(ConfigurationError, match=conf):
        PandasSettings.of({conf: "yes"})


def test_a_row_output_fills_a_decimal_field_with_decimals_only_as_in_pyspark() -> None:
    """PySpark's row conversion takes a Decimal (or None) for a decimal field, an int too only with
    intToDecimalCoercionEnabled; the Row flavour's output follows the same rule as the pandas one."""
    from statekeeper.store.spark.pandas_frames import OutputConversionError

    schema = pa.schema([("id", pa.string()), ("amount", pa.decimal128(10, 2)), (META_COL, pa.string())])
    good = [("a", decimal.Decimal("1.50")), ("b", None)]
    assert OutputBuffer(schema)._from_rows(good).column(1).to_pylist() == [decimal.Decimal("1.50"), None]
    for bad in (3, 1.5, True):
        with pytest.raises(OutputConversionError, match="'amount'"):
            OutputBuffer(schema)._from_rows([("a", bad)])
    coerced = OutputBuffer(schema, int_to_decimal=True)._from_rows([("a", 3)])
    assert coerced.column(1).to_pylist() == [decimal.Decimal("3.00")]
