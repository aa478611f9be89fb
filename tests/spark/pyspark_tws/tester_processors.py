"""The processors of PySpark's suite of its ``TwsTester`` (python/pyspark/sql/tests/pandas/helper/
helper_pandas_transform_with_state.py in apache/spark: RunningCountStatefulProcessor, TopKProcessor,
WordFrequencyProcessor, AllMethodsTestProcessor, SessionTimeoutProcessor, EventTimeSessionProcessor,
EventTimeCountProcessor), as our own code doing what each does; tests/spark/test_tws_tester_pyspark_api.py runs
them on PySpark's tester and on ours."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd  # type: ignore[import-untyped]
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType


def _struct(name: str, typ: Any) -> StructType:
    return StructType([StructField(name, typ, True)])


def _frame_rows(rows: Iterator[Any]) -> list[Any]:
    return [r for pdf in rows for _, r in pdf.iterrows()]


# -- processors: our own, each doing what PySpark's helper of the same name does -----------------------------
class RunningCount(StatefulProcessor):
    def __init__(self, use_pandas: bool = False) -> None:
        self.use_pandas = use_pandas

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", _struct("value", IntegerType()))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        n = initialState.at[0, "initial_count"] if self.use_pandas else initialState.initial_count
        self.count.update((n,))

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        n = self.count.get()[0] if self.count.exists() else 0
        n += sum(len(pdf) for pdf in rows) if self.use_pandas else sum(1 for _ in rows)
        self.count.update((n,))
        yield pd.DataFrame({"key": [key[0]], "count": [n]}) if self.use_pandas else Row(key=key[0], count=n)


class TopK(StatefulProcessor):
    def __init__(self, k: int, use_pandas: bool = False) -> None:
        self.k, self.use_pandas = k, use_pandas

    def init(self, handle: Any) -> None:
        self.topk = handle.getListState("topK", _struct("score", DoubleType()))

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        scores = [s[0] for s in self.topk.get()]
        scores += [r.score for r in (_frame_rows(rows) if self.use_pandas else rows)]
        top = sorted(scores, reverse=True)[: self.k]
        self.topk.put([(s,) for s in top])
        if self.use_pandas:
            yield pd.DataFrame({"key": [key[0]] * len(top), "score": top})
        else:
            yield from (Row(key=key[0], score=s) for s in top)


class WordFrequency(StatefulProcessor):
    def __init__(self, use_pandas: bool = False) -> None:
        self.use_pandas = use_pandas

    def init(self, handle: Any) -> None:
        self.freq = handle.getMapState("frequencies", "key string", "value long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        out = []
        for row in _frame_rows(rows) if self.use_pandas else rows:
            n = (self.freq.getValue((row.word,))[0] if self.freq.containsKey((row.word,)) else 0) + 1
            self.freq.updateValue((row.word,), (n,))
            out.append({"key": key[0], "word": row.word, "count": n})
        if self.use_pandas:
            if out:
                yield pd.DataFrame(out)
        else:
            yield from (Row(**o) for o in out)


class AllMethods(StatefulProcessor):
    """Runs one state method per input row (its ``cmd``) and reports what it saw."""

    def init(self, handle: Any) -> None:
        self.value = handle.getValueState("value", _struct("value", IntegerType()))
        self.list = handle.getListState("list", _struct("value", StringType()))
        self.map = handle.getMapState("map", "key string", "value long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        for row in rows:
            yield Row(key=key[0], result=f"{row.cmd}:{self._run(row.cmd)}")

    def _run(self, cmd: str) -> Any:
        kind, _, op = cmd.partition("-")
        if op == "exists":
            return {"value": self.value, "list": self.list, "map": self.map}[kind].exists()
        actions = {
            "value-set": lambda: self.value.update((42,)),
            "value-clear": self.value.clear,
            "list-append": lambda: (self.list.appendValue(("a",)), self.list.appendValue(("b",))),
            "list-append-array": lambda: self.list.appendList([("c",), ("d",)]),
            "map-add": lambda: [self.map.updateValue((k,), (v,)) for k, v in (("x", 1), ("y", 2), ("z", 3))],
            "map-remove": lambda: self.map.removeKey(("y",)),
            "map-clear": self.map.clear,
        }
        if cmd in actions:
            actions[cmd]()
            return "done"
        if cmd == "list-get":
            return ",".join(v[0] for v in self.list.get())
        if cmd == "map-keys":
            return ",".join(sorted(k[0] for k in self.map.keys()))  # noqa: SIM118 - MapState.keys, not a dict's
        if cmd == "map-values":
            return ",".join(str(v) for v in sorted(v[0] for v in self.map.values()))
        assert cmd == "map-iterator", cmd
        return ",".join(f"{k[0]}={v[0]}" for k, v in sorted(self.map.iterator()))


class SessionTimeout(StatefulProcessor):
    """A processing-time session of 10 s per key: each input moves its timer; expiry clears the session."""

    def __init__(self, use_pandas: bool = False) -> None:
        self.use_pandas = use_pandas

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.last_seen = handle.getValueState("lastSeen", _struct("lastSeen", LongType()))

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        now = timerValues.getCurrentProcessingTimeInMs()
        if self.last_seen.exists():
            self.handle.deleteTimer(self.last_seen.get()[0] + 10_000)
        self.last_seen.update((now,))
        self.handle.registerTimer(now + 10_000)
        got = [
            {"key": key[0], "result": f"received:{r.value}"} for r in (_frame_rows(rows) if self.use_pandas else rows)
        ]
        if self.use_pandas and got:
            yield pd.DataFrame(got)
        elif not self.use_pandas:
            yield from (Row(**g) for g in got)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        self.last_seen.clear()
        out = {"key": [key[0]], "result": ["session-expired"]}
        yield pd.DataFrame(out) if self.use_pandas else Row(key=key[0], result="session-expired")


class EventTimeSession(StatefulProcessor):
    """An event-time session: a timer at each event + 5 s (the previous one deleted); expiry reports the watermark."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.last = handle.getValueState("lastEventTime", _struct("lastEventTime", LongType()))

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        for row in rows:
            if self.last.exists():
                self.handle.deleteTimer(self.last.get()[0] + 5000)
            self.last.update((row.event_time_ms,))
            self.handle.registerTimer(row.event_time_ms + 5000)
            yield Row(key=key[0], result=f"received:{row.value}@{row.event_time_ms}")

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        self.last.clear()
        yield Row(key=key[0], result=f"session-expired@watermark={timerValues.getCurrentWatermarkInMs()}")


class EventTimeCount(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", _struct("count", LongType()))

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        n = (self.count.get()[0] if self.count.exists() else 0) + sum(1 for _ in rows)
        self.count.update((n,))
        yield Row(key=key[0], count=n)


def event_ms(row: Any) -> int:
    return int(row.event_time_ms)
