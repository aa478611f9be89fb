"""A partition task's input: whole key groups, about a budget of Arrow data converted at a time.

A key's rows must be contiguous: a group ends where the key changes. Where the grouping key's types allow
(`sort_in_task`), the task sorts its input itself, in Arrow (``TaskInput(sort=True)``): Spark's row sort
of the same rows costs several times more. It holds the partition's Arrow input (up to ``hold_bytes``;
beyond that it spills the rows to local files by a hash of their key and sorts one file at a time), then
hands it out sorted. Otherwise the driver has Spark sort each partition by the grouping key, nulls first,
the marker (whose key is all nulls) ahead of any equal key, and the task streams it as it arrives.

Either way the task cuts its input into chunks of about ``budget_bytes`` of Arrow data, each ending on a
key boundary (the rows of the chunk's last key are held back and joined with the next batches), and
converts one chunk at a time to Python rows or pandas: the Python objects a task holds follow the budget
whatever the batch size; only a single key whose rows exceed the budget is held whole (a key's rows are
never split between calls).

When the whole input fits in one chunk, its order does not matter (groups are found by hashing). When
it takes several chunks, the input must be sorted: a key seen in two runs of one chunk fails the task.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statekeeper.store.errors import StoreStateError
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.spark.pandas_frames import PandasSettings, key_frames, to_pandas

INTERNAL_COL_PREFIX = "__sk_"
PID_COL = "__sk_partition"
MARKER_COL = "__sk_marker"
GROUP_COL = "__sk_group"
"""Where keys are routed by key group and the task sorts its input, the only internal column: a data row's key group
(the sort's first key, and the task checks it is its partition's), a marker's ``-(partition + 1)``."""
DEFAULT_INPUT_BUDGET_BYTES = 2 << 20
"""Arrow bytes of input a per-key task converts at once (``StatefulOperator(task_input_budget_bytes=...)``):
as Python rows or pandas objects they take about ten times that."""
BATCH_INPUT_BUDGET_BYTES = 4 << 20
"""The same for a vectorized processor, whose chunks stay Arrow: fewer, larger ``handleBatch`` calls."""
HOLD_BYTES = 64 << 20
"""Arrow bytes of input a task sorting its own input holds in memory; beyond them it spills to local files."""
SPILL_FILES = 64
"""Files a spilling task hashes its rows into: each is sorted in memory, so a task sorts its own input in
about ``HOLD_BYTES`` of memory up to ``SPILL_FILES`` times that much input."""


@dataclass
class InputPhases:
    """Time a task spends getting its input (ms): waiting for Spark's batches and converting them."""

    first_batch_ms: float = 0.0
    """From the task function's start to its first input batch (shuffle read, worker start-up)."""
    wait_ms: float = 0.0
    """Inside Spark's input iterator (shuffle read and the JVM's Arrow serialisation)."""
    convert_ms: float = 0.0
    """Arrow to Python rows / pandas, grouping (and sorting by key, in a task that sorts its input)."""
    rows: int = 0
    chunks: int = 0
    max_chunk_bytes: int = 0


