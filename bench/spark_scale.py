"""How the stateful batch grows with rows per batch and state size: the size table of ``bench spark``.

Every variant of ``bench spark`` at each size of :data:`FULL_SIZES` (keys, rows per batch, batches), one
after another in the same session, each query checking its final state against the batch-computed totals,
plus the pandas floor: the same user function on the same per-key frames in a plain Python loop, no Spark
and no state (:func:`pandas_floor`), so the pandas paths' own share is p50 - the pandas floor.

The slow variants (the per-key pandas paths, Spark's two Python operators) run on the first few batches
only, and are skipped at a size where a batch would take longer than a cap, estimated from what a touched
key cost them at the size before (their cost goes by the keys a batch touches, one frame or call each).

Knobs (environment):

- ``BENCH_SPARK_BATCHES``: batches of the first size (the main table's workload; default 30).
- ``BENCH_SPARK_SIZE_BATCHES``: batches of every other size (default: 8, 8 and 6).
- ``BENCH_SPARK_PANDAS_BATCHES``: batches of statekeeper's per-key pandas and unchanged-function queries and of
  the pandas floor (default 3: the first is warm-up).
- ``BENCH_SPARK_BASELINE_BATCHES``: batches of Spark's applyInPandasWithState and transformWithStateInPandas
  (default 3: they take 30-60 s a batch at 50k rows).
- ``BENCH_SPARK_SLOW_BATCH_MAX_S``: a slow variant is skipped at a size where its batch is estimated to take
  longer (default 120).
- ``BENCH_SPARK_ROUNDS``: rounds of the fast queries at each size (per-key rows, vectorized, Spark native and the
  floors that run in Spark; default 2): each round runs them all over the size's batches, every other round in
  reverse order, and their steady batches are pooled, so that a slow minute of the machine does not fall on one
  query only. The other queries run once.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from bench.report import Table
from bench.spark_floors import pandas_floor, per_key_floor, state_floor

log = logging.getLogger(__name__)

FULL_SIZES = [(100_000, 50_000, 30), (100_000, 500_000, 8), (1_000_000, 500_000, 8), (1_000_000, 2_000_000, 6)]
"""(keys, rows per batch, batches): 10x the rows per batch, then 10x the state, then 4x the rows again."""
QUICK_SIZES = [(2_000, 2_000, 4), (2_000, 5_000, 3), (5_000, 5_000, 3), (5_000, 10_000, 3)]
BATCHES_ENV = "BENCH_SPARK_BATCHES"
SIZE_BATCHES_ENV = "BENCH_SPARK_SIZE_BATCHES"
PANDAS_BATCHES_ENV = "BENCH_SPARK_PANDAS_BATCHES"
BASELINE_BATCHES_ENV = "BENCH_SPARK_BASELINE_BATCHES"
SLOW_MAX_ENV = "BENCH_SPARK_SLOW_BATCH_MAX_S"
ROUNDS_ENV = "BENCH_SPARK_ROUNDS"

ROWS = "statekeeper per-key rows, sync"
ROWS_ASYNC = "statekeeper per-key rows, async"
VECTORIZED = "statekeeper vectorized, sync"
PANDAS = "statekeeper per-key pandas, sync"
APPLY_UNCHANGED = "statekeeper ApplyInPandasWithState, the same function unchanged, sync"
NATIVE = "Spark native aggregation (JVM, RocksDB, changelog)"
FLOOR = "floor: stateless foreachBatch shuffle by key + noop"
PLAN_FLOOR = "floor: statekeeper's batch with a Python task that hands its input back (no state) + noop"
SPARK_PYTHON_FLOOR = "floor: Spark's own Python task (shuffle by key, mapInArrow handing its input back) + noop"
APPLY = "Spark applyInPandasWithState (RocksDB, changelog)"
TWS = "Spark transformWithStateInPandas (RocksDB, changelog)"
PANDAS_FLOOR = "floor: the same pandas function on per-key frames in a plain Python loop (no Spark, no state)"
STATE_FLOOR = "floor: the vectorized batch's aggregation and state reads and writes on raw RocksDB (no Spark)"
PER_KEY_FLOOR = (
    "floor: the per-key processor called per key on PySpark Rows, a get and a put each on raw RocksDB (no Spark)"
)
TASK_PER_KEY_FLOOR = "floor: Spark's own Python task doing the per-key floor's work (sorted by key in the task) + noop"
TASK_STATE_FLOOR = "floor: Spark's own Python task doing the state floor's work (sorted by key in the task) + noop"
ROUTED_PER_KEY_FLOOR = (
    "floor: the per-key floor's work in a Python task routed and sorted by key group as statekeeper's, its writes "
    "synced to a file + noop"
)
ROUTED_STATE_FLOOR = (
    "floor: the state floor's work in a Python task routed and sorted by key group as statekeeper's, its writes "
    "synced to a file + noop"
)
TASK_FLOORS = {
    TASK_PER_KEY_FLOOR: ("per-key", False),
    TASK_STATE_FLOOR: ("vectorized", False),
    ROUTED_PER_KEY_FLOOR: ("per-key", True),
    ROUTED_STATE_FLOOR: ("vectorized", True),
}
"""The RocksDB floors run inside a Python task in Spark: their work (`bench.spark_floors.WORK`) and whether the batch
is routed by key group, its writes synced."""
STATEKEEPER = {ROWS: "rows", ROWS_ASYNC: "rows", VECTORIZED: "vectorized", PANDAS: "pandas", APPLY_UNCHANGED: "apply"}
"""statekeeper's variants and their processor (`bench.spark._statekeeper_processors`)."""
PANDAS_PATHS = (PANDAS, APPLY_UNCHANGED)
FAST = (ROWS, VECTORIZED, NATIVE, FLOOR, PLAN_FLOOR, SPARK_PYTHON_FLOOR, *TASK_FLOORS)
"""The queries run `Limits.rounds` times at each size (their first round in the order of `measure_size`)."""
SPARK_PYTHON = (APPLY, TWS)


