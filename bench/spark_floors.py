"""The floors of ``bench spark``: the least the work of a batch can take, each without a part of what a query does.

- The pandas floor (:func:`pandas_floor`): the user's pandas function on the batch's per-key frames in a plain
  Python loop, no Spark, no state.
- The RocksDB floors, in processes (:func:`state_floor`, :func:`per_key_floor`): the vectorized and per-key
  processors' state and user logic on raw RocksDB, no Spark, no changelog, no typed codec.
- The same RocksDB work inside Spark's own Python task (:func:`in_task`): the batch shuffled by Spark's hash of the
  key, each task sorting its rows by key and doing that work on a RocksDB of its partition kept by its Python
  worker, its output handed back as Arrow. What no Python operator on RocksDB running in Spark can do with less.
- The same again, routed as statekeeper routes (:func:`in_task` with a layout): each row sent to the owner of its key
  group (what lets a store be rescaled), the task's input taken as statekeeper's task takes it (checked, sorted by
  key group and key), each stored key its key group and the key (the group computed per key), and the batch's writes
  synced to a file before the task ends (what makes them durable). What no rescalable, durable Python operator on
  RocksDB can do with less.
"""

from __future__ import annotations

import functools
import gc
import itertools
import multiprocessing
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from statekeeper.store.key_groups import KeyGroupLayout


# -- the pandas floor -----------------------------------------------------------------------------
class _NoState:
    """A GroupState that holds nothing: the floor keeps no state."""

    exists = False
    get = None

    def update(self, value: Any) -> None:
        pass


def pandas_floor(files: list[Path], function: Callable[..., Any], key: str = "key", cores: int = 2) -> list[float]:
    """ms per input file: its keys split over `cores` processes (the cores the queries get: local[2]), each
    sorting its rows by key, cutting them into per-key pandas frames indexed from 0 (as PySpark hands them to an
    applyInPandasWithState function) and calling `function` on each in a plain loop with a state that holds
    nothing, its output frames kept; the slowest process's time. Reading the file is left out (the source's work)."""
    with ProcessPoolExecutor(cores, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = range(cores)
        return [
            max(pool.map(_floor_part, [f] * cores, [function] * cores, [key] * cores, parts, [cores] * cores))
            for f in files
        ]


def _floor_part(file: Path, function: Callable[..., Any], key: str, part: int, parts: int) -> float:
    """`pandas_floor`'s work on the keys of `file` whose hash falls to `part` of `parts`; its ms."""
    table = pq.read_table(file)
    codes = table.column(key).combine_chunks().dictionary_encode().indices.to_numpy()  # the same in every part
    table = table.filter(pa.array(codes % parts == part))  # a shuffle's work, not the floor's: not timed
    gc.disable()  # as a task pauses the cyclic GC (store/spark/executor.py)
    t = time.perf_counter()
    pdf = table.sort_by(key).to_pandas()
    column = pdf[key].to_numpy()
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]]).tolist()
    ends = [*starts[1:], len(column)]
    out: list[Any] = []
    for start, end in zip(starts, ends, strict=True):
        frame = pdf.iloc[start:end].reset_index(drop=True)
        out.extend(function((column[start],), iter([frame]), _NoState()))
    ms = (time.perf_counter() - t) * 1000
    gc.enable()
    if len(out) != len(starts):
        raise RuntimeError(f"the pandas floor: {len(out)} output frames for {len(starts)} keys")
    return ms


# -- the state floors ------------------------------------------------------------------------------
_TOTALS = struct.Struct(">qq")
"""The floors' state value: (count, total) as two big-endian int64, the least encoding there is."""
_RECORD = struct.Struct(">II")
"""A synced record's key and value lengths (`sync_writes`)."""

Columns = tuple[list[str], list[int], list[int]]
"""A floor's output: each touched key with its new count and total (the queries' output rows, as columns)."""


class FloorDB:
    """A floor's RocksDB at `path` with its state column family, opened once and kept over the batches, as a store
    keeps its own. The column family's objects are held too: rocksdict flushes a column family's memtable whenever a
    Python object for it goes (even with others still open), which a store does not do after every batch."""

    def __init__(self, path: str) -> None:
        from statekeeper.store.rocks import open_db

        self.db = open_db(path, ["totals"])
        self.cf = self.db.get_column_family("totals")
        self.handle = self.db.get_column_family_handle("totals")

    def close(self) -> None:
        del self.cf, self.handle  # before the DB: a column family object outliving it keeps the DB's lock
        self.db.close()