class TaskInput:
    """The data batches of one task after its marker: the partition, the schema, then whole-key chunks."""

    def __init__(
        self,
        batches: Iterable[pa.RecordBatch],
        key_columns: tuple[str, ...],
        budget_bytes: int,
        *,
        sort: bool = False,
        hold_bytes: int = HOLD_BYTES,
        spill_dir: str | None = None,
        layout: KeyGroupLayout | None = None,
    ) -> None:
        """`sort`: the batches come in any order and the task sorts them (`hold_bytes` in memory, the rest
        spilled under `spill_dir`); else they come sorted by key, the marker first. `layout`: the key groups the
        driver routed the rows by, where the task sorts its input: the rows then carry only `GROUP_COL`."""
        self.key_columns = key_columns
        self.budget = max(1, budget_bytes)
        self.sort = sort
        self.layout = layout if sort else None
        self.hold_bytes = hold_bytes
        self.spill_dir = spill_dir
        self._marked = False
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
        """A task input of data rows already without marker and internal columns (in-process testing). Rows
        larger than the budget are sorted by key first, as a task sorts its input: their chunks are cut between
        keys, so each key's rows must be together."""
        task_input = cls((), key_columns, budget_bytes)
        task_input.partition = partition
        task_input.schema = data.schema
        if data.nbytes > task_input.budget:
            data = sort_by_key(data, key_columns)
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
        """Learn the partition: from the marker row (first, when sorted; the rows before it are kept for later),
        or, when the task sorts its input and the marker may come anywhere, from the first row's partition."""
        while True:
            b = self._next()
            if b is None:
                return
            if not b.num_rows:
                continue
            if self.sort:
                self.partition = self._first_partition(b)
                self.schema = _user_columns(b).schema
                self._head = list(self._pieces(self._check(b)))
                return
            markers = b.filter(b.column(MARKER_COL))
            if markers.num_rows:
                pids = sorted(set(markers.column(PID_COL).to_pylist()))
                if len(pids) != 1 or markers.num_rows != 1:
                    raise StoreStateError(f"a task got markers of state partitions {pids}: routing is broken")
                self.partition = int(pids[0])
                data = b.filter(pc.invert(b.column(MARKER_COL)))
                self.schema = _user_columns(data).schema
                self._head = [p for x in (*self._head, data) if x.num_rows for p in self._pieces(self._check(x))]
                return
            self._head.append(b)

    def _first_partition(self, b: pa.RecordBatch) -> int:
        """The partition of a task sorting its input, from its first row: its key group's owner, or the marker's."""
        if self.layout is None:
            return int(b.column(PID_COL)[0].as_py())
        if GROUP_COL not in b.schema.names:
            raise StoreStateError(f"a task routed by key group got no {GROUP_COL} column: routing is broken")
        group = b.column(GROUP_COL)[0].as_py()
        if group is None or not -self.layout.partitions <= group < self.layout.max_key_groups:
            raise StoreStateError(f"a task got a row of key group {group}: routing is broken")
        return -group - 1 if group < 0 else self.layout.owner(group)

    def _check(self, b: pa.RecordBatch) -> pa.RecordBatch:
        """`b` without its marker (counted) and internal columns; fails unless every row is this partition's."""
        if self.layout is not None:
            return self._check_groups(b, self.layout)
        marker = b.column(MARKER_COL)
        if pc.any(marker).as_py():
            if not self.sort or self._marked or pc.sum(marker).as_py() != 1:
                raise StoreStateError(
                    f"the task of state partition {self.partition} got a second marker: routing is broken"
                )
            self._marked = True  # the marker of a task sorting its own input: anywhere, once
            b = b.filter(pc.invert(marker))
        if b.num_rows and not pc.all(pc.equal(b.column(PID_COL), self.partition)).as_py():
            raise StoreStateError(f"the task of state partition {self.partition} got rows of another partition")
        return _user_columns(b)

    def _check_groups(self, b: pa.RecordBatch, layout: KeyGroupLayout) -> pa.RecordBatch:
        """`_check` where the rows carry their key group (kept: `_sorted` sorts by it first, then drops it)."""
        partition = self.partition
        assert partition is not None
        column = b.column(GROUP_COL)
        if column.null_count:
            raise StoreStateError(f"the task of state partition {partition} got rows without a key group")
        groups = column.to_numpy()
        marked = groups < 0
        markers = int(np.count_nonzero(marked))
        if markers:
            if self._marked or markers != 1 or int(groups[marked][0]) != -partition - 1:
                raise StoreStateError(
                    f"the task of state partition {partition} got a second marker or another partition's: "
                    "routing is broken"
                )
            self._marked = True
            kept = ~marked
            b, groups = b.filter(pa.array(kept)), groups[kept]
        lo, hi = layout.groups_of(partition)
        if groups.size and (int(groups.min()) < lo or int(groups.max()) >= hi):
            raise StoreStateError(
                f"the task of state partition {partition} (key groups [{lo}, {hi})) got rows of key groups "
                f"outside it: routing is broken"
            )
        return _user_columns(b, GROUP_COL)

    def _data(self) -> Iterator[pa.RecordBatch]:
        if self.sort:
            yield from self._sorted()
            return
        yield from self._head
        self._head = []
        yield from self._rest()

    def _rest(self) -> Iterator[pa.RecordBatch]:
        """The batches not read yet, checked, stripped and sliced."""
        while (b := self._next()) is not None:
            if b.num_rows:
                yield from self._pieces(self._check(b))

    def _sorted(self) -> Iterator[pa.RecordBatch]:
        """The whole input, sorted by key here: held in memory, or spilled by key hash once above `hold_bytes`."""
        assert self.schema is not None
        head, self._head = self._head, []
        held: list[pa.RecordBatch] = []
        size = 0
        spill: _Spill | None = None
        for b in itertools.chain(head, self._rest()):
            if spill is not None:
                spill.add(b)
                continue
            held.append(b)
            size += b.nbytes
            if size > self.hold_bytes:
                spill = _Spill(self.key_columns, self.spill_dir)
                for h in held:
                    spill.add(h)
                held = []
        if not self._marked:
            raise StoreStateError(f"the task of state partition {self.partition} got no marker: routing is broken")
        if spill is None:
            whole = [pa.Table.from_batches(held) if held else self.schema.empty_table()]
            held.clear()
        parts = _popping(whole) if spill is None else spill.parts()
        for part in parts:
            t = time.perf_counter()
            lead = (GROUP_COL,) if GROUP_COL in part.schema.names else ()
            ordered = sort_by_key(part, (*lead, *self.key_columns))
            if lead:
                ordered = ordered.drop_columns(list(lead))
            self.phases.convert_ms += (time.perf_counter() - t) * 1000
            del part  # the unsorted rows go as their sorted copy is made
            for b in ordered.to_batches():
                yield from self._pieces(b)

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
                f"{list(self.key_columns)} and larger than the task input budget ({self.budget} bytes): the task "
                "or the driver sorts it; raise task_input_budget_bytes only if you feed tasks yourself"
            )


