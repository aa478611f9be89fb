"""Processors written against PySpark's ``StatefulProcessor`` the way PySpark's own transformWithState
suite writes them (python/pyspark/sql/tests/pandas/helper/helper_pandas_transform_with_state.py in
apache/spark): the same API uses, the same pandas idioms, the same in-processor assertions. They are
our own code (the suite's file is not copied here); each exercises what the suite's processor of the
same name does, and each runs in both flavours (``Row`` for transformWithState, pandas for
transformWithStateInPandas). Every batch's input is ``id string, temperature int, eventTime timestamp``.
"""

from __future__ import annotations

import decimal
import json
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import pandas as pd  # type: ignore[import-untyped]
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import ArrayType, IntegerType, MapType, StringType, StructField, StructType

INPUT = "id string, temperature int, eventTime timestamp"


class _Flavour(StatefulProcessor):
    """`use_pandas`: frames in and out (transformWithStateInPandas), else Rows (transformWithState)."""

    def __init__(self, use_pandas: bool) -> None:
        self.use_pandas = use_pandas

    def column(self, rows: Iterator[Any], name: str) -> list[Any]:
        """One input column's values, whichever flavour."""
        if self.use_pandas:
            return [v for pdf in rows for v in pdf[name].tolist()]
        return [getattr(r, name) for r in rows]

    def emit(self, **columns: Any) -> Any:
        """One output row (a Row, or a one-row frame)."""
        if self.use_pandas:
            return pd.DataFrame({k: [v] for k, v in columns.items()})
        return Row(**columns)

    def close(self) -> None:
        pass


class SimpleStateful(_Flavour):
    """Counts readings and violations (> 100) per id; declares then deletes ``tempState`` in ``init``, and
    asserts that the deleted variable's handle raises PySpark's error (issue 64, defect 1)."""

    OUTPUT = "id string, countAsString string, violations int"

    def __init__(self, use_pandas: bool, ttl_ms: int | None = None) -> None:
        super().__init__(use_pandas)
        self.ttl_ms = ttl_ms

    def init(self, handle: Any) -> None:
        schema = StructType([StructField("value", IntegerType(), True)])
        self.violations = handle.getValueState("numViolations", schema, self.ttl_ms)
        self.temp_state = handle.getValueState("tempState", schema)
        handle.deleteIfExists("tempState")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        try:
            self.temp_state.exists()
        except PySparkRuntimeError as e:
            assert "Error checking value state exists" in str(e), e
        else:
            raise AssertionError("a deleted state variable's handle must raise")
        temperatures = [t for t in self.column(rows, "temperature") if t is not None and t == t]
        before = self.violations.get()[0] if self.violations.exists() else 0
        total = before + sum(1 for t in temperatures if t > 100)
        self.violations.update((total,))
        yield self.emit(id=key[0], countAsString=str(len(temperatures)), violations=total)


