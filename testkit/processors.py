"""Stateful processors the Spark tests and benchmarks run (module level, so Spark's Python workers import them)."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from statekeeper.store.spark import (
    BatchStatefulProcessor,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    keys_of,
    values_of,
)


class CountSum(StatefulProcessor):
    """Per user: number of events and sum of values; outputs the running totals of updated keys."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.totals = handle.getValueState("totals", "count long, total long")

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        count, total = self.totals.get() or (0, 0)
        for r in rows:
            count += 1
            total += r.value
        self.totals.update((count, total))
        yield (key[0], count, total)


class SeededCountSum(CountSum):
    """CountSum whose totals start from an initial state of (user, count, total) rows."""

    def handleInitialState(self, key: tuple[Any, ...], initialState: Any, timerValues: TimerValues) -> None:
        self.totals.update((int(initialState["count"]), int(initialState["total"])))


class CountSumPandas(StatefulProcessor):
    """CountSum with pandas input and output (transformWithStateInPandas style); `key`: the grouping column's name,
    `schema`: the state's declared schema (None: inferred from the first value)."""

    def __init__(self, key: str = "user", schema: str | None = None) -> None:
        self.key, self.schema = key, schema

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.totals = handle.getValueState("totals", self.schema)

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        pd = importlib.import_module("pandas")
        count, total = self.totals.get() or (0, 0)
        for pdf in rows:
            count += len(pdf)
            total += int(pdf["value"].sum())
        self.totals.update((count, total))
        yield pd.DataFrame({self.key: [key[0]], "count": [count], "total": [total]})


class CountSumVectorized(BatchStatefulProcessor):
    """CountSum on the whole batch with Arrow and bulk state access; `key` and `schema` as CountSumPandas's."""

    def __init__(self, key: str = "user", schema: str | None = None) -> None:
        self.key, self.schema = key, schema

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.totals = handle.getValueState("totals", self.schema)

    def handleBatch(self, rows: pa.Table, timerValues: TimerValues) -> pa.Table:
        agg = rows.group_by(self.key).aggregate([("value", "count"), ("value", "sum")])
        keys = keys_of(agg, [self.key])
        old = self.totals.getMany(keys)
        counts = values_of(agg, "value_count")
        sums = values_of(agg, "value_sum")
        new = [((o[0] if o else 0) + c, (o[1] if o else 0) + s) for o, c, s in zip(old, counts, sums, strict=True)]
        self.totals.updateMany(keys, new)
        return pa.table(
            {
                self.key: agg.column(self.key),
                "count": pa.array([n[0] for n in new], pa.int64()),
                "total": pa.array([n[1] for n in new], pa.int64()),
            }
        )


class CountSumInInputOrder(CountSumVectorized):
    """CountSumVectorized that reads and writes its keys in the order its input brings them (no Arrow group_by,
    whose output order is Arrow's own)."""

    def handleBatch(self, rows: pa.Table, timerValues: TimerValues) -> pa.Table:
        totals: dict[tuple[Any, ...], list[int]] = {}
        for key, value in zip(keys_of(rows, [self.key]), values_of(rows, "value"), strict=True):
            entry = totals.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += value
        keys = list(totals)
        new = [
            ((o[0] if o else 0) + c, (o[1] if o else 0) + s)
            for o, (c, s) in zip(self.totals.getMany(keys), totals.values(), strict=True)
        ]
        self.totals.updateMany(keys, new)
        return pa.table(
            {
                self.key: [k[0] for k in keys],
                "count": pa.array([n[0] for n in new], pa.int64()),
                "total": pa.array([n[1] for n in new], pa.int64()),
            }
        )


class FailOnce(CountSum):
    """CountSum whose first attempt of each task fails, before or after its commit.

    `where` = "process" (raises in handleInputRows: nothing committed), "close" (raises after the
    commit: an uncommitted changelog is left behind) or "kill" (the Python worker kills itself with
    SIGKILL after the commit). Only in batches listed in `batches` (by their input file markers).
    """

    def __init__(self, where: str, fail_values: set[int]) -> None:
        self.where = where
        self.fail_values = fail_values
        self._fail = False

    def _first_attempt(self) -> bool:
        from pyspark import TaskContext

        tc = TaskContext.get()
        return tc is not None and tc.attemptNumber() == 0

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        rows_list = list(rows)
        if any(r.value in self.fail_values for r in rows_list) and self._first_attempt():
            if self.where == "process":
                raise RuntimeError(f"injected failure while processing key {key}")
            self._fail = True
        yield from super().handleInputRows(key, iter(rows_list), timerValues)

    def close(self) -> None:
        if self._fail:
            if self.where == "kill":
                os.kill(os.getpid(), 9)
            raise RuntimeError("injected failure after commit")


