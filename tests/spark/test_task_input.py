"""A task's streamed input: whole key groups under a memory budget, whatever the batches' cut and size."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store.errors import StoreStateError
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.spark.executor import TaskSpec, run_task
from statekeeper.store.spark.task_input import (
    BATCH_INPUT_BUDGET_BYTES,
    DEFAULT_INPUT_BUDGET_BYTES,
    GROUP_COL,
    MARKER_COL,
    PID_COL,
    TaskInput,
    struct_tuples,
)
from statekeeper.store.spark.task_output import META_COL
from statekeeper.store.spark.worker_cache import WORKER_MEMORY_MB
from testkit.processors import CountSumVectorized

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("user", pa.string()), ("count", pa.int64()), ("total", pa.int64()), (META_COL, pa.string())])


def _batches(
    rows: Sequence[tuple[str | None, int]], cuts: list[int], marker_first: bool = True
) -> list[pa.RecordBatch]:
    """The task's input as Spark would send it: the marker row, then `rows`, cut into record batches."""
    users = [u for u, _ in rows]
    values = [v for _, v in rows]
    marker = ([None], [None], [True])
    data = (users, values, [False] * len(rows))
    first, second = (marker, data) if marker_first else (data, marker)
    table = pa.table(
        {
            "user": pa.array(first[0] + second[0], pa.string()),
            "value": pa.array(first[1] + second[1], pa.int64()),
            PID_COL: pa.array([0] * (len(rows) + 1), pa.int32()),
            MARKER_COL: first[2] + second[2],
        }
    )
    out, start = [], 0
    for end in [*sorted({c for c in cuts if 0 < c < table.num_rows}), table.num_rows]:
        out.extend(table.slice(start, end - start).to_batches())
        start = end
    return out


def _model(rows: Sequence[tuple[str | None, int]]) -> dict[tuple[Any, ...], list[int]]:
    groups: dict[tuple[Any, ...], list[int]] = {}
    for u, v in rows:
        groups.setdefault((u,), []).append(v)
    return groups


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.tuples(st.one_of(st.none(), st.sampled_from("abcdefgh")), st.integers(0, 9)), max_size=60),
    cuts=st.lists(st.integers(0, 61), max_size=8),
    budget=st.sampled_from([1, 64, 300, 1 << 20]),
    input_format=st.sampled_from(["rows", "pandas"]),
)
def test_groups_match_a_dict_model_whatever_the_batches_and_budget(
    rows: list[tuple[str | None, int]], cuts: list[int], budget: int, input_format: str
) -> None:
    """Sorted input: every key comes exactly once with all its rows in order, however batches and budget cut it."""
    rows = sorted(rows, key=lambda r: (r[0] is not None, r[0] or ""))  # Spark's asc nulls first; sort is stable
    task_input = TaskInput(_batches(rows, cuts), ("user",), budget)
    assert task_input.partition == 0
    got: dict[tuple[Any, ...], list[int]] = {}
    for key, it in task_input.groups(input_format):
        assert key not in got, f"key {key} came twice"
        parts = list(it)
        got[key] = [int(v) for p in parts for v in p["value"]] if input_format == "pandas" else [r.value for r in parts]
    assert got == _model(rows)
    assert task_input.phases.rows == len(rows)


def _unsorted_batches(
    keys: Sequence[Any], key_type: pa.DataType, marker_at: int, cuts: list[int]
) -> list[pa.RecordBatch]:
    """A task's input as Spark sends it without sorting: rows in any order, the marker anywhere among them."""
    n = len(keys) + 1
    at = min(marker_at, len(keys))
    table = pa.table(
        {
            "user": pa.array([*keys[:at], None, *keys[at:]], key_type),
            "value": pa.array([*range(at), None, *range(at, len(keys))], pa.int64()),
            PID_COL: pa.array([3] * n, pa.int32()),
            MARKER_COL: [i == at for i in range(n)],
        }
    )
    out, start = [], 0
    for end in [*sorted({c for c in cuts if 0 < c < n}), n]:
        out.extend(table.slice(start, end - start).to_batches())
        start = end
    return out


