"""A partition task's input, streamed: whole key groups from Arrow record batches as they arrive.

The driver sorts each partition by the grouping key, nulls first, and the marker (whose key is all nulls)
ahead of any equal key, so the task learns its state partition from the first row and a key's rows are
contiguous: a group ends where the key changes. The
task never materialises its whole input; it cuts the stream into chunks of about ``budget_bytes`` of
Arrow data, each ending on a key boundary (the rows of the chunk's last key are held back and joined
with the next batches), and converts one chunk at a time to Python rows or pandas. Per-task memory is
then bounded by the budget whatever the batch size; only a single key whose rows exceed the budget is
held whole (a key's rows are never split between calls).

When the whole input fits in one chunk, its order does not matter (groups are found by hashing). When
it takes several chunks, the input must be sorted: a key seen in two runs of one chunk fails the task.
"""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statekeeper.store.errors import StoreStateError
from statekeeper.store.spark.pandas_frames import PandasSettings, key_frames, to_pandas

INTERNAL_COL_PREFIX = "__sk_"
PID_COL = "__sk_partition"
MARKER_COL = "__sk_marker"
DEFAULT_INPUT_BUDGET_BYTES = 2 << 20
"""Arrow bytes of input a per-key task converts at once (``StatefulOperator(task_input_budget_bytes=...)``):
as Python rows or pandas objects they take about ten times that."""
BATCH_INPUT_BUDGET_BYTES = 4 << 20
"""The same for a vectorized processor, whose chunks stay Arrow: fewer, larger ``handleBatch`` calls."""


@dataclass
class InputPhases:
    """Time a task spends getting its input (ms): waiting for Spark's batches and converting them."""

    first_batch_ms: float = 0.0
    """From the task function's start to its first input batch (shuffle read, worker start-up)."""
    wait_ms: float = 0.0
    """Inside Spark's input iterator (shuffle read and the JVM's Arrow serialisation)."""
    convert_ms: float = 0.0
    """Arrow to Python rows / pandas, grouping."""
    rows: int = 0
    chunks: int = 0
    max_chunk_bytes: int = 0