Writes = list[tuple[bytes, bytes]]
"""The (stored key, value) pairs a batch wrote, where a floor syncs them (`sync_writes`)."""
FloorWork = Callable[[FloorDB, pa.Table, Callable[[str], bytes], str, "Writes | None"], Columns]
"""One batch's work on a floor's RocksDB: (its DB, its rows sorted by key, each key's stored bytes, the key column,
where to list its writes or None) -> its output."""


def sync_writes(path: str, writes: Writes) -> None:
    """Write a batch's `writes` to `path` (each record its two lengths, key and value) and fsync it: the least a
    durable store does per batch (no checksum, no compression, no upload, no commit record)."""
    data = b"".join(itertools.chain.from_iterable((_RECORD.pack(len(k), len(v)), k, v) for k, v in writes))
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def state_floor(files: list[Path], key: str = "key", cores: int = 2, groups: int = 1024) -> list[float]:
    """ms per input file after the first: what a vectorized batch's state work costs on RocksDB itself: the file's
    rows aggregated by key in Arrow (the processor's own logic), then a point get of each touched key and one write
    batch of the new totals, in the store's key order (`_db_floor_part`)."""
    return _db_floor(files, key, cores, groups, _vectorized_work)


def per_key_floor(files: list[Path], key: str = "key", cores: int = 2, groups: int = 1024) -> list[float]:
    """ms per input file after the first: the least a per-key Python processor can take on RocksDB: each row a
    PySpark Row (the API's), the bench's own per-key processor (CountSum) called once per key on its rows, its state
    a point get and a put per key on raw RocksDB (no changelog, no typed codec), its output rows kept in a list
    (`_db_floor_part`)."""
    return _db_floor(files, key, cores, groups, _per_key_work)


def _db_floor(files: list[Path], key: str, cores: int, groups: int, work: FloorWork) -> list[float]:
    with ProcessPoolExecutor(cores, mp_context=multiprocessing.get_context("fork")) as pool:
        each = [files] * cores, [key] * cores, range(cores), [cores] * cores, [groups] * cores, [work] * cores
        parts = list(pool.map(_db_floor_part, *each))
    return [max(ms) for ms in zip(*parts, strict=True)][1:]


def _db_floor_part(files: list[Path], key: str, part: int, parts: int, groups: int, work: FloorWork) -> list[float]:
    """`work`'s ms on each file, in one of `parts` processes: the file's keys of its key groups (as the partitions
    own them), with a rocksdict DB of the stores' options kept over the files (its state grows as the query's
    does), the cyclic GC paused while timed, as in a task. Reading, splitting, sorting and encoding the keys are left
    out (the shuffle's, the task's sort's and the codec's work): no Python operator on RocksDB does less."""
    from statekeeper.store.formats.typed_keys import KeyCodec, stored_key_encoder
    from statekeeper.store.formats.typed_schema import parse_ddl

    encode = stored_key_encoder(KeyCodec(parse_ddl(f"{key} string"), "bench"), groups)
    where = tempfile.mkdtemp(prefix="bench-state-floor-")
    db = FloorDB(where)
    out: list[float] = []
    try:
        for file in files:
            table = pq.read_table(file)
            names = table.column(key).to_pylist()
            stored = {k: encode((k,)) for k in set(names)}
            table = table.append_column("gk", pa.array([stored[k] for k in names], pa.binary()))
            table = table.filter(pa.array([int.from_bytes(stored[k][:2], "big") % parts == part for k in names]))
            table = table.sort_by("gk").drop_columns(["gk"]).combine_chunks()  # the task's sort: not timed
            gc.disable()  # as a task pauses the cyclic GC (store/spark/executor.py)
            t = time.perf_counter()
            work(db, table, stored.__getitem__, key, None)
            out.append((time.perf_counter() - t) * 1000)
            gc.enable()
    finally:
        db.close()
        shutil.rmtree(where, ignore_errors=True)
    return out