def _user_columns(b: pa.RecordBatch, keep: str | None = None) -> pa.RecordBatch:
    """`b` without the internal columns (but `keep`)."""
    return b.select([n for n in b.schema.names if not n.startswith(INTERNAL_COL_PREFIX) or n == keep])


def sort_by_key(table: pa.Table, key_columns: tuple[str, ...]) -> pa.Table:
    """`table` with each key's rows together, in their order (a stable sort by key, nulls first)."""
    if table.num_rows < 2:
        return table
    table = table.combine_chunks()  # Arrow sorts one chunk by two keys ~30% faster than many chunks
    order = pc.sort_indices(table, sort_keys=[(k, "ascending") for k in key_columns], null_placement="at_start")
    return table.take(order)


class _Spill:
    """A task's input above what it holds: its rows in `SPILL_FILES` Arrow IPC files by a hash of their key
    (a key's rows all in one, in their order), read back one file at a time. The files live in a temporary
    directory removed when read back or dropped."""

    def __init__(self, key_columns: tuple[str, ...], directory: str | None) -> None:
        self.key_columns = key_columns
        self._dir = tempfile.TemporaryDirectory(prefix="statekeeper-input-", dir=directory)
        self._writers: list[Any] = [None] * SPILL_FILES

    def add(self, b: pa.RecordBatch) -> None:
        files = _key_hashes(b, self.key_columns) % SPILL_FILES
        order = np.argsort(files, kind="stable")
        counts = np.bincount(files, minlength=SPILL_FILES)
        grouped = b.take(pa.array(order))
        start = 0
        for i, n in enumerate(counts.tolist()):
            if n:
                writer = self._writers[i]
                if writer is None:
                    writer = self._writers[i] = pa.ipc.new_file(self._path(i), b.schema)
                writer.write_batch(grouped.slice(start, n))
                start += n

    def parts(self) -> Iterator[pa.Table]:
        """Each file's rows, read into memory one file at a time; the directory goes after the last."""
        with self._dir:
            for i, writer in enumerate(self._writers):
                if writer is None:
                    continue
                writer.close()
                with pa.OSFile(self._path(i)) as source:
                    table = pa.ipc.open_file(source).read_all()
                yield table
                del table

    def _path(self, i: int) -> str:
        return os.path.join(self._dir.name, f"{i}.arrow")