_KEYS = {
    pa.string(): st.one_of(st.none(), st.sampled_from(["a", "b", "", "\x00", "é", "bb"])),
    pa.int64(): st.one_of(st.none(), st.integers(-3, 3), st.just(2**63 - 1)),
    pa.float64(): st.one_of(st.none(), st.sampled_from([0.0, 1.5, -2.0, float("inf")])),
}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    key_type=st.sampled_from(list(_KEYS)),
    marker_at=st.integers(0, 80),
    cuts=st.lists(st.integers(0, 81), max_size=8),
    budget=st.sampled_from([1, 64, 300, 1 << 20]),
    hold=st.sampled_from([1, 500, 1 << 20]),
    input_format=st.sampled_from(["rows", "pandas"]),
)
def test_a_task_sorting_its_own_input_hands_each_key_once_with_its_rows_in_order(
    tmp_path_factory: pytest.TempPathFactory,
    data: st.DataObject,
    key_type: pa.DataType,
    marker_at: int,
    cuts: list[int],
    budget: int,
    hold: int,
    input_format: str,
) -> None:
    """Rows in any order, the marker anywhere, held whole or spilled to files (hold 1: every batch spills):
    each key comes exactly once, with all its rows in the order they came, whatever the cuts and budget."""
    keys = data.draw(st.lists(_KEYS[key_type], max_size=80))
    spill_dir = tmp_path_factory.mktemp("spill")
    task_input = TaskInput(
        _unsorted_batches(keys, key_type, marker_at, cuts),
        ("user",),
        budget,
        sort=True,
        hold_bytes=hold,
        spill_dir=str(spill_dir),
    )
    assert task_input.partition == 3
    got: dict[tuple[Any, ...], list[int]] = {}
    for key, it in task_input.groups(input_format):
        assert key not in got, f"key {key} came twice"
        parts = list(it)
        got[key] = [int(v) for p in parts for v in p["value"]] if input_format == "pandas" else [r.value for r in parts]
    want: dict[tuple[Any, ...], list[int]] = {}
    for i, k in enumerate(keys):
        want.setdefault((k,), []).append(i)
    assert got == want
    assert task_input.phases.rows == len(keys)
    assert list(spill_dir.iterdir()) == []  # the spilled files go with the task's input


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.sampled_from([1, 2, None])), max_size=60),
    hold=st.sampled_from([1, 1 << 20]),
)
def test_a_task_sorting_its_own_input_groups_a_key_of_two_columns(
    tmp_path_factory: pytest.TempPathFactory, keys: list[tuple[str | None, int | None]], hold: int
) -> None:
    n = len(keys) + 1
    batch = pa.record_batch(
        {
            "user": pa.array([None, *(u for u, _ in keys)], pa.string()),
            "day": pa.array([None, *(d for _, d in keys)], pa.int32()),
            "value": pa.array(range(-1, len(keys)), pa.int64()),
            PID_COL: pa.array([0] * n, pa.int32()),
            MARKER_COL: [True] + [False] * len(keys),
        }
    )
    spill_dir = str(tmp_path_factory.mktemp("spill"))
    batches = [batch.slice(i, 7) for i in range(0, n, 7)][::-1]  # the marker last
    task_input = TaskInput(batches, ("user", "day"), 64, sort=True, hold_bytes=hold, spill_dir=spill_dir)
    got = {k: [r.value for r in it] for k, it in task_input.groups("rows")}
    want: dict[tuple[Any, ...], list[int]] = {}
    for b in batches:
        for u, d, v, m in zip(*(b.column(c).to_pylist() for c in ("user", "day", "value", MARKER_COL)), strict=True):
            if not m:
                want.setdefault((u, d), []).append(v)
    assert got == want


LAYOUT = KeyGroupLayout(4, 16)
"""Partition 2 of it owns key groups [8, 12)."""


def _routed_batches(
    keys: Sequence[str], group: dict[str, int], marker_at: int, cuts: list[int], partition: int = 2
) -> list[pa.RecordBatch]:
    """A task's input as the driver sends it where keys are routed by key group: the user's columns and each row's
    key group, the marker (group ``-(partition + 1)``) anywhere among them."""
    at = min(marker_at, len(keys))
    table = pa.table(
        {
            "user": pa.array([*keys[:at], None, *keys[at:]], pa.string()),
            "value": pa.array([*range(at), None, *range(at, len(keys))], pa.int64()),
            GROUP_COL: pa.array(
                [*(group[k] for k in keys[:at]), -partition - 1, *(group[k] for k in keys[at:])], pa.int32()
            ),
        }
    )
    out, start = [], 0
    for end in [*sorted({c for c in cuts if 0 < c < table.num_rows}), table.num_rows]:
        out.extend(table.slice(start, end - start).to_batches())
        start = end
    return out