@dataclass(frozen=True)
class Limits:
    """The batches each kind of variant runs at a size, and the slow variants' cap (see the module docstring)."""

    pandas_batches: int
    baseline_batches: int
    slow_max_ms: float
    rounds: int = 1

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            int(os.environ.get(PANDAS_BATCHES_ENV, "3")),
            int(os.environ.get(BASELINE_BATCHES_ENV, "3")),
            float(os.environ.get(SLOW_MAX_ENV, "120")) * 1000,
            max(1, int(os.environ.get(ROUNDS_ENV, "2"))),
        )


def sizes(quick: bool) -> list[tuple[int, int, int]]:
    """The sizes of this run, the batch knobs applied."""
    if quick:
        return list(QUICK_SIZES)
    first, *rest = FULL_SIZES
    out = [(first[0], first[1], int(os.environ.get(BATCHES_ENV, first[2])))]
    more = os.environ.get(SIZE_BATCHES_ENV)
    return out + [(k, r, int(more) if more else b) for k, r, b in rest]


@dataclass
class SizeResult:
    """One size's measurements: steady batch durations per variant, statekeeper's traces, what was skipped."""

    keys: int
    rows: int
    batches: int
    results: dict[str, list[float]] = field(default_factory=dict)
    traces: dict[str, list[Any]] = field(default_factory=dict)
    per_row: list[list[Any]] = field(default_factory=list)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    ran: dict[str, int] = field(default_factory=dict)
    """Batches each variant ran (its first one is warm-up)."""
    notes: list[str] = field(default_factory=list)
    rounds: int = 1
    """Rounds of the `FAST` queries, their steady batches pooled."""


def touched_keys(keys: int, rows: int) -> float:
    """Expected distinct keys of a batch of `rows` uniform over `keys`."""
    return keys * (1 - math.exp(-rows / keys))