def _vectorized_work(
    db: FloorDB, table: pa.Table, encode: Callable[[str], bytes], key: str, writes: Writes | None
) -> Columns:
    import rocksdict as rd

    from statekeeper.store.spark.task_input import pylist

    cf, handle = db.cf, db.handle
    agg = table.group_by(key, use_threads=False).aggregate([("value", "count"), ("value", "sum")])
    names = pylist(agg.column(key))
    gks = list(map(encode, names))
    counts, sums = pylist(agg.column("value_count")), pylist(agg.column("value_sum"))
    old = list(map(cf.get, gks))
    wb = rd.WriteBatch(raw_mode=True)
    unpack, pack, put = _TOTALS.unpack, _TOTALS.pack, wb.put
    new_counts, new_sums, packed = [], [], []
    for gk, c, s, o in zip(gks, counts, sums, old, strict=True):
        c0, s0 = unpack(o) if o is not None else (0, 0)
        raw = pack(c0 + c, s0 + s)
        put(gk, raw, handle)
        packed.append(raw)
        new_counts.append(c0 + c)
        new_sums.append(s0 + s)
    db.db.write(wb)
    if writes is not None:
        writes.extend(zip(gks, packed, strict=True))
    return names, new_counts, new_sums


class _RawValue:
    """A ValueState of (count, total) straight on a rocksdict column family, at the key `gk`."""

    __slots__ = ("cf", "gk")

    def __init__(self, cf: Any) -> None:
        self.cf, self.gk = cf, b""

    def get(self) -> tuple[int, int] | None:
        raw = self.cf.get(self.gk)
        return None if raw is None else _TOTALS.unpack(raw)

    def update(self, value: tuple[int, int]) -> None:
        self.cf.put(self.gk, _TOTALS.pack(*value))


class _ListedValue(_RawValue):
    """A `_RawValue` that also lists what it writes (to be synced)."""

    __slots__ = ("writes",)

    def __init__(self, cf: Any, writes: Writes) -> None:
        super().__init__(cf)
        self.writes = writes

    def update(self, value: tuple[int, int]) -> None:
        raw = _TOTALS.pack(*value)
        self.cf.put(self.gk, raw)
        self.writes.append((self.gk, raw))


def _per_key_work(
    db: FloorDB, table: pa.Table, encode: Callable[[str], bytes], key: str, writes: Writes | None
) -> Columns:
    from statekeeper.store.spark.task_input import pylist, row_class, run_starts
    from testkit.processors import CountSum

    state = _RawValue(db.cf) if writes is None else _ListedValue(db.cf, writes)
    processor = CountSum()
    processor.totals = state  # type: ignore[assignment]  # the least ValueState: get and update
    make = functools.partial(tuple.__new__, row_class(tuple(table.column_names)))
    columns = [pylist(table.column(n)) for n in table.column_names]
    rows = list(map(make, zip(*columns, strict=True)))
    bounds = [*run_starts(table, (key,)).tolist(), table.num_rows]
    names, handle = columns[table.column_names.index(key)], processor.handleInputRows
    out: list[Any] = []
    for start, end in itertools.pairwise(bounds):
        k = (names[start],)
        state.gk = encode(k[0])
        out.extend(handle(k, iter(rows[start:end]), None))  # type: ignore[arg-type]
    keys, counts, totals = zip(*out, strict=True) if out else ((), (), ())
    return list(keys), list(counts), list(totals)


# -- the RocksDB floors in Spark's own Python task -----------------------------------------------------
WORK: dict[str, FloorWork] = {"per-key": _per_key_work, "vectorized": _vectorized_work}
_TASK_DBS: dict[tuple[str, int], FloorDB] = {}
"""A Python worker's open RocksDB per (floor query's directory, partition): kept over the query's batches, as a
worker keeps a statekeeper store open."""


class Pids:
    """A Spark accumulator of Python workers' pids (a set)."""

    def zero(self, value: set[int]) -> set[int]:
        return set()

    def addInPlace(self, value1: set[int], value2: set[int]) -> set[int]:  # noqa: N802 (PySpark's name)
        value1 |= value2
        return value1