@pytest.mark.parametrize("marker_at", [0, 123])
@pytest.mark.parametrize("hold", [1, 1 << 20])
def test_a_task_sorting_its_own_input_hands_its_keys_in_key_group_order(
    hold: int, marker_at: int, tmp_path: Path
) -> None:
    """Routed by key group, each row carries its key group: the task learns its partition from its first row (the
    marker's, or the owner of the row's group) and hands its keys out by key group, then key: the order the store
    keeps them in. Held whole, that is the order of the whole input; spilled, of each spilled file. The key group
    never reaches the processor."""
    keys = [f"k{i % 40:02d}" for i in range(400)][::-1]
    group = {k: 8 + (7 * int(k[1:])) % 4 for k in set(keys)}
    batches = _routed_batches(keys, group, marker_at, [50, 200])
    task_input = TaskInput(
        batches, ("user",), 1 << 10, sort=True, hold_bytes=hold, spill_dir=str(tmp_path), layout=LAYOUT
    )
    assert task_input.partition == 2
    got = [(key, [r for r in it]) for key, it in task_input.groups("rows")]
    assert sorted(k for k, _ in got) == sorted({(k,) for k in keys})
    assert all(
        GROUP_COL not in r.__fields__ and [r.value for r in rows] == sorted(r.value for r in rows)
        for _, rows in got
        for r in rows
    )
    if hold > 1:
        assert [k for k, _ in got] == sorted({(k,) for k in keys}, key=lambda k: (group[k[0]], k))
    assert task_input.schema is not None and GROUP_COL not in task_input.schema.names


def test_a_task_routed_by_key_group_with_only_its_marker_has_a_partition_and_no_keys() -> None:
    task_input = TaskInput(_routed_batches([], {}, 0, [], partition=3), ("user",), 1 << 10, sort=True, layout=LAYOUT)
    assert task_input.partition == 3 and list(task_input.groups("rows")) == []


@pytest.mark.parametrize(
    ("name", "batches", "error"),
    [
        ("a row of another partition's key group", _routed_batches(["a", "b"], {"a": 9, "b": 12}, 0, []), "outside"),
        ("the first row of a key group outside the layout", _routed_batches(["a"], {"a": 16}, 1, []), "key group 16"),
        ("a second marker", _routed_batches(["a"], {"a": 9}, 0, []) * 2, "second marker"),
        ("another partition's marker", _routed_batches(["a"], {"a": 9}, 1, [], partition=1), "second marker"),
        ("no marker", [b.slice(1) for b in _routed_batches(["a"], {"a": 9}, 0, [])], "no marker"),
        (
            "no key group column",
            [b.drop_columns([GROUP_COL]) for b in _routed_batches(["a"], {"a": 9}, 0, [])],
            "no __sk_group",
        ),
        (
            "a row without a key group",
            [
                b.set_column(2, GROUP_COL, pa.array([-3, None], pa.int32()))
                for b in _routed_batches(["a"], {"a": 9}, 0, [])
            ],
            "without a key group",
        ),
    ],
)
def test_a_task_routed_by_key_group_refuses_rows_its_partition_does_not_own(
    name: str, batches: list[pa.RecordBatch], error: str
) -> None:
    """Routing by key group is Spark's computation of each row's group and owner: a task never takes a row whose
    key group its partition does not own, nor a partition that is not its marker's."""
    with pytest.raises(StoreStateError, match=error):
        list(TaskInput(batches, ("user",), 1 << 20, sort=True, layout=LAYOUT).groups("rows"))