# -- inputs ---------------------------------------------------------------------------------------
def subset(inputs: Path, batches: int) -> Path:
    """A directory of the first `batches` input files (hard links), for the variants that run fewer."""
    files = sorted(inputs.iterdir())
    if batches >= len(files):
        return inputs
    where = inputs.parent / f"{inputs.name}-first-{batches}"
    if not where.exists():
        where.mkdir()
        for f in files[:batches]:
            os.link(f, where / f.name)
    return where


def expected_of(inputs: Path) -> dict[str, tuple[int, int]]:
    """The final (count, total) per key of the input files in `inputs`."""
    table = pq.read_table(inputs).group_by("key").aggregate([("value", "count"), ("value", "sum")])
    return {
        k: (int(c), int(s))
        for k, c, s in zip(
            table.column("key").to_pylist(),
            table.column("value_count").to_pylist(),
            table.column("value_sum").to_pylist(),
            strict=True,
        )
    }


# -- one size -------------------------------------------------------------------------------------
@dataclass
class _Estimates:
    """ms a touched key cost each slow variant at the last size it ran (to skip the next when too slow)."""

    per_key_ms: dict[str, float] = field(default_factory=dict)

    def too_slow(self, name: str, keys: int, rows: int, cap_ms: float) -> float | None:
        """The estimated batch ms of `name` at this size when over `cap_ms`, else None."""
        cost = self.per_key_ms.get(name)
        estimate = cost * touched_keys(keys, rows) if cost is not None else 0.0
        return estimate if estimate > cap_ms else None

    def record(self, name: str, durations: list[float], keys: int, rows: int) -> None:
        if durations:
            self.per_key_ms[name] = float(np.median(durations)) / touched_keys(keys, rows)


def measure_size(
    spark: Any,
    work: Path,
    inputs: Path,
    expected: dict[str, tuple[int, int]],
    size: tuple[int, int, int],
    partitions: int,
    timeout: float,
    limits: Limits,
    estimates: _Estimates,
    *,
    main: bool,
) -> SizeResult:
    """Every variant at one size over the files in `inputs` (`expected`: their final state). `main`: the main
    table's size, which also runs per-key rows with async checkpointing."""
    from bench import spark as sp
    from bench.spark_trace import per_row

    keys, rows, batches = size
    res = SizeResult(keys, rows, batches)
    where = f"{keys:,} keys, {rows:,} rows a batch"
    pandas_in = subset(inputs, limits.pandas_batches)
    pandas_expected = expected if pandas_in == inputs else expected_of(pandas_in)
    spark_in = subset(inputs, limits.baseline_batches)

    def skipped(name: str) -> bool:
        estimate = estimates.too_slow(name, keys, rows, limits.slow_max_ms)
        if estimate is not None:
            res.notes.append(
                f"{name} skipped at {where}: a batch would take ~{estimate / 1000:.0f} s (its cost per touched key "
                f"at the size before x {touched_keys(keys, rows):,.0f} keys a batch touches; "
                f"{SLOW_MAX_ENV}={limits.slow_max_ms / 1000:.0f})."
            )
        return estimate is not None

    def again(name: str, where: Path) -> list[float]:
        """One more round of a fast query over the size's batches: its steady batch durations."""
        if name in STATEKEEPER:
            return sp.run_statekeeper(
                spark,
                inputs,
                where,
                timeout,
                api=STATEKEEPER[name],
                async_checkpoint=False,
                partitions=partitions,
                expected=expected,
            )[0]
        if name == NATIVE:
            return sp.run_spark_native(spark, inputs, where, timeout)
        if name in TASK_FLOORS:
            kind, routed = TASK_FLOORS[name]
            return sp.run_task_floor(spark, inputs, where, timeout, partitions, kind, routed=routed)
        floors = {FLOOR: sp.run_floor, PLAN_FLOOR: sp.run_plan_floor, SPARK_PYTHON_FLOOR: sp.run_python_floor}
        return floors[name](spark, inputs, where, timeout, partitions)

    variants = [ROWS, *([ROWS_ASYNC] if main else []), VECTORIZED, PANDAS, APPLY_UNCHANGED]
    for name in variants:
        slow = name in PANDAS_PATHS
        if slow and skipped(name):
            continue
        durations, phases, trace, progress = sp.run_statekeeper(
            spark,
            pandas_in if slow else inputs,
            work / _dir(name),
            timeout,
            api=STATEKEEPER[name],
            async_checkpoint=name == ROWS_ASYNC,
            partitions=partitions,
            expected=pandas_expected if slow else expected,
        )
        res.results[name], res.phases[name], res.traces[name] = durations, phases, [name, *trace[1:]]
        res.per_row.append(per_row(keys, rows, name, progress, durations))
        res.ran[name] = len(sorted((pandas_in if slow else inputs).iterdir()))
        if slow:
            estimates.record(name, durations, keys, rows)
    if any(n in res.results for n in PANDAS_PATHS):
        files = sorted(pandas_in.iterdir())
        res.results[PANDAS_FLOOR] = pandas_floor(files[1:] or files, sp.apply_in_pandas_with_state_func)
        res.ran[PANDAS_FLOOR] = len(files)
        log.info("%s at %s: %s", PANDAS_FLOOR, where, [round(d) for d in res.results[PANDAS_FLOOR]])
    files = sorted(inputs.iterdir())
    res.results[STATE_FLOOR], res.ran[STATE_FLOOR] = state_floor(files), len(files)
    res.results[PER_KEY_FLOOR], res.ran[PER_KEY_FLOOR] = per_key_floor(files), len(files)
    for name in (NATIVE, FLOOR, PLAN_FLOOR, SPARK_PYTHON_FLOOR, *TASK_FLOORS):
        res.results[name], res.ran[name] = again(name, work / _dir(name)), batches
    for r in range(1, limits.rounds):
        for name in FAST[::-1] if r % 2 else FAST:
            res.results[name] = res.results[name] + again(name, work / f"{_dir(name)}-round-{r + 1}")
    res.rounds = limits.rounds
    for name, runner in ((APPLY, sp.run_spark_apply_in_pandas), (TWS, sp.run_spark_tws_in_pandas)):
        if skipped(name):
            continue
        res.results[name] = runner(spark, spark_in, work / name.split()[1], timeout)
        res.ran[name] = len(sorted(spark_in.iterdir()))
        estimates.record(name, res.results[name], keys, rows)
    return res