def in_task(
    kind: str,
    where: str,
    last: bool,
    opened: Any,
    closed: Any,
    batches: Iterator[pa.RecordBatch],
    *,
    layout: KeyGroupLayout | None = None,
) -> Iterator[pa.RecordBatch]:
    """A mapInArrow function (partial of `kind`, a key of `WORK`, the query's directory, whether this is its last
    batch and two `Pids` accumulators): the task's rows sorted by key (Arrow; RocksDB writes an ascending run
    fastest), `kind`'s work on its partition's RocksDB (the key's UTF-8 bytes as the stored key: the least encoding),
    its output as one Arrow batch (key, count, total). The cyclic GC paused, as a task pauses it. Each Python worker
    keeps its own DB per partition (Spark hands a partition's tasks to either worker), so each holds about the
    partition's state after a few batches; a task of the last batch closes every DB of the query its worker holds and
    empties the worker's block cache of their blocks (the next queries run in the same workers, and measure their
    memory), `opened` and `closed` say which did.

    With `layout` (the batch routed by key group as statekeeper's tasks plan routes it, `TasksPlan`): the task takes
    its input as statekeeper's task does (`TaskInput`: its rows checked against its key groups, sorted by key group
    and key), stores each key as its key group and the key (`stored_key_encoder`, per key), and syncs the batch's
    writes to a file of its DB before handing its output back (`sync_writes`)."""
    from statekeeper.store.rocks import release_free_heap, shared_memory
    from statekeeper.store.spark.worker_cache import use_worker_memory

    use_worker_memory()  # as a task's stores: else the worker's first open sets the process default for them too
    gc_was = gc.isenabled()
    gc.disable()
    try:
        table, part, encode = _task_rows(batches) if layout is None else _routed_rows(batches, layout)
        if table is not None:
            for old in [k for k in _TASK_DBS if k[0] != where]:  # an earlier query's, left by a worker that ran
                _TASK_DBS.pop(old).close()  # no task of its last batch
            db = _TASK_DBS.get((where, part))
            if db is None:
                path = os.path.join(where, str(os.getpid()), str(part))
                os.makedirs(path, exist_ok=True)
                db = _TASK_DBS[(where, part)] = FloorDB(path)
                opened.add({os.getpid()})
            writes: Writes | None = None if layout is None else []
            keys, counts, totals = WORK[kind](db, table, encode, "key", writes)
            if writes is not None:
                sync_writes(os.path.join(where, str(os.getpid()), f"{part}.writes"), writes)
            yield pa.RecordBatch.from_arrays(
                [pa.array(keys, pa.string()), pa.array(counts, pa.int64()), pa.array(totals, pa.int64())],
                names=["key", "count", "total"],
            )
        if last:
            for held in [k for k in _TASK_DBS if k[0] == where]:
                _TASK_DBS.pop(held).close()
            memory = shared_memory()  # the process's block cache, which the worker's stores share: the floor's
            memory.cache.set_capacity(0)  # blocks out of it, and the heap they took back to the OS
            memory.cache.set_capacity(memory.limits.total_bytes)
            release_free_heap()
            closed.add({os.getpid()})
    finally:
        if gc_was:
            gc.enable()


def _task_rows(batches: Iterator[pa.RecordBatch]) -> tuple[pa.Table | None, int, Callable[[str], bytes]]:
    """Spark's own task's rows sorted by key (None: it got none), its partition and the least key encoding."""
    from pyspark import TaskContext

    received = list(batches)
    if not any(b.num_rows for b in received):
        return None, -1, str.encode
    part = TaskContext.get().partitionId()  # type: ignore[union-attr]
    return pa.Table.from_batches(received).sort_by("key").combine_chunks(), part, str.encode


def _routed_rows(
    batches: Iterator[pa.RecordBatch], layout: KeyGroupLayout
) -> tuple[pa.Table | None, int, Callable[[str], bytes]]:
    """A routed task's rows as statekeeper's task takes them (checked, sorted by key group and key; None: it got
    none), its partition and its stored keys' encoding (key group and key)."""
    from statekeeper.store.formats.typed_keys import KeyCodec, stored_key_encoder
    from statekeeper.store.formats.typed_schema import parse_ddl
    from statekeeper.store.spark.task_input import BATCH_INPUT_BUDGET_BYTES, TaskInput

    task_input = TaskInput(batches, ("key",), BATCH_INPUT_BUDGET_BYTES, sort=True, layout=layout)
    chunks = list(task_input.chunks())
    stored = stored_key_encoder(KeyCodec(parse_ddl("key string"), "bench"), layout.max_key_groups)
    table = pa.concat_tables(chunks).combine_chunks() if chunks else None
    return table, task_input.partition if task_input.partition is not None else -1, lambda k: stored((k,))


__all__ = ["WORK", "Pids", "in_task", "pandas_floor", "per_key_floor", "state_floor", "sync_writes"]