def test_a_task_sorting_its_own_input_refuses_a_second_marker_or_none() -> None:
    twice = _unsorted_batches(["a", "b"], pa.string(), 1, []) + _unsorted_batches(["c"], pa.string(), 0, [])
    with pytest.raises(StoreStateError, match="second marker"):
        list(TaskInput(twice, ("user",), 1 << 20, sort=True).groups("rows"))
    data_only = [b.filter(pc.invert(b.column(MARKER_COL))) for b in _unsorted_batches(["a"], pa.string(), 0, [])]
    with pytest.raises(StoreStateError, match="no marker"):
        list(TaskInput(data_only, ("user",), 1 << 20, sort=True).groups("rows"))


def test_unsorted_input_is_grouped_within_the_budget_and_refused_beyond_it() -> None:
    rows = [("b", 1), ("a", 2), ("b", 3), ("a", 4)] * 50
    fits = TaskInput(_batches(rows, [], marker_first=False), ("user",), 1 << 20)
    assert {k: [r.value for r in it] for k, it in fits.groups("rows")} == _model(rows)
    too_big = TaskInput(_batches(rows, list(range(0, 200, 10))), ("user",), 256)
    with pytest.raises(StoreStateError, match=r"unsorted by key.*task input budget"):
        list(too_big.groups("rows"))


def test_a_batch_larger_than_the_budget_is_converted_in_chunks_within_it() -> None:
    """With a large ``maxRecordsPerBatch`` Spark sends one big batch: the task still converts a budget at a time."""
    rows = sorted((f"user{i // 3:05d}", i) for i in range(30_000))
    budget = 64 << 10
    task_input = TaskInput(_batches(rows, []), ("user",), budget)
    got = {k: [r.value for r in it] for k, it in task_input.groups("rows")}
    assert got == _model(rows)
    assert task_input.phases.chunks > 5
    assert task_input.phases.max_chunk_bytes <= budget * 3 // 2


def test_the_default_budget_goes_by_what_the_processor_converts_its_input_to(tmp_path: Path) -> None:
    """Per-key rows become Python objects (~10x their Arrow bytes): a smaller default than vectorized Arrow chunks."""
    from statekeeper.store.spark import StatefulOperator
    from testkit.processors import CountSum

    def budget(processor: Any, **kw: Any) -> int:
        op = StatefulOperator(tmp_path.as_uri(), "op", "user", processor, "user string", **kw)
        return int(op.task_input_budget_bytes)

    assert budget(CountSum()) == DEFAULT_INPUT_BUDGET_BYTES < budget(CountSumVectorized()) == BATCH_INPUT_BUDGET_BYTES
    assert budget(CountSum(), task_input_budget_bytes=1 << 20) == 1 << 20  # an explicit budget wins


def _spec(tmp_path: Path, processor: Any, budget: int) -> TaskSpec:
    return TaskSpec(
        root=(tmp_path / "root").as_uri(),
        operator="op",
        num_partitions=1,
        version=0,
        load_ids=("",),
        commit=True,
        batch_ts_ms=1_000_000,
        key_columns=("user",),
        processor=processor,
        output_schema=SCHEMA,
        local_dir=str(tmp_path / "local"),
        input_budget_bytes=budget,
    )


def test_a_vectorized_processor_gets_each_key_in_exactly_one_call_of_several(tmp_path: Path) -> None:
    rows = sorted((f"u{i % 97:03d}", i) for i in range(3000))
    calls: list[set[str]] = []

    class Recording(CountSumVectorized):
        def handleBatch(self, rows: pa.Table, timerValues: Any) -> Any:
            calls.append(set(rows.column("user").to_pylist()))
            return super().handleBatch(rows, timerValues)

    out = pa.Table.from_batches(list(run_task(_spec(tmp_path, Recording(), 4096), _batches(rows, [512, 1024, 2048]))))
    assert len(calls) > 2
    assert sum(len(c) for c in calls) == 97 == len(set().union(*calls))
    meta = json.loads(next(m for m in out.column(META_COL).to_pylist() if m))
    assert meta["input_rows"] == 3000 and meta["phases"]["input_chunks"] == len(calls)
    totals = {u: (c, t) for u, c, t, m in zip(*(out.column(i).to_pylist() for i in range(4)), strict=True) if not m}
    assert totals == {k: (len(v), sum(v)) for (k,), v in _model(rows).items()}