def _dir(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)[:60]


def run_sizes(
    spark: Any,
    work: Path,
    first: tuple[Path, dict[str, tuple[int, int]]],
    all_sizes: list[tuple[int, int, int]],
    partitions: int,
    timeout: float,
) -> list[SizeResult]:
    """Every size of `all_sizes` in order; the first's inputs are `first` (written before the JVM's warm-up)."""
    from bench.spark import write_inputs

    limits, estimates = Limits.from_env(), _Estimates()
    out = []
    for i, size in enumerate(all_sizes):
        keys, rows, batches = size
        base = work / f"size-{keys}-{rows}"
        if i == 0:
            inputs, expected = first
        else:
            inputs = base / "inputs"
            expected = write_inputs(inputs, batches, rows, keys, seed=keys + rows)
        t0 = time.time()
        out.append(
            measure_size(spark, base, inputs, expected, size, partitions, timeout, limits, estimates, main=i == 0)
        )
        log.info("size %s took %.0fs", size, time.time() - t0)
        if i > 0:
            shutil.rmtree(base, ignore_errors=True)
    return out


# -- the tables -----------------------------------------------------------------------------------
def _p50(values: list[float] | None) -> float:
    return float(np.percentile(values, 50)) if values else float("nan")


def _share(res: SizeResult, name: str) -> float:
    """The pandas path's own share of its batch: p50 - the pandas floor's p50 (ms)."""
    return _p50(res.results.get(name)) - _p50(res.results.get(PANDAS_FLOOR))


SIZE_COLUMNS = [
    "keys",
    "rows / batch",
    "query",
    "batches run",
    "p50 ms",
    "µs / row",
    "p50 / Spark native",
    "own share ms (p50 - pandas floor)",
    "own share / pandas floor",
    "applyInPandasWithState p50 / p50",
    "worker peak RSS MB",
]