class EventTimeMax(_Flavour):
    """The max event time (s) per id; an event-time timer at the watermark clears it (pandas: the suite's
    ``astype("int64") // 10**9``, right only with nanosecond frames: defect 2)."""

    OUTPUT = "id string, timestamp string"

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.max_state = handle.getValueState("max_state", StructType([StructField("value", StringType(), True)]))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        if self.use_pandas:
            seconds = [s for pdf in rows for s in (pdf["eventTime"].astype("int64") // 10**9).tolist()]
        else:
            seconds = [int(r.eventTime.timestamp()) for r in rows]
        current = int(self.max_state.get()[0]) if self.max_state.exists() else 0
        latest = str(max(current, *seconds))
        self.max_state.update((latest,))
        self.handle.registerTimer(timerValues.getCurrentWatermarkInMs())
        yield self.emit(id=key[0], timestamp=latest)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        self.max_state.clear()
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield self.emit(id=f"{key[0]}-expired", timestamp=str(expiredTimerInfo.getExpiryTimeInMs()))


class EventTimeMin(_Flavour):
    """The min event time (s) per id, without timers (time mode "EventTime": late rows are dropped)."""

    OUTPUT = "id string, timestamp string"

    def init(self, handle: Any) -> None:
        self.min_state = handle.getValueState("min_state", StructType([StructField("value", StringType(), True)]))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        if self.use_pandas:
            seconds = [s for pdf in rows for s in (pdf["eventTime"].astype("int64") // 10**9).tolist()]
        else:
            seconds = [int(r.eventTime.timestamp()) for r in rows]
        current = int(self.min_state.get()[0]) if self.min_state.exists() else sys.maxsize
        earliest = str(min(current, *seconds))
        self.min_state.update((earliest,))
        yield self.emit(id=key[0], timestamp=earliest)


class ProcTimeTimers(_Flavour):
    """Running count per id; id "0" registers a processing-time timer at every input; on expiry the
    handler lists the key's timers (the firing one and the one registered this batch: defect 3),
    twice, checks both listings agree, clears the count and deletes the timer."""

    OUTPUT = "id string, countAsString string"

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count_state = handle.getValueState("count_state", StructType([StructField("value", StringType(), True)]))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        count = int(self.count_state.get()[0]) if self.count_state.exists() else 0
        if key == ("0",):
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        count += len(self.column(rows, "temperature"))
        self.count_state.update((str(count),))
        yield self.emit(id=key[0], countAsString=str(count))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        first = list(self.handle.listTimers())
        second = list(self.handle.listTimers())
        assert first == second, (first, second)
        assert expiredTimerInfo.getExpiryTimeInMs() in first, first
        if first:
            assert len(first) == 2, first
        self.count_state.clear()
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield self.emit(id=key[0], countAsString="-1")


class InitialStateSum(_Flavour):
    """Sums temperatures per id on top of an initial value; the pandas flavour reads frames by label
    (``initialState.at[0, "initVal"]``, ``pdf.at[0, "temperature"]``): frames must start at 0 (defect 4)."""

    OUTPUT = "id string, value string, first int"
    SEEDS = {("0",): 789, ("3",): 987}

    def init(self, handle: Any) -> None:
        self.value_state = handle.getValueState("value_state", StructType([StructField("value", IntegerType(), True)]))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        seed = int(initialState.at[0, "initVal"]) if self.use_pandas else initialState.initVal
        assert self.SEEDS[key] == seed, (key, seed)
        self.value_state.update((seed,))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        total = self.value_state.get()[0] if self.value_state.exists() else 0
        first = None
        for chunk in rows:
            if self.use_pandas:
                first = int(chunk.at[0, "temperature"]) if first is None else first
                total += int(chunk["temperature"].astype(int).sum())
            else:
                first = chunk.temperature if first is None else first
                total += chunk.temperature
        self.value_state.update((total,))
        yield self.emit(id=key[0], value=str(total), first=first)


class ChainingOps(_Flavour):
    """Emits each key's first event time unchanged (the suite's StatefulProcessorChainingOps, without the chained
    aggregation): a pandas frame holds it naive, a wall time in the session time zone, which PySpark takes in that
    zone again on the way out."""

    OUTPUT = "id string, outputTimestamp timestamp"

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        yield self.emit(id=key[0], outputTimestamp=self.column(rows, "eventTime")[0])


class InitialStateTime(_Flavour):
    """Keeps the initial state's time as handleInitialState reads it and emits it with the key's next input: for a
    Row an aware datetime in the session time zone (as the input's timestamps), in a pandas frame a naive one."""

    OUTPUT = "id string, initTime string"

    def init(self, handle: Any) -> None:
        self.seen = handle.getValueState("seen", "t string")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        t = initialState.at[0, "initTime"] if self.use_pandas else initialState.initTime
        self.seen.update((f"{key!r} {t}",))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        self.column(rows, "temperature")
        seen = self.seen.get()
        if seen is not None:
            self.seen.clear()
            yield self.emit(id=key[0], initTime=seen[0])


class TimerKeys(_Flavour):
    """Registers a past processing-time timer per key and emits the key each handler gets: handleInputRows a plain
    tuple, handleExpiredTimer a Row of the key columns (fields by name too), as PySpark hands them."""

    OUTPUT = "id string, key string"

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        self.column(rows, "temperature")
        self.handle.registerTimer(1)
        yield self.emit(id=key[0], key=repr(key))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        yield self.emit(id=f"{key[0]}-expired", key=f"{key!r} {key.asDict()}")


class RowCounter(_Flavour):
    """Counts every row per id: with ``withWatermark`` on the input and time mode "None" or
    "ProcessingTime", late rows still arrive (defect 5)."""

    OUTPUT = "id string, count long"

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        n = (self.count.get() or (0,))[0] + len(self.column(rows, "temperature"))
        self.count.update((n,))
        yield self.emit(id=key[0], count=n)


class ReorderedOutput(_Flavour):
    """Output in another order than the schema: PySpark takes a Row's fields by name (``Row.asDict(True)``,
    nested Rows too; a field the Row lacks is null, one the schema lacks is dropped) and a frame's columns by
    name (a frame's unnamed columns in order); taken by position, same-typed fields would swap silently."""

    OUTPUT = "id string, n long, info struct<a: int, b: string>, first string, last string, note string"

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        n = len(self.column(rows, "temperature"))
        if self.use_pandas:
            yield pd.DataFrame(
                {
                    "last": ["z"],
                    "info": [{"b": key[0], "a": n}],
                    "first": ["a"],
                    "n": [n],
                    "id": [key[0]],
                    "note": [None],
                }
            )
            # unnamed columns are taken in order (a trailing extra one dropped)
            yield pd.DataFrame([[f"{key[0]}-unnamed", n, {"a": n, "b": key[0]}, "a", "z", None, "extra"]])
        else:
            yield Row(last="z", info=Row(b=key[0], a=n), first="a", n=n, id=key[0], extra=1)


class StateTimestamps(_Flavour):
    """Keeps the latest event time in value, list and map state and emits them as read back: PySpark hands a
    processor naive datetimes in local time (``TimestampType.fromInternal``), whatever it wrote."""

    OUTPUT = "id string, seen string"

    def init(self, handle: Any) -> None:
        self.last = handle.getValueState("last", "t timestamp")
        self.all = handle.getListState("all", "t timestamp")
        self.by = handle.getMapState("by", "k string", "t timestamp")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        seen = (self.last.get(), list(self.all.get()), self.by.getValue(("k",)))
        latest = max(self.column(rows, "eventTime"))
        if hasattr(latest, "to_pydatetime"):
            latest = latest.to_pydatetime()
        self.last.update((latest,))
        self.all.appendValue((latest,))
        self.by.updateValue(("k",), (latest,))
        yield self.emit(id=key[0], seen=repr([seen[0], seen[1][-1:], seen[2] and tuple(seen[2])]))


class FrameDtypes(_Flavour):
    """The dtype and first value of each column of each frame it gets (pandas): PySpark infers them per frame
    from Python values, so an int column is int64 (float64 only in a frame with a null), a float float64."""

    OUTPUT = "id string, dtypes string"

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        for pdf in rows:
            seen = ",".join(f"{c}:{pdf[c].dtype}:{pdf[c].iloc[0]}" for c in pdf.columns if c != "id")
            yield pd.DataFrame({"id": [key[0]], "dtypes": [seen]})


class NotNullableState(_Flavour):
    """A state schema with non-nullable fields: Spark's Avro state encoding refuses it at the declaration."""

    OUTPUT = "id string, n long"

    def init(self, handle: Any) -> None:
        schema = StructType([StructField("n", IntegerType(), False), StructField("name", StringType(), False)])
        self.state = handle.getValueState("state", schema)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        n = len(self.column(rows, "temperature"))
        self.state.update((n, key[0]))
        yield self.emit(id=key[0], n=n)


class Address(NamedTuple):
    road_id: int
    city: str


class CompositeState(_Flavour):
    """Arrays of arrays, arrays of structs, maps of arrays and maps of maps in Value, List and Map state
    (defect 6); nested structs come back as Rows (``.asDict()``)."""

    OUTPUT = "id string, value_arr string, list_state_arr string, map_state_arr string, nested_map_state_arr string"
    TAGS = [["dummy1", "dummy2"], ["dummy3"]]
    METADATA = [{"key": "env", "value": "prod"}, {"key": "region", "value": "us-west"}]
    ATTRIBUTES = {"key1": [1], "key2": [10]}
    CONFS = {"e1": {"e2": 5, "e3": 10}}
    ADDRESS = [Address(1, "Seattle"), Address(3, "SF")]

    def init(self, handle: Any) -> None:
        pair = StructType([StructField("key", StringType()), StructField("value", StringType())])
        address = StructType([StructField("road_id", IntegerType()), StructField("city", StringType())])
        obj = StructType(
            [
                StructField("id", ArrayType(IntegerType())),
                StructField("tags", ArrayType(ArrayType(StringType()))),
                StructField("metadata", ArrayType(pair)),
                StructField("address", ArrayType(address)),
            ]
        )
        entry = StructType(
            [
                StructField("id", IntegerType(), True),
                StructField("attributes", MapType(StringType(), ArrayType(IntegerType())), True),
                StructField("confs", MapType(StringType(), MapType(StringType(), IntegerType()), True), True),
            ]
        )
        self.obj_state = handle.getValueState("obj_state", obj)
        self.list_state = handle.getListState("list_state", obj)
        self.map_state = handle.getMapState("map_state", "name string", entry)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        name = key[0]
        total = int(sum(int(t) for t in self.column(rows, "temperature")))
        if self.obj_state.exists():
            ids, tags, metadata, address = self.obj_state.get()
            assert tags == self.TAGS, tags
            assert metadata == [Row(**m) for m in self.METADATA], metadata
            assert address == [Row(**a._asdict()) for a in self.ADDRESS], address
            ids = [int(x + total) for x in ids]
        else:
            ids = [0]
        self.obj_state.update((ids, self.TAGS, self.METADATA, self.ADDRESS))
        updated = []
        for list_ids, tags, metadata, address in self.list_state.get():
            list_ids.append(total)
            updated.append((list_ids, tags, [m.asDict() for m in metadata], address))
        self.list_state.put(updated or [(ids, self.TAGS, self.METADATA, self.ADDRESS)])
        if not self.map_state.containsKey(name):
            self.map_state.updateValue(name, (0, self.ATTRIBUTES, self.CONFS))
        else:
            entry_id, attributes, confs = self.map_state.getValue(name)
            attributes[name] = [total]
            confs.setdefault("e1", {})[name] = total
            self.map_state.updateValue(name, (entry_id, attributes, confs))
        _, attributes, confs = self.map_state.getValue(name)
        yield self.emit(
            id=name,
            value_arr=",".join(map(str, ids)),
            list_state_arr=",".join(str(i) for list_ids, *_ in self.list_state.get() for i in list_ids),
            map_state_arr=json.dumps(attributes, sort_keys=True),
            nested_map_state_arr=json.dumps(confs, sort_keys=True),
        )


_INNER = "struct<intValue:int,doubleValue:double,arrayValue:array<string>,mapValue:map<string,string>>"


class CompositeOutput(_Flavour):
    """Output columns of arrays, maps, arrays of structs and maps of structs (defect 7 for pandas)."""

    OUTPUT = (
        "primitiveValue string, listOfPrimitive array<string>, mapOfPrimitive map<string,string>, "
        f"listOfComposite array<{_INNER}>, mapOfComposite map<string,{_INNER}>"
    )

    def init(self, handle: Any) -> None:
        self.count_state = handle.getValueState("count_state", StructType([StructField("value", IntegerType(), True)]))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        count = (self.count_state.get()[0] if self.count_state.exists() else 0) + len(self.column(rows, "temperature"))
        self.count_state.update((count,))

        def inner(i: int, scale: float) -> dict[str, Any]:
            return {
                "intValue": int(i * scale),
                "doubleValue": float(i * scale),
                "arrayValue": [f"elem_{i}_{j}" for j in range(i + 1)],
                "mapValue": {f"map_{i}_{j}": f"val_{i}_{j}" for j in range(i + 1)},
            }

        yield self.emit(
            primitiveValue=f"key_{key[0]}_count_{count}",
            listOfPrimitive=[f"item_{i}" for i in range(count)],
            mapOfPrimitive={f"key{i}": f"value{i}" for i in range(count)},
            listOfComposite=[inner(i, 1.5) for i in range(count)],
            mapOfComposite={f"nested_key{i}": inner(i, 2.5) for i in range(count)},
        )


class MapStateOps(_Flavour):
    """MapState: updateValue / containsKey / getValue / keys / values / iterator / removeKey / clear."""

    OUTPUT = "id string, countAsString string"

    def init(self, handle: Any) -> None:
        self.map_state = handle.getMapState("mapState", "name string", "count int")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        count = len(self.column(rows, "temperature"))
        k1, k2 = ("key1",), ("key2",)
        v1 = count + (self.map_state.getValue(k1)[0] if self.map_state.containsKey(k1) else 0)
        v2 = count + (self.map_state.getValue(k2)[0] if self.map_state.containsKey(k2) else 0)
        self.map_state.updateValue(k1, (v1,))
        self.map_state.updateValue(k2, (v2,))
        assert [k[0] for k in self.map_state.keys()] == ["key1", "key2"]  # noqa: SIM118 - a MapState
        assert [v[0] for v in self.map_state.values()] == [v1, v2]
        assert [(k[0], v[0]) for k, v in self.map_state.iterator()] == [("key1", v1), ("key2", v2)]
        self.map_state.removeKey(k1)
        assert not self.map_state.containsKey(k1) and self.map_state.exists()
        yield self.emit(id=key[0], countAsString=str(v2))


class ListStateOps(_Flavour):
    """ListState: put / appendValue / appendList, interleaved iterators, a timestamp list."""

    OUTPUT = "id string, countAsString string"

    def init(self, handle: Any) -> None:
        self.list_state = handle.getListState("listState", "temperature int")
        self.times = handle.getListState("listStateTimestamp", "time timestamp")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import datetime as dt

        count = len(self.column(rows, "temperature"))
        self.list_state.put([(120,), (20,)])
        self.list_state.appendValue((111,))
        self.list_state.appendList([(120,), (20,)])
        a, b = self.list_state.get(), self.list_state.get()
        assert [next(a)[0], next(b)[0], next(a)[0]] == [120, 120, 20]
        assert [x[0] for x in a] == [111, 120, 20] and [x[0] for x in b] == [20, 111, 120, 20]
        now = dt.datetime.fromtimestamp(timerValues.getCurrentProcessingTimeInMs() / 1000)
        self.times.put([(now + dt.timedelta(minutes=1),)])
        yield self.emit(id=key[0], countAsString=str(count))


class ListStateTTL(_Flavour):
    """A TTL'd ListState appended to in every batch: each element expires on its own (Spark keeps an expiry
    per element), so a batch sees the elements of the batches within the TTL only."""

    OUTPUT = "id string, temperatures string, present boolean"

    def __init__(self, use_pandas: bool, ttl_ms: int) -> None:
        super().__init__(use_pandas)
        self.ttl_ms = ttl_ms

    def init(self, handle: Any) -> None:
        self.temps = handle.getListState("temps", "temperature int", self.ttl_ms)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        new = self.column(rows, "temperature")
        present = self.temps.exists()
        self.temps.appendValue((int(new[0]),))
        if len(new) > 1:
            self.temps.appendList([(int(t),) for t in new[1:]])
        yield self.emit(id=key[0], temperatures=json.dumps([t[0] for t in self.temps.get()]), present=present)


class IterationOrders(_Flavour):
    """What a processor sees in Spark's own order: a MapState's keys (Spark iterates them by the UnsafeRow
    bytes of each key: little-endian numbers, shorter rows first, nulls by their bit), a key's timers (by the
    little-endian bytes of each expiry) and the watermark in ProcessingTime without event time (0)."""

    OUTPUT = "id string, ints string, composite string, timers string, watermark long"
    COMPOSITE = [
        (1, "b", 2.5, True, decimal.Decimal("12345678901234567.25")),
        (1, "aa", -0.5, False, decimal.Decimal("-1.00")),
        (-3, "", 0.0, None, decimal.Decimal("0.01")),
        (None, "z", 1e300, True, None),
        (256, "bb", -1e-300, False, decimal.Decimal("99999999999999999999.99")),
    ]

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.ints = handle.getMapState("ints", "k int", "i int")
        self.composite = handle.getMapState(
            "composite", "a int, s string, d double, b boolean, x decimal(22,2)", "i int"
        )

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        temperatures = self.column(rows, "temperature")
        for i, t in enumerate([*temperatures, 1, 256, -1, 65536, -256, 0]):
            self.ints.updateValue((int(t),), (i,))
        for i, k in enumerate(self.COMPOSITE):
            self.composite.updateValue(k, (i,))
        for t in (5, 10**15, 2**40 + 7):
            self.handle.registerTimer(t)
        yield self.emit(
            id=key[0],
            ints=json.dumps([k[0] for k in self.ints.keys()]),  # noqa: SIM118 - a MapState
            composite=json.dumps([v[0] for v in self.composite.values()]),
            timers=json.dumps(list(self.handle.listTimers())),
            watermark=timerValues.getCurrentWatermarkInMs(),
        )

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        if expiredTimerInfo.getExpiryTimeInMs() == 5:
            yield self.emit(id=f"{key[0]}-expired", ints="", composite="", timers="", watermark=-2)