_RSS_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    import pyarrow as pa
    from statekeeper.store.spark.executor import TaskSpec, run_task
    from statekeeper.store.spark.task_input import MARKER_COL, PID_COL
    from testkit.processors import CountSum
    from tests.spark.test_task_input import SCHEMA

    rows, keys, root, local, sort = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
    per_batch = 10_000  # Spark's spark.sql.execution.arrow.maxRecordsPerBatch

    def marker():
        return pa.record_batch({"user": pa.array([None], pa.string()), "value": pa.array([None], pa.int64()),
                                PID_COL: pa.array([0], pa.int32()), MARKER_COL: [True]})

    def batches():
        if not sort:
            yield marker()  # Spark sorted the partition: the marker first, then the keys in order
        for start in range(0, rows, per_batch):
            n = min(per_batch, rows - start)
            if sort and start == rows // 2 // per_batch * per_batch:
                yield marker()
            at = [(start + i) * 7919 % rows if sort else start + i for i in range(n)]  # a permutation when sorting
            k = [f"user{a * keys // rows:09d}" for a in at]  # about rows/keys each
            yield pa.record_batch({"user": pa.array(k, pa.string()), "value": pa.array(range(n), pa.int64()),
                                   PID_COL: pa.array([0] * n, pa.int32()), MARKER_COL: [False] * n})

    spec = TaskSpec(root=root, operator="op", num_partitions=1, version=0, load_ids=("",), commit=True,
                    batch_ts_ms=1, key_columns=("user",), processor=CountSum(), output_schema=SCHEMA,
                    local_dir=local, input_budget_bytes=4 << 20, sort_input=sort)
    got = 0
    for b in run_task(spec, batches()):
        got += b.num_rows
    print(json.dumps({"out": got, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    """
)


def _peak_rss_mb(tmp_path: Path, rows: int, keys: int, sort: bool) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    work = tmp_path / f"{rows}-{sort}"
    args = [str(rows), str(keys), (work / "root").as_uri(), str(work / "local"), "1" if sort else "0"]
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, *args], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["out"] == keys + 1  # one output row per key, plus the metadata row
    return float(result["rss_mb"])


@pytest.mark.parametrize("sort", [False, True], ids=["sorted by Spark", "sorted in the task"])
def test_worker_memory_does_not_grow_with_the_task_input(tmp_path: Path, sort: bool) -> None:
    """A real task (store, commit, output) in its own process: 4x the rows, about the same peak RSS (a task
    sorting its own input holds its Arrow input, ~25 bytes a row here, and its sorted copy)."""
    small = _peak_rss_mb(tmp_path, 60_000, 2_000, sort)
    large = _peak_rss_mb(tmp_path, 240_000, 2_000, sort)
    assert large - small < 40, f"peak RSS grew from {small:.0f} MB to {large:.0f} MB with 4x the input rows"


@pytest.mark.slow
@pytest.mark.parametrize("sort", [False, True], ids=["sorted by Spark", "sorted in the task, spilling"])
def test_worker_memory_stays_under_512_mb_at_5m_rows_per_partition(tmp_path: Path, sort: bool) -> None:
    assert _peak_rss_mb(tmp_path, 5_000_000, 1_000_000, sort) <= 512


_PYLIST_TYPES: list[tuple[pa.DataType, st.SearchStrategy[Any]]] = [
    (pa.int8(), st.integers(-(2**7), 2**7 - 1)),
    (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    (pa.uint64(), st.integers(0, 2**64 - 1)),
    (pa.float32(), st.floats(width=32, allow_nan=False)),
    (pa.float64(), st.floats(allow_nan=False)),
    (pa.bool_(), st.booleans()),
    (pa.string(), st.text()),
    (pa.large_string(), st.text()),
    (pa.binary(), st.binary()),
    (pa.timestamp("us"), st.integers(0, 2**50)),  # the rest take to_pylist
    (pa.list_(pa.int64()), st.lists(st.integers(-5, 5), max_size=3)),
]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_pylist_gives_what_to_pylist_gives(data: st.DataObject) -> None:
    """The row path's column conversion, and the public one (`values_of`): same values, same Python types, nulls
    included, chunked too."""
    from statekeeper.store.spark import values_of
    from statekeeper.store.spark.task_input import pylist

    typ, values = data.draw(st.sampled_from(_PYLIST_TYPES))
    chunks = data.draw(st.lists(st.lists(st.none() | values, max_size=6), min_size=1, max_size=3))
    column = pa.chunked_array([pa.array(c, typ) for c in chunks], typ)
    for col in (column, column.combine_chunks()):
        got, want = pylist(col), col.to_pylist()
        assert got == want and [type(v) for v in got] == [type(v) for v in want]
        assert values_of(pa.table({"c": col}), "c") == want


_FIELD_VALUES = {
    pa.int64(): st.integers(-(2**63), 2**63 - 1),
    pa.float64(): st.floats(allow_nan=False),
    pa.string(): st.text(max_size=5),
    pa.struct([("x", pa.int32())]): st.fixed_dictionaries({"x": st.integers(-(2**31), 2**31 - 1)}),
    pa.list_(pa.int16()): st.lists(st.integers(-5, 5), max_size=3),
}


@given(data=st.data(), n=st.integers(0, 30), cuts=st.lists(st.integers(0, 30), max_size=3))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_struct_tuples_are_the_dicts_values_in_field_order(data: Any, n: int, cuts: list[int]) -> None:
    """The import's fast path (fields column by column) gives what ``to_pylist`` gives, as tuples: nulls at both
    levels, sliced and chunked arrays, nested structs still dicts."""
    types = data.draw(st.lists(st.sampled_from(list(_FIELD_VALUES)), min_size=1, max_size=4))
    typ = pa.struct([(f"f{i}", t) for i, t in enumerate(types)])
    row = st.fixed_dictionaries({f"f{i}": st.none() | _FIELD_VALUES[t] for i, t in enumerate(types)})
    values = data.draw(st.lists(st.none() | row, min_size=n, max_size=n))
    whole = pa.array(values, typ)
    bounds = sorted({0, n, *(c for c in cuts if c <= n)})
    column = pa.chunked_array([whole.slice(a, b - a) for a, b in itertools.pairwise(bounds)], typ)
    expected = [None if v is None else tuple(v.values()) for v in column.to_pylist()]
    assert struct_tuples(column) == expected
    assert struct_tuples(pa.chunked_array([pa.array(range(3))])) == [0, 1, 2]  # not a struct: its values


_LIMIT_SCRIPT = textwrap.dedent(
    """
    import sys
    from pyspark import TaskContext
    from statekeeper.store import rocks
    from statekeeper.store.spark.worker_cache import use_worker_memory

    if sys.argv[1] == "configured":
        rocks.configure_memory(rocks.MemoryLimits(total_bytes=64 << 20))
    if sys.argv[1] != "driver":
        TaskContext._setTaskContext(TaskContext())  # as PySpark's worker does before running a task
    use_worker_memory()
    print(rocks.shared_memory().limits.total_bytes >> 20)
    """
)


@pytest.mark.parametrize(
    ("case", "env_mb", "expected"),
    [("task", None, WORKER_MEMORY_MB), ("task", "96", 96), ("configured", None, 64), ("driver", None, 256)],
)
def test_a_spark_worker_defaults_to_its_own_memory_limit(case: str, env_mb: str | None, expected: int) -> None:
    """Inside a Spark task the RocksDB limit is WORKER_MEMORY_MB (a worker per core), unless STATEKEEPER_MEMORY_MB or
    configure_memory chose; outside a task the process default stays."""
    env = {k: v for k, v in os.environ.items() if k != "STATEKEEPER_MEMORY_MB"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    if env_mb is not None:
        env["STATEKEEPER_MEMORY_MB"] = env_mb
    proc = subprocess.run(
        [sys.executable, "-c", _LIMIT_SCRIPT, case], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) == expected


def test_the_task_sorts_its_input_where_arrow_sorts_the_key_and_spark_sorts_it_elsewhere() -> None:
    from pyspark.sql.types import ArrayType, IntegerType, StringType, StructField, StructType

    from statekeeper.store.spark.tasks_plan import sort_in_task

    schema = StructType(
        [
            StructField("user", StringType()),
            StructField("day", IntegerType()),
            StructField("point", StructType([StructField("x", IntegerType())])),
            StructField("tags", ArrayType(StringType())),
        ]
    )
    assert sort_in_task(schema, ("user",)) and sort_in_task(schema, ("user", "day"))
    assert not sort_in_task(schema, ("user", "point")) and not sort_in_task(schema, ("tags",))