def size_rows(res: SizeResult) -> list[list[Any]]:
    """One row per variant measured at this size (SIZE_COLUMNS)."""
    native, floor, apply = (_p50(res.results.get(n)) for n in (NATIVE, PANDAS_FLOOR, APPLY))
    out: list[list[Any]] = []
    for name, durations in res.results.items():
        p50 = _p50(durations)
        pandas_path = name in PANDAS_PATHS
        share = _share(res, name) if pandas_path else float("nan")
        trace = res.traces.get(name)
        out.append(
            [
                res.keys,
                res.rows,
                name,
                res.ran.get(name, len(durations)),
                round(p50),
                round(p50 * 1000 / res.rows, 2),
                round(p50 / native, 2),
                round(share) if pandas_path else "",
                round(share / floor, 2) if pandas_path else "",
                round(apply / p50, 1) if name in (ROWS, VECTORIZED, *PANDAS_PATHS) and not math.isnan(apply) else "",
                trace[-1] if trace else "",
            ]
        )
    return out


def _share_ratio(name: str) -> Callable[[SizeResult], float]:
    return lambda r: _share(r, name) / _p50(r.results.get(PANDAS_FLOOR))


_SPEED = (
    (ROWS, "per-key rows", 1.0, PER_KEY_FLOOR, TASK_PER_KEY_FLOOR, ROUTED_PER_KEY_FLOOR),
    (VECTORIZED, "vectorized", 0.7, STATE_FLOOR, TASK_STATE_FLOOR, ROUTED_STATE_FLOOR),
)


def _breakdown(
    r: SizeResult, name: str, label: str, limit: float, logic_floor: str, task_floor: str, routed_floor: str
) -> str:
    """Where a variant's p50 goes, beside Spark native's: Spark's own Python task (the least any Python
    operator pays), statekeeper's batch plan above it, and the state and user logic above that plan (with
    `logic_floor`, that logic on raw RocksDB, `task_floor`, the same inside Spark's Python task, and `routed_floor`,
    that routed by key group with its writes synced)."""
    p50, native, logic, least = (_p50(r.results.get(n)) for n in (name, NATIVE, logic_floor, task_floor))
    routed = _p50(r.results.get(routed_floor))
    python, plan, floor = (_p50(r.results.get(f)) for f in (SPARK_PYTHON_FLOOR, PLAN_FLOOR, FLOOR))
    if any(math.isnan(x) for x in (p50, native, python, plan, floor)) or p50 <= limit * native:
        return ""
    return (
        f"{label} at {r.keys:,} keys, {r.rows:,} rows: {p50:.0f} ms = Spark's own Python task {python:.0f} + "
        f"statekeeper's batch plan over it {plan - python:.0f} + state and user logic {p50 - plan:.0f} (the same "
        f"logic on raw RocksDB, no Spark: {logic:.0f}; inside Spark's own Python task: {least:.0f} in all, "
        f"statekeeper's batch {p50 - least:.0f} above it; routed by key group, its writes synced: {routed:.0f}, "
        f"statekeeper's batch {p50 - routed:.0f} above it), against Spark native {native:.0f} (its state work over the "
        f"stateless floor: {native - floor:.0f})"
    )