class SlowCountSum(CountSum):
    """CountSum that sleeps per batch (to give a killer time to strike mid-batch)."""

    def __init__(self, sleep_s: float, marker_dir: str | None = None) -> None:
        self.sleep_s = sleep_s
        self.marker_dir = marker_dir

    def close(self) -> None:
        if self.marker_dir:
            Path(self.marker_dir, f"committed-{os.getpid()}-{time.time_ns()}").touch()
        time.sleep(self.sleep_s)


class Sessions(StatefulProcessor):
    """Timers and TTL: a session per user closes when no event came for `gap_ms` (a processing timer)."""

    def __init__(self, gap_ms: int, ttl_ms: int | None = None) -> None:
        self.gap_ms = gap_ms
        self.ttl_ms = ttl_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", ttlDurationMs=self.ttl_ms)
        self.closed = handle.getValueState("closed")
        self.history = handle.getListState("history")
        self.per_value = handle.getMapState("per_value")

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        now = timerValues.getCurrentProcessingTimeInMs()
        events = 0
        for r in rows:
            events += 1
            self.per_value.updateValue(r.value % 3, (self.per_value.getValue(r.value % 3) or 0) + 1)
        s = self.session.get()
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        self.handle.registerTimer(now + self.gap_ms)
        self.session.update(((s[0] if s else 0) + events,))
        self.history.appendValue(events)
        yield (key[0], "open", (s[0] if s else 0) + events)

    def handleExpiredTimer(
        self, key: tuple[Any, ...], timerValues: TimerValues, expiredTimerInfo: Any
    ) -> Iterator[Any]:
        s = self.session.get()
        self.session.clear()
        self.closed.update(((self.closed.get() or (0,))[0] + 1,))
        yield (key[0], "closed", s[0] if s else 0)


class FailingUploads:
    """A file manager factory whose first upload of a changelog of `version` fails (once, across processes)."""

    def __init__(self, marker_dir: str, version: int) -> None:
        self.marker_dir = marker_dir
        self.version = version

    def __call__(self, root: str) -> Any:
        from statekeeper.store.files import open_file_manager

        return _FailOnceFM(open_file_manager(root), self.marker_dir, self.version)


class _FailOnceFM:
    def __init__(self, inner: Any, marker_dir: str, version: int) -> None:
        self.inner = inner
        self.marker = Path(marker_dir, "failed-once")
        self.version = version

    def put_file(self, local_path: str, path: str, *, exclusive: bool = True) -> int:
        if path.endswith(".changelog") and path.rsplit("/", 1)[-1].startswith(f"{self.version:020d}_"):
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                raise OSError(f"injected upload failure of {path}")
        return int(self.inner.put_file(local_path, path, exclusive=exclusive))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def count_sum_group_state(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """An applyInPandasWithState function, unchanged from Spark."""
    pd = importlib.import_module("pandas")
    count, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        count += len(pdf)
        total += int(pdf["value"].sum())
    state.update((count, total))
    yield pd.DataFrame({"user": [key[0]], "count": [count], "total": [total]})


def expiring_count(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """applyInPandasWithState with a processing-time timeout: emits the count when the key goes quiet."""
    pd = importlib.import_module("pandas")
    if state.hasTimedOut:
        count = state.get[0]
        state.remove()
        yield pd.DataFrame({"user": [key[0]], "count": [count], "total": [-1]})
        return
    count = state.get[0] if state.exists else 0
    count += sum(len(p) for p in pdfs)
    state.update((count,))
    state.setTimeoutDuration(1000)


class TypedAll(StatefulProcessor):
    """Declared schemas on every kind of state, a TTL and a timer per key (for the typed reader)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.totals = handle.getValueState("totals", "count long, total long", ttlDurationMs=10**12)
        self.values = handle.getListState("values", "v long")
        self.buckets = handle.getMapState("buckets", "bucket int", "n long")

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        count, total = self.totals.get() or (0, 0)
        for r in rows:
            count += 1
            total += r.value
            self.values.appendValue((r.value % 10,))
            b = (r.value % 3,)
            self.buckets.updateValue(b, ((self.buckets.getValue(b) or (0,))[0] + 1,))
        self.totals.update((count, total))
        if not list(self.handle.listTimers()):
            self.handle.registerTimer(10**15)
        yield (key[0], count, total)


class EvolvingCounter(StatefulProcessor):
    """Keeps a count and a sum under a schema given at construction (for restarts with a new schema)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.totals = handle.getValueState("totals", self.schema)

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        old = self.totals.get()
        names = [f.strip().split()[0] for f in self.schema.split(",")]
        values = dict(zip(names, old, strict=True)) if old else {}
        count, total = values.get("count") or 0, values.get("total") or 0
        for r in rows:
            count += 1
            total += r.value
        self.totals.update(tuple({"count": count, "total": total, "note": None}[n] for n in names))
        yield (key[0], count, total)