def _popping(tables: list[pa.Table]) -> Iterator[pa.Table]:
    """The tables, none kept here once handed out."""
    while tables:
        yield tables.pop(0)


def _key_hashes(b: pa.RecordBatch, key_columns: tuple[str, ...]) -> np.ndarray:
    """A hash of each row's key, equal for equal keys within this process (NaN and null share one)."""
    columns = []
    for k in key_columns:
        col = b.column(k)
        if pa.types.is_floating(col.type):  # NaN != NaN: each NaN would hash apart
            col = pc.if_else(pc.is_nan(col), pa.scalar(None, col.type), col)
        columns.append(pylist(col))
    keys = columns[0] if len(columns) == 1 else zip(*columns, strict=True)
    return np.fromiter(map(hash, keys), np.int64, b.num_rows) & np.int64(0x7FFFFFFFFFFFFFFF)


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
    structs = any(pa.types.is_struct(data.schema.field(i).type) for i in key_idx)
    if input_format == "pandas":
        frame_rows = (frames or PandasSettings()).rows(data)
        at = pa.array(starts, pa.int64())
        keys = list(zip(*(key_values(data.column(i).take(at)) for i in key_idx), strict=True))
        if len(set(keys)) != len(keys):
            on_unsorted()
            order = _group_order(data, key_idx)
            yield from _pandas_groups(data.take(pa.array(order[0], pa.int64())), order[1], time_zone, frame_rows)
            return
        bounds = [*starts.tolist(), data.num_rows]
        yield from _pandas_groups(data, list(zip(keys, np.diff(bounds).tolist(), strict=True)), time_zone, frame_rows)
        return
    columns = [pylist(data.column(n)) for n in names]
    make = functools.partial(tuple.__new__, row_class(tuple(names)))
    rows = list(map(make, zip(*columns, strict=True)))
    if structs:  # a struct's value in a key is a Row, as PySpark hands it (and hashable, unlike a dict)
        at = pa.array(starts, pa.int64())
        keys = list(zip(*(key_values(data.column(i).take(at)) for i in key_idx), strict=True))
    elif len(key_idx) == 1:
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


def key_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A grouping-key column's Python values: :func:`pylist`'s, but a struct is a ``Row`` (nested ones too), as
    PySpark hands a struct in a key."""
    if not pa.types.is_struct(column.type):
        return pylist(column)
    return [_as_row(v, column.type) for v in column.to_pylist()]


def _as_row(value: Any, t: pa.DataType) -> Any:
    if value is None or not pa.types.is_struct(t):
        return value
    fields = list(t)
    return tuple.__new__(row_class(tuple(f.name for f in fields)), [_as_row(value[f.name], f.type) for f in fields])


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
        for col in _comparable(table.column(c)):
            a, b = col.slice(0, n - 1), col.slice(1)
            differs = pc.or_(pc.fill_null(pc.not_equal(a, b), False), pc.xor(pc.is_null(a), pc.is_null(b)))
            change[1:] |= differs.to_numpy()
    return np.flatnonzero(change)


def _comparable(column: pa.ChunkedArray) -> list[pa.ChunkedArray]:
    """`column`, or for a struct (which Arrow cannot compare) whether it is null and each of its fields'."""
    if not pa.types.is_struct(column.type):
        return [column]
    return [pc.is_null(column), *(leaf for child in column.flatten() for leaf in _comparable(child))]


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
def row_class(names: tuple[str, ...]) -> type:
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
    "GROUP_COL",
    "HOLD_BYTES",
    "MARKER_COL",
    "PID_COL",
    "InputPhases",
    "TaskInput",
    "groups_of",
    "row_class",
    "run_starts",
    "sort_by_key",
]