def targets(all_results: list[SizeResult]) -> str:
    """Issue 65's targets over every size, each with its measured figure and met / NOT met."""

    def worst(name: str, of: Callable[[SizeResult], float], limit: float, low: bool = True) -> str:
        figures = [(of(r), r) for r in all_results]
        figures = [(f, r) for f, r in figures if not math.isnan(f)]
        if not figures:
            return f"{name} (not measured)"
        f, r = max(figures, key=lambda x: x[0]) if low else min(figures, key=lambda x: x[0])
        ok = f <= limit if low else f >= limit
        return f"{name} (worst {f:.2f}x at {r.keys:,} keys, {r.rows:,} rows: {'met' if ok else 'NOT met'})"

    def ratio(a: str, b: str) -> Callable[[SizeResult], float]:
        return lambda r: _p50(r.results.get(a)) / _p50(r.results.get(b))

    python_floor = ratio(SPARK_PYTHON_FLOOR, NATIVE)
    parts = [
        worst("per-key rows p50 <= 1.0x Spark native at every size", ratio(ROWS, NATIVE), 1.0),
        worst("vectorized p50 <= 0.7x Spark native at every size", ratio(VECTORIZED, NATIVE), 0.7),
        "Spark's own Python task, before any statekeeper code, takes "
        + ", ".join(f"{python_floor(r):.2f}x" for r in all_results)
        + " Spark native at the sizes in order",
    ]
    for floor, routed_floor, label, limit, work in (
        (
            TASK_STATE_FLOOR,
            ROUTED_STATE_FLOOR,
            "vectorized",
            0.7,
            "the processor's aggregation and its state reads and writes",
        ),
        (
            TASK_PER_KEY_FLOOR,
            ROUTED_PER_KEY_FLOOR,
            "per-key",
            1.0,
            "the processor called per key on PySpark Rows, a get and a put each",
        ),
    ):
        least, routed = ratio(floor, NATIVE), ratio(routed_floor, NATIVE)
        parts.append(
            f"the least a {label} batch can take, Spark's own Python task doing {work} on raw RocksDB (no "
            "changelog, no commit), is "
            + ", ".join(f"{least(r):.2f}x" for r in all_results)
            + f" Spark native at the sizes in order: no Python operator on RocksDB meets {limit}x where that is "
            "above it; the same work routed by key group as statekeeper's tasks plan routes it (what lets a store be "
            "rescaled: each row to the owner of its key group, the task's input checked and sorted by key group and "
            "key, each stored key its key group and key) with its writes synced to a file before the task ends "
            "(what makes them durable) takes "
            + ", ".join(f"{routed(r):.2f}x" for r in all_results)
            + f": no rescalable, durable Python operator on RocksDB meets {limit}x where that is above it"
        )
    parts += [_breakdown(r, *speed) for speed in _SPEED for r in all_results]
    for name, label in ((PANDAS, "per-key pandas"), (APPLY_UNCHANGED, "the unchanged function")):
        parts.append(worst(f"{label}: own share <= 0.5x the pandas floor", _share_ratio(name), 0.5))
        parts.append(worst(f"{label}: >= 10x applyInPandasWithState", ratio(APPLY, name), 10.0, low=False))
    bound = [(ratio(APPLY, PANDAS_FLOOR)(r), r) for r in all_results]
    bound = [(f, r) for f, r in bound if not math.isnan(f)]
    if bound:
        parts.append(
            "the user's pandas function alone (the pandas floor, no Spark, no state) takes applyInPandasWithState's "
            "time over "
            + ", ".join(f"{f:.2f} at {r.keys:,} keys, {r.rows:,} rows" for f, r in bound)
            + ": no framework calling that function can be 10x faster than Spark's operator where it is under 10"
        )
    last = all_results[-1]
    memory = [r[-3:] for r in last.per_row]  # per_row's last columns: start RSS, RocksDB, peak RSS
    if memory:
        start, rocks, rss = max(memory, key=lambda m: m[-1])
        parts.append(
            f"worker peak RSS <= 512 MB at {last.rows:,} rows a batch ({rss:.0f} MB: "
            f"{'met' if rss <= 512 else 'NOT met'}; its worker held {start:.0f} MB when the task began, RocksDB "
            f"{rocks:.0f} MB of it, and the task itself needed {rss - start:.0f} MB)"
        )
    return "Targets: " + "; ".join(p for p in parts if p) + "."


def rounds_note(rounds: int) -> str:
    """How the fast queries' batches were measured (`FAST`, `Limits.rounds`)."""
    if rounds == 1:
        return "Every query ran once over the size's batches."
    return (
        f"Per-key rows, vectorized, Spark native and the floors run in Spark ran {rounds} rounds at each size (every "
        f"other round in reverse order, after the rest), their steady batches pooled ({ROUNDS_ENV}); the other "
        "queries once. The trace tables show the first round."
    )