class TaskInput:
    """The data batches of one task after its marker: the partition, the schema, then whole-key chunks."""

    def __init__(self, batches: Iterable[pa.RecordBatch], key_columns: tuple[str, ...], budget_bytes: int) -> None:
        self.key_columns = key_columns
        self.budget = max(1, budget_bytes)
        self.phases = InputPhases()
        self._t0 = time.perf_counter()
        self._it = iter(batches)
        self._head: list[pa.RecordBatch] = []
        self.partition: int | None = None
        self.schema: pa.Schema | None = None
        self._cut = False
        self.transform: Callable[[pa.Table], pa.Table] | None = None
        """Applied to each chunk before it is handed out (e.g. dropping late rows)."""
        self._find_marker()

    @classmethod
    def of_table(cls, data: pa.Table, partition: int, key_columns: tuple[str, ...], budget_bytes: int) -> TaskInput:
        """A task input of data rows already without marker and internal columns (in-process testing)."""
        task_input = cls((), key_columns, budget_bytes)
        task_input.partition = partition
        task_input.schema = data.schema
        task_input._head = [b for b in data.to_batches() if b.num_rows]
        return task_input

    # -- the marker -----------------------------------------------------------------------------
    def _next(self) -> pa.RecordBatch | None:
        t = time.perf_counter()
        b = next(self._it, None)
        now = time.perf_counter()
        if self.phases.first_batch_ms == 0.0 and b is not None:
            self.phases.first_batch_ms = (now - self._t0) * 1000
        self.phases.wait_ms += (now - t) * 1000
        return b

    def _find_marker(self) -> None:
        """Read until the marker row (first, when sorted); the rows before it are kept for later."""
        while True:
            b = self._next()
            if b is None:
                return
            if not b.num_rows:
                continue
            markers = b.filter(b.column(MARKER_COL))
            if markers.num_rows:
                pids = sorted(set(markers.column(PID_COL).to_pylist()))
                if len(pids) != 1 or markers.num_rows != 1:
                    raise StoreStateError(f"a task got markers of state partitions {pids}: routing is broken")
                self.partition = int(pids[0])
                data = b.filter(pc.invert(b.column(MARKER_COL)))
                self.schema = self._strip(data).schema
                self._head = [p for x in (*self._head, data) if x.num_rows for p in self._pieces(self._check(x))]
                return
            self._head.append(b)

    def _strip(self, b: pa.RecordBatch) -> pa.RecordBatch:
        return b.select([n for n in b.schema.names if not n.startswith(INTERNAL_COL_PREFIX)])

    def _check(self, b: pa.RecordBatch) -> pa.RecordBatch:
        if pc.any(b.column(MARKER_COL)).as_py():
            raise StoreStateError(
                f"the task of state partition {self.partition} got a second marker: routing is broken"
            )
        if not pc.all(pc.equal(b.column(PID_COL), self.partition)).as_py():
            raise StoreStateError(f"the task of state partition {self.partition} got rows of another partition")
        return self._strip(b)

    def _data(self) -> Iterator[pa.RecordBatch]:
        yield from self._head
        self._head = []
        while (b := self._next()) is not None:
            if b.num_rows:
                yield from self._pieces(self._check(b))

    def _pieces(self, b: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """Spark's batch `b` in zero-copy slices of about half the budget (with a large ``maxRecordsPerBatch`` a
        batch would otherwise be converted whole, whatever the budget)."""
        if b.nbytes <= self.budget // 2:
            yield b
            return
        step = max(1, b.num_rows * (self.budget // 2) // max(1, b.nbytes))
        for start in range(0, b.num_rows, step):
            yield b.slice(start, step)

    # -- chunks of whole key groups -------------------------------------------------------------
    def chunks(self) -> Iterator[pa.Table]:
        """Tables of whole key groups, each about the budget (a key larger than it stays whole)."""
        assert self.schema is not None
        pending: list[pa.RecordBatch] = []
        size = 0
        next_try = self.budget
        for b in self._data():
            pending.append(b)
            self.phases.rows += b.num_rows
            size += b.nbytes
            if size < next_try:
                continue
            table = pa.Table.from_batches(pending, self.schema)
            cut = int(run_starts(table, self.key_columns)[-1])
            if cut == 0:  # one key fills the budget: keep its rows together, look again at twice the size
                next_try = 2 * size
                continue
            self._cut = True
            yield self._chunk(table.slice(0, cut), size)
            rest = table.slice(cut)
            pending = rest.to_batches()
            size = sum(x.nbytes for x in pending)
            next_try = self.budget
        if pending:
            yield self._chunk(pa.Table.from_batches(pending, self.schema), size)

    def _chunk(self, table: pa.Table, size: int) -> pa.Table:
        self.phases.chunks += 1
        self.phases.max_chunk_bytes = max(self.phases.max_chunk_bytes, size)
        return table if self.transform is None else self.transform(table)

    @property
    def multi_chunk(self) -> bool:
        """True when the input was cut (it was larger than the budget)."""
        return self._cut

    def empty_table(self) -> pa.Table:
        assert self.schema is not None
        return self.schema.empty_table()

    # -- groups ---------------------------------------------------------------------------------
    def groups(
        self, input_format: str, time_zone: str | None = "UTC", frames: PandasSettings | None = None
    ) -> Iterator[tuple[tuple[Any, ...], Any]]:
        """(key tuple, rows iterator) per grouping key, chunk by chunk (`time_zone`: the session's, and `frames`
        how a key's rows are cut, for pandas frames)."""
        for chunk in self.chunks():
            t = time.perf_counter()
            groups = list(groups_of(chunk, self.key_columns, input_format, self._unsorted, time_zone, frames))
            self.phases.convert_ms += (time.perf_counter() - t) * 1000
            yield from groups
            del groups

    def _unsorted(self) -> None:
        if self.multi_chunk:
            raise StoreStateError(
                f"the task of state partition {self.partition} got its input unsorted by key "
                f"{list(self.key_columns)} and larger than the task input budget ({self.budget} bytes): the driver "
                "sorts each partition by key; raise task_input_budget_bytes only if you feed tasks yourself"
            )


def groups_of(
    data: pa.Table,
    key_columns: tuple[str, ...],
    input_format: str,
    on_unsorted: Callable[[], None] = lambda: None,
    time_zone: str | None = "UTC",
    frames: PandasSettings | None = None,
) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(key tuple, rows iterator) per key of a whole table; `on_unsorted` is called when its keys are not
    contiguous. Pandas frames are PySpark's (store/spark/pandas_frames.py), timestamps in `time_zone`."""
    starts = run_starts(data, key_columns)
    names = data.column_names
    key_idx = [names.index(k) for k in key_columns]
    if input_format == "pandas":
        frame_rows = (frames or PandasSettings()).rows(data)
        at = pa.array(starts, pa.int64())
        keys = list(zip(*(pylist(data.column(i).take(at)) for i in key_idx), strict=True))
        if len(set(keys)) != len(keys):
            on_unsorted()
            order = _group_order(data, key_idx)
            yield from _pandas_groups(data.take(pa.array(order[0], pa.int64())), order[1], time_zone, frame_rows)
            return
        bounds = [*starts.tolist(), data.num_rows]
        yield from _pandas_groups(data, list(zip(keys, np.diff(bounds).tolist(), strict=True)), time_zone, frame_rows)
        return
    columns = [pylist(data.column(n)) for n in names]
    make = functools.partial(tuple.__new__, _row_class(tuple(names)))
    rows = list(map(make, zip(*columns, strict=True)))
    if len(key_idx) == 1:
        col = columns[key_idx[0]]
        keys = [(col[s],) for s in starts.tolist()]
    else:
        keys = [tuple(columns[i][s] for i in key_idx) for s in starts.tolist()]
    if len(set(keys)) == len(keys):
        bounds = [*starts.tolist(), data.num_rows]
        groups = map(iter, map(rows.__getitem__, map(slice, bounds, bounds[1:])))
        yield from zip(keys, groups, strict=True)  # the loop runs in C
        return
    on_unsorted()
    by_key: dict[tuple[Any, ...], list[Any]] = {}
    for k, s, e in zip(keys, [*starts.tolist()], [*starts.tolist()[1:], data.num_rows], strict=True):
        got = by_key.get(k)
        if got is None:
            by_key[k] = rows[s:e]
        else:
            got.extend(rows[s:e])
    for k, group in by_key.items():
        yield k, iter(group)


def pylist(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """`column.to_pylist()`, through NumPy where that gives the same Python values (~15x faster:
    to_pylist makes an Arrow scalar per value): numbers and booleans without nulls, strings, binaries."""
    t = column.type
    fast = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
    if not fast and column.null_count == 0:
        fast = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
    if fast:
        values: list[Any] = column.to_numpy(zero_copy_only=False).tolist()
    else:  # structs as dicts and maps as lists of (key, value) pairs: PySpark's row flavour hands over as_py()
        values = column.to_pylist()
    return values


def struct_tuples(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """Each value of a struct column as a tuple in field order (None where the struct is null), built field by
    field through :func:`pylist` (many times faster than a dict per value from ``to_pylist``); nested structs stay
    dicts. Any other column: :func:`pylist`."""
    t = column.type
    if not pa.types.is_struct(t) or t.num_fields == 0:
        return pylist(column)
    out: list[Any] = []
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        rows: list[Any] = list(zip(*(pylist(f) for f in chunk.flatten()), strict=True))  # offset-adjusted children
        if chunk.null_count:
            valid = chunk.is_valid().to_numpy(zero_copy_only=False)
            rows = [r if ok else None for r, ok in zip(rows, valid, strict=True)]
        out.extend(rows)
    return out


def run_starts(table: pa.Table, key_columns: tuple[str, ...]) -> np.ndarray:
    """Indices where a run of equal grouping keys starts (0 first); nulls equal nulls."""
    n = table.num_rows
    if n == 0:
        return np.zeros(0, np.int64)
    change = np.zeros(n, np.bool_)
    change[0] = True
    for c in key_columns:
        col = table.column(c)
        a, b = col.slice(0, n - 1), col.slice(1)
        differs = pc.or_(pc.fill_null(pc.not_equal(a, b), False), pc.xor(pc.is_null(a), pc.is_null(b)))
        change[1:] |= differs.to_numpy()
    return np.flatnonzero(change)


def _group_order(data: pa.Table, key_idx: list[int]) -> tuple[list[int], list[tuple[tuple[Any, ...], int]]]:
    """Row order that makes each key contiguous (first-seen order) and each key's row count."""
    cols = [pylist(data.column(i)) for i in key_idx]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, k in enumerate(zip(*cols, strict=True)):
        groups.setdefault(k, []).append(i)
    return [i for idx in groups.values() for i in idx], [(k, len(v)) for k, v in groups.items()]


def _pandas_groups(
    data: pa.Table, sizes: list[tuple[tuple[Any, ...], int]], time_zone: str | None, rows_per_frame: int
) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """One frame for the chunk, then positional slices per key (each indexed from 0, as PySpark's frames are)."""
    yield from key_frames(to_pandas(data, time_zone), sizes, rows_per_frame)


@functools.lru_cache(maxsize=64)
def _row_class(names: tuple[str, ...]) -> type:
    """A :class:`pyspark.sql.Row` subclass with the fields as class-level properties (fast access)."""
    from pyspark.sql import Row

    attrs: dict[str, Any] = {"__fields__": list(names), "__slots__": ()}
    for i, name in enumerate(names):
        if name.isidentifier() and not hasattr(Row, name):
            attrs[name] = _field_getter(i, name)
    return type("Row", (Row,), attrs)


def _field_getter(index: int, name: str) -> Any:
    """A read-only attribute for field `index`: namedtuple's C descriptor where there is one (it reads
    the tuple slot directly, not through Row's Python-level ``__getitem__``: ~4x faster per access)."""
    try:
        from collections import _tuplegetter  # type: ignore[attr-defined]  # CPython's namedtuple fields
    except ImportError:  # pragma: no cover - other interpreters
        return property(operator.itemgetter(index))
    return _tuplegetter(index, f"field {name!r}")


__all__ = [
    "BATCH_INPUT_BUDGET_BYTES",
    "DEFAULT_INPUT_BUDGET_BYTES",
    "MARKER_COL",
    "PID_COL",
    "InputPhases",
    "TaskInput",
    "groups_of",
    "run_starts",
]
