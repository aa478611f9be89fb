"""A partition task's output: what the processor's handlers return (Rows, tuples, dicts, pandas frames, Arrow
tables), converted as PySpark converts it, into record batches of the output schema; where the driver collects the
tasks' results from their output, plus a result column (`META_COL`: the checkpoint id and metrics, in one extra
row)."""

from __future__ import annotations

import importlib
import json
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statekeeper.store.errors import StoreStateError
from statekeeper.store.spark.pandas_frames import check_decimals, from_pandas, gather_columns, named_columns

META_COL = "__sk_meta"
OUTPUT_BATCH_ROWS = 8192
_ITERATORS = frozenset({types.GeneratorType, list, type(iter(())), type(iter([]))})
"""What handlers usually return: taken as an iterable of output items without further type checks."""


class OutputBuffer:
    """Buffers output rows or frames and turns them into record batches of the output schema."""

    def __init__(self, schema: pa.Schema, int_to_decimal: bool = False, time_zone: str = "UTC") -> None:
        self.schema = schema
        self.int_to_decimal = int_to_decimal
        self.time_zone = time_zone
        """The session time zone: a pandas frame's naive timestamps are wall times in it, as PySpark takes them."""
        self.user_fields = [f for f in schema if f.name != META_COL]
        self.with_meta = len(self.user_fields) < len(schema)
        """The schema ends with META_COL: null in the processor's rows, the result in `meta`'s row."""
        self.names = [f.name for f in self.user_fields]
        self.decimals = [i for i, f in enumerate(self.user_fields) if pa.types.is_decimal(f.type)]
        """Decimal output fields: a row's value there must be a Decimal (or an int, with `int_to_decimal`)."""
        self.nested_structs = any(_has_struct(f.type) for f in self.user_fields)
        """A struct inside an output field: a Row there is taken by its fields' names too, as PySpark takes it."""
        self.items: list[Any] = []
        self.count = 0

    def add(self, result: Any) -> None:
        """Take what a handler returned: an iterable of rows / tables / frames, or one of those."""
        if type(result) in _ITERATORS:  # the usual case (a generator): no further checks per key
            self.items.extend(result)
            return
        if result is None:
            return
        if isinstance(result, tuple | dict | pa.Table | pa.RecordBatch) or _is_pandas(result):
            self.items.append(result)
        else:
            self.items.extend(result)

    def pending(self) -> int:
        return len(self.items)

    def drain(self) -> Iterator[pa.RecordBatch]:
        items = self.items.copy()  # emptied in place: the task loop holds the list
        self.items.clear()
        if not items:
            return
        if all(issubclass(t, tuple) for t in set(map(type, items))):  # rows only (the usual): no check per item
            yield self._from_rows(items)
            return
        rows: list[Any] = []
        frames: list[Any] = []  # consecutive pandas frames are concatenated, then converted once
        for item in items:
            if isinstance(item, tuple | dict):
                if frames:
                    yield from self._from_frames(frames)
                    frames = []
                rows.append(item)
                continue
            if rows:
                yield self._from_rows(rows)
                rows = []
            if _is_pandas(item):
                frames.append(item)
                continue
            if frames:
                yield from self._from_frames(frames)
                frames = []
            yield from self._from_table(item)
        if rows:
            yield self._from_rows(rows)
        if frames:
            yield from self._from_frames(frames)

    def _from_frames(self, frames: list[Any]) -> Iterator[pa.RecordBatch]:
        """Frames (often one small frame a key) converted to Arrow once: their output columns gathered end
        to end where that is what concat gives (gather_columns), else concatenated by pandas."""
        if len(frames) == 1:
            yield from self._from_table(frames[0])
            return
        pandas: Any = importlib.import_module("pandas")
        columns = gather_columns(frames, self.names)
        if columns is None:
            yield from self._from_table(pandas.concat(frames, ignore_index=True, copy=False))
        else:
            yield from self._from_table(pandas.DataFrame(columns, copy=False))

    def _from_table(self, item: Any) -> Iterator[pa.RecordBatch]:
        if isinstance(item, pa.RecordBatch):
            table = pa.Table.from_batches([item])
        elif isinstance(item, pa.Table):
            table = item
        elif _is_pandas(item):
            if item.empty:
                return
            item = named_columns(item, self.names)
            missing = [n for n in self.names if n not in item.columns]
            if missing:
                raise StoreStateError(f"processor output lacks columns {missing} of the output schema")
            arrays = from_pandas(item, self.user_fields, self.int_to_decimal, self.time_zone)
            arrays += self._no_meta(len(item))
            yield from self._batches(pa.Table.from_arrays(arrays, schema=self.schema))
            return
        else:
            raise StoreStateError(
                f"a handler produced {type(item).__name__}: yield Rows, tuples, dicts, Arrow tables or "
                "pandas DataFrames"
            )
        if table.num_rows == 0:
            return
        missing = [n for n in self.names if n not in table.column_names]
        if missing:
            raise StoreStateError(f"processor output lacks columns {missing} of the output schema")
        arrays = [table.column(f.name).cast(f.type) for f in self.user_fields] + self._no_meta(table.num_rows)
        yield from self._batches(pa.Table.from_arrays(arrays, schema=self.schema))

    def _no_meta(self, rows: int) -> list[Any]:
        """The META_COL column of `rows` of the processor's (null), where the schema has one."""
        return [pa.nulls(rows, pa.string())] if self.with_meta else []

    def _batches(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        for b in table.combine_chunks().to_batches():
            self.count += b.num_rows
            yield b

    def _from_rows(self, rows: list[Any]) -> pa.RecordBatch:
        """Rows as PySpark's transformWithState converts them: a ``Row`` with field names by those names
        (``Row.asDict(True)``; a field it lacks is null, one the schema lacks is dropped), a dict by its keys;
        a plain tuple (statekeeper's own) by position."""
        width = len(self.names)
        cols: list[Any] = []
        if set(map(type, rows)) == {tuple} or self._in_order(rows):  # the usual: values in the schema's order
            try:
                cols = list(zip(*rows, strict=True)) if len(rows[0]) == width else []
            except ValueError:
                cols = []
        else:
            cols = [list(c) for c in zip(*(self._named(r, width) for r in rows), strict=True)]
        if len(cols) != width:
            bad = next(r for r in rows if len(r) != width)
            raise StoreStateError(f"output row {bad!r} has {len(bad)} values; the output schema has {width}")
        for i in self.decimals:
            check_decimals(cols[i], self.user_fields[i], self.int_to_decimal)
        arrays = [pa.array(c, type=f.type) for c, f in zip(cols, self.user_fields, strict=True)]
        arrays += self._no_meta(len(rows))
        self.count += len(rows)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _in_order(self, rows: list[Any]) -> bool:
        """Whether every row's values are in the schema's order: tuples, Rows named as the schema's fields
        (with no struct field, whose nested Rows PySpark would also take by name)."""
        names = self.names
        if self.nested_structs:
            return not any(isinstance(r, dict) or hasattr(r, "__fields__") for r in rows)
        return all(isinstance(r, tuple) and getattr(r, "__fields__", names) == names for r in rows)

    def _named(self, row: Any, width: int) -> tuple[Any, ...]:
        """One row's values in the schema's order (see `_from_rows`)."""
        if isinstance(row, dict):
            return tuple(row.get(n) for n in self.names)
        if hasattr(row, "__fields__"):
            values = row.asDict(True)
            return tuple(values.get(n) for n in self.names)
        if len(row) != width:
            raise StoreStateError(f"output row {row!r} has {len(row)} values; the output schema has {width}")
        return tuple(row)

    def meta(self, payload: dict[str, Any]) -> pa.RecordBatch:
        arrays = [pa.nulls(1, f.type) for f in self.user_fields]
        arrays.append(pa.array([json.dumps(payload)], pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _has_struct(typ: pa.DataType) -> bool:
    if pa.types.is_struct(typ):
        return True
    if pa.types.is_map(typ):
        return _has_struct(typ.key_type) or _has_struct(typ.item_type)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return _has_struct(typ.value_type)
    return False


def _is_pandas(obj: Any) -> bool:
    return type(obj).__name__ == "DataFrame" and type(obj).__module__.startswith("pandas")


@dataclass
class OutputClock:
    """Time spent building output batches and handing them to Spark (ms)."""

    build_ms: float = 0.0
    emit_ms: float = 0.0

    def drain(self, out: OutputBuffer) -> Iterator[pa.RecordBatch]:
        batches = out.drain()
        while True:
            t = time.perf_counter()
            b = next(batches, None)
            self.build_ms += (time.perf_counter() - t) * 1000
            if b is None:
                return
            t = time.perf_counter()
            yield b
            self.emit_ms += (time.perf_counter() - t) * 1000


__all__ = ["META_COL", "OUTPUT_BATCH_ROWS", "OutputBuffer", "OutputClock"]