def size_tables(all_results: list[SizeResult]) -> list[Table]:
    """The size table (every variant at every size) and where each row's time goes."""
    from bench.spark_trace import per_row_table

    rows = [row for r in all_results for row in size_rows(r)]
    notes = [
        targets(all_results),
        "Each size: its own input (uniform keys), its queries one after another in the same session, each "
        "checking its final state (statekeeper's, against the batch-computed totals); the first size is the "
        "table above. Batch duration: Spark's triggerExecution of each batch after the first (warm-up). "
        "µs / row = p50 ms * 1000 / rows a batch.",
        rounds_note(all_results[0].rounds),
        "The pandas floor: the same function as applyInPandasWithState's (and CountSumPandas's logic) called in "
        "a plain Python loop on the per-key frames of the same batch files (sorted by key, cut, indexed from 0 "
        "as PySpark hands them), a state that holds nothing, no Spark; the keys split over 2 processes, as the "
        "queries have 2 cores (the split untimed, as a shuffle's), the slower one's time. "
        "own share = p50 - the pandas floor's p50: what the framework adds around the user function.",
        "The state floor: each batch file's rows split over 2 processes by key group, each with a rocksdict DB of "
        "the stores' options kept over the batches (its state grows as the query's does); timed per file: the "
        "vectorized processor's Arrow aggregation by key, a point get of each touched key and one write batch of "
        "the new totals, in the store's key order; reading, splitting, sorting and encoding the keys untimed (the "
        "shuffle's, the task's sort's and the codec's work); the slower process's time, the first file left out.",
        "The per-key floor: the same split and DBs; timed per file: a PySpark Row per input row (the per-key API's "
        "rows), the per-key rows query's own processor (CountSum) called once per key on its rows, its state a "
        "point get and a put of the key on raw RocksDB (no changelog, no typed codec), its output rows kept; the "
        "least a per-key Python processor on RocksDB does. Both RocksDB floors and the pandas floor pause the cyclic "
        "GC while timed, as a task does.",
        "The same two RocksDB works inside Spark (the floors 'Spark's own Python task doing ...'): Spark's own Python "
        "task floor (the batch shuffled by Spark's hash of the key, mapInArrow, noop) whose task sorts its rows by "
        "key in Arrow, does that work on a RocksDB of its partition that its Python worker keeps over the batches "
        "(the key's UTF-8 bytes as the stored key; each of the 2 workers keeps its own copy, as Spark hands a "
        "partition's tasks to either) and hands its output back as one Arrow batch; timed as the queries are, by "
        "Spark's trigger. What a Python stateful operator on RocksDB in Spark cannot do with less (it keeps no "
        "changelog and commits nothing); the targets' 'least' is its p50.",
        "The same two works routed as statekeeper routes (the floors '... routed and sorted by key group as "
        "statekeeper's'): the batch planned by statekeeper's own tasks plan (a key-group column computed by Spark, "
        "each row sent to the partition owning its key group, a marker per partition), the task taking its input as "
        "statekeeper's task does (checked against its key groups, sorted by key group and key in Arrow), each stored "
        "key its key group and the key (computed per key, as a store must to find a key's group), and the batch's "
        "writes (stored key and value, no checksum, no compression) written to one file and fsynced before the task "
        "hands its output back; no changelog format, commit, upload or commit record. What any Python operator on "
        "RocksDB that can be rescaled (its state split by key group) and keeps each batch durable cannot do with less.",
        f"The per-key pandas paths and the pandas floor run the first {PANDAS_BATCHES_ENV} batches, Spark's Python "
        f"operators the first {BASELINE_BATCHES_ENV} (batches run, the first is warm-up); the others every batch.",
        *[n for r in all_results for n in r.notes],
    ]
    return [
        Table("How each variant grows with rows per batch and with state size (ms)", SIZE_COLUMNS, rows, notes),
        per_row_table([row for r in all_results for row in r.per_row]),
    ]


__all__ = ["FULL_SIZES", "QUICK_SIZES", "SizeResult", "measure_size", "pandas_floor", "run_sizes", "size_tables"]
