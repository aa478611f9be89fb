"""PySpark's transformWithState semantics that processors of PySpark's own suite rely on (issue 64),
through TwsTester (no Spark, cheap): a deleted variable's handle raises, pandas frames as PySpark's
(nanosecond timestamps, indexed from 0, maps as dicts), the firing timer listed during its handler, late
rows dropped only in EventTime, MapType in state and in output. The same processors run on Spark beside
PySpark's operator in test_pyspark_suite_parity.py."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pandas as pd  # type: ignore[import-untyped]
import pyarrow as pa
import pytest

from statekeeper.store.errors import StatekeeperError
from statekeeper.store.formats.typed_codec import ValueCodec
from statekeeper.store.formats.typed_schema import (
    SchemaEvolutionError,
    check_evolution,
    from_arrow,
    from_json,
    infer,
    map_of,
    parse_ddl,
    projector,
    to_schema,
)
from statekeeper.store.spark.deleted_state import StateVariableDeletedError
from statekeeper.store.spark.pandas_frames import from_pandas, to_pandas
from statekeeper.store.spark.task_output import OutputBuffer
from statekeeper.store.spark.testing import TwsTester, _arrow_output_schema
from tests.spark.pyspark_tws import processors as p

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
T0_S = int(T0.timestamp())
FLAVOURS = ["rows", "pandas"]


def _rows(*rows: tuple[str, int, float]) -> pa.Table:
    return pa.table(
        {
            "id": [r[0] for r in rows],
            "temperature": pa.array([r[1] for r in rows], pa.int32()),
            "eventTime": pa.array([T0 + dt.timedelta(seconds=r[2]) for r in rows], pa.timestamp("us", tz="UTC")),
        }
    )


@contextlib.contextmanager
def _local_time_zone(zone: str) -> Iterator[None]:
    """The process's local time zone (what PySpark's naive timestamps are in) set to `zone` meanwhile."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


def _tester(processor: Any, flavour: str, **kw: Any) -> TwsTester:
    return TwsTester(processor, "id", type(processor).OUTPUT, input_format=flavour, **kw)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_deleted_state_variable_handle_raises_like_pyspark(flavour: str) -> None:
    """SimpleStateful asserts inside handleInputRows that its deleted ``tempState`` handle raises."""
    with _tester(p.SimpleStateful(flavour == "pandas"), flavour, time_mode="None") as t:
        assert sorted(t.run(_rows(("0", 123, 0), ("0", 46, 1), ("1", 146, 2)))) == [("0", "2", 1), ("1", "1", 1)]
        assert sorted(t.run(_rows(("0", 200, 3)))) == [("0", "1", 2)]
        assert t.value_state("numViolations") == {("0",): (2,), ("1",): (1,)}


class _Deleter(p.SimpleStateful):
    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        for call in (self.temp_state.get, lambda: self.temp_state.update((1,)), self.temp_state.clear):
            with pytest.raises(StateVariableDeletedError, match=r"was deleted by handle\.deleteIfExists") as e:
                call()
            assert isinstance(e.value, StatekeeperError)
        self.again.update((7,))
        yield from super().handleInputRows(key, rows, timerValues)

    def init(self, handle: Any) -> None:
        super().init(handle)  # declares tempState, then deletes it
        self.again = handle.getValueState("tempState", "value int")  # declared again: a new variable


def test_every_method_of_a_deleted_handle_raises_and_redeclaring_gives_a_fresh_variable() -> None:
    with _tester(_Deleter(False), "rows", time_mode="None") as t:
        t.run(_rows(("0", 1, 0)))
        assert t.value_state("tempState") == {("0",): (7,)}


def test_pandas_event_times_are_nanoseconds_like_pyspark() -> None:
    """``astype("int64") // 10**9`` gives seconds on PySpark's frames (microseconds would be 1000x off)."""
    kw = {"time_mode": "EventTime", "event_time_column": "eventTime", "watermark_delay": "5 seconds"}
    for flavour in FLAVOURS:
        with _tester(p.EventTimeMax(flavour == "pandas"), flavour, **kw) as t:
            out = t.run(_rows(("0", 1, 0), ("0", 1, 1), ("1", 1, 3)))
            assert sorted(r for r in out if not r[0].endswith("-expired")) == [
                ("0", str(T0_S + 1)),
                ("1", str(T0_S + 3)),
            ]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_firing_timer_is_listed_until_its_handler_deletes_it(flavour: str) -> None:
    """ProcTimeTimers asserts inside handleExpiredTimer that listTimers has the firing timer and the new one."""
    with _tester(p.ProcTimeTimers(flavour == "pandas"), flavour) as t:
        t.run(_rows(("0", 1, 0), ("1", 1, 0)), processing_time_ms=1000)
        assert t.timers() == [(("0",), 1001)]
        assert sorted(t.run(_rows(("0", 1, 0)), processing_time_ms=2000)) == [("0", "-1"), ("0", "2")]
        assert t.timers() == [(("0",), 2001)]  # the fired one is gone after its handler
        assert t.last_metrics is not None and t.last_metrics.timers_fired == 1


def test_pandas_frames_are_indexed_from_zero_like_pyspark() -> None:
    """InitialStateSum reads ``initialState.at[0, ...]`` and ``pdf.at[0, ...]``; keys share one chunk here."""
    initial = [{"id": "0", "initVal": 789}, {"id": "3", "initVal": 987}]
    for flavour in FLAVOURS:
        with _tester(p.InitialStateSum(flavour == "pandas"), flavour, time_mode="None", initial_state=initial) as t:
            out = t.run(_rows(("0", 10, 0), ("0", 5, 0), ("1", 7, 0), ("3", 20, 0), ("3", 2, 0)))
            assert sorted(out) == [("0", "804", 10), ("1", "7", 7), ("3", "1009", 20)]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_output_timestamps_are_wall_times_in_the_session_time_zone_like_pyspark(flavour: str) -> None:
    """ChainingOps hands an input event time back unchanged: in a pandas frame it is naive, in the session time
    zone, and PySpark takes a naive output timestamp in that zone (nested ones too), so the instant survives
    (compared with PySpark's operator in test_pyspark_suite_parity.py)."""
    zone = "America/Los_Angeles"
    with _tester(p.ChainingOps(flavour == "pandas"), flavour, time_mode="None", session_time_zone=zone) as t:
        assert t.run(_rows(("a", 1, 5), ("a", 2, 6))) == [("a", T0 + dt.timedelta(seconds=5))]
    naive, ntz = pd.Timestamp("2024-01-01 12:00"), dt.datetime(2024, 1, 1, 12)
    frame = pd.DataFrame({"ts": [naive], "ntz": [ntz], "s": [{"t": naive}], "l": [[naive]], "m": [{"k": naive}]})
    schema = "ts timestamp, ntz timestamp_ntz, s struct<t: timestamp>, l array<timestamp>, m map<string, timestamp>"
    out = OutputBuffer(_arrow_output_schema(schema), time_zone=zone)
    out.add([frame])
    (row,) = [r for b in out.drain() for r in b.to_pylist()]
    noon = dt.datetime(2024, 1, 1, 20, tzinfo=dt.UTC)  # 12:00 in Los Angeles
    assert (row["ts"], row["ntz"], row["s"], row["l"], row["m"]) == (noon, ntz, {"t": noon}, [noon], [("k", noon)])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_initial_state_timestamps_are_in_the_session_time_zone_like_pyspark(flavour: str) -> None:
    """handleInitialState reads the initial state's timestamps as the input's, in the session time zone, though the
    driver collects them in UTC (compared with PySpark's operator in test_pyspark_suite_parity.py)."""
    initial = pa.table({"id": ["0"], "initTime": pa.array([T0], pa.timestamp("us", tz="UTC"))})
    processor = p.InitialStateTime(flavour == "pandas")
    zone = "America/Los_Angeles"
    with _tester(processor, flavour, time_mode="None", initial_state=initial, session_time_zone=zone) as t:
        out = t.run(_rows(("0", 1, 0)))
    assert out == [("0", "('0',) 2023-12-31 16:00:00" + ("-08:00" if flavour == "rows" else ""))]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_timer_keys_are_rows_with_naive_timestamps_like_pyspark(flavour: str) -> None:
    """PySpark hands handleExpiredTimer a Row of the key columns; a timestamp in it naive: in local time
    (transformWithState), a wall time in the session time zone (transformWithStateInPandas), as its operator gives
    them with local time Asia/Kolkata and the session's America/Los_Angeles. transformWithStateInPandas takes
    handleInputRows' key from the frame: a naive pandas.Timestamp, in the session time zone."""
    zone = "America/Los_Angeles"
    with (
        _local_time_zone("Asia/Kolkata"),
        TwsTester(
            p.TimerKeys(flavour == "pandas"),
            ["id", "eventTime"],
            p.TimerKeys.OUTPUT,
            input_format=flavour,
            session_time_zone=zone,
        ) as t,
    ):
        out = t.run(_rows(("a", 1, 0)), processing_time_ms=1_000)
    wall = dt.datetime(2024, 1, 1, 5, 30) if flavour == "rows" else dt.datetime(2023, 12, 31, 16)
    fields = {"id": "a", "eventTime": wall}
    assert ("a-expired", f"Row(id='a', eventTime={wall!r}) {fields}") in out
    if flavour == "pandas":
        assert ("a", repr(("a", pd.Timestamp(wall)))) in out


@pytest.mark.parametrize(("time_mode", "late_kept"), [("None", True), ("ProcessingTime", True), ("EventTime", False)])
def test_late_rows_are_dropped_only_in_event_time(time_mode: str, late_kept: bool) -> None:
    kw = {"time_mode": time_mode, "event_time_column": "eventTime", "watermark_delay": "5 seconds"}
    with _tester(p.RowCounter(False), "rows", **kw) as t:
        t.run(_rows(("0", 1, 0)))
        t.run(_rows(("0", 1, 30)))  # the watermark reaches 25 s for the next batch's late rows... one on
        t.run(_rows(("0", 1, 31)))
        assert t.run(_rows(("0", 1, 10))) == ([("0", 4)] if late_kept else [])
        assert t.last_metrics is not None and t.last_metrics.late_rows == (0 if late_kept else 1)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_map_types_in_value_list_and_map_state(flavour: str) -> None:
    """CompositeState: maps of arrays and maps of maps in a MapState value, arrays of structs (as Rows)."""
    with _tester(p.CompositeState(flavour == "pandas"), flavour, time_mode="None") as t:
        assert t.run(_rows(("a", 3, 0), ("a", 4, 0))) == [
            ("a", "0", "0", '{"key1": [1], "key2": [10]}', '{"e1": {"e2": 5, "e3": 10}}')
        ]
        assert t.run(_rows(("a", 5, 0))) == [
            ("a", "5", "0,5", '{"a": [5], "key1": [1], "key2": [10]}', '{"e1": {"a": 5, "e2": 5, "e3": 10}}')
        ]
        assert t.map_state("map_state")[("a",)] == {
            ("a",): (0, {"key1": [1], "key2": [10], "a": [5]}, {"e1": {"e2": 5, "e3": 10, "a": 5}})
        }


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_map_typed_output_columns(flavour: str) -> None:
    with _tester(p.CompositeOutput(flavour == "pandas"), flavour, time_mode="None") as t:
        t.run(_rows(("k", 1, 0)))
        (row,) = t.run(_rows(("k", 1, 0)))
    inner = {
        "intValue": 2,
        "doubleValue": 2.5,
        "arrayValue": ["elem_1_0", "elem_1_1"],
        "mapValue": {"map_1_0": "val_1_0", "map_1_1": "val_1_1"},
    }
    assert row[0] == "key_k_count_2"
    assert dict(row[2]) == {"key0": "value0", "key1": "value1"}
    assert dict(row[4])["nested_key1"]["mapValue"] in (inner["mapValue"], list(inner["mapValue"].items()))  # type: ignore[attr-defined]


def test_map_schemas_parse_round_trip_evolve_and_encode_in_entry_order() -> None:
    from pyspark.sql.types import ArrayType, IntegerType, LongType, MapType, StringType, StructField, StructType

    spark_type = StructType(
        [StructField("m", MapType(StringType(), MapType(StringType(), ArrayType(IntegerType())), True))]
    )
    ours = to_schema(spark_type, "x")
    assert ours is not None and json.loads(ours.to_json()) == spark_type.jsonValue()
    assert parse_ddl("m map<string, map<string, array<int>>>") == ours == from_json(ours.to_json())
    assert from_arrow(pa.map_(pa.string(), pa.int64()), "x") == map_of(parse_ddl("string"), parse_ddl("long"))
    assert infer({"a": 1}, "x") == map_of(parse_ddl("string"), parse_ddl("long"))
    widened = to_schema(StructType([StructField("m", MapType(StringType(), LongType()))]), "x")
    narrow = parse_ddl("m map<string, int>")
    assert widened is not None
    check_evolution(narrow, widened, "v")  # map values widen like any value
    with pytest.raises(SchemaEvolutionError, match="map keys cannot change"):
        check_evolution(narrow, parse_ddl("m map<int, int>"), "v")
    assert (
        projector(parse_ddl("m map<string, struct<a:int, b:int>>"), parse_ddl("m map<string, struct<b:int>>"))
        is not None
    )
    codec = ValueCodec(parse_ddl("m map<string, int>, d decimal(10,2), b binary, day date"), "x")
    value = ({"z": 1, "a": None, "m": 3}, decimal.Decimal("1.25"), b"\x00\x01", dt.date(2024, 2, 29))
    raw = codec.encode(value)
    assert codec.encode(({"z": 1, "a": None, "m": 3}, *value[1:])) == raw  # deterministic bytes
    decoded = codec.decode(raw)
    assert decoded == value and list(decoded[0]) == ["z", "a", "m"]  # the map's own order
    with pytest.raises(Exception, match="cannot be part of a key"):
        from statekeeper.store.formats.typed_keys import KeyCodec

        KeyCodec(parse_ddl("m map<string, int>"), "grouping key")


def test_arrow_to_pandas_types_are_pysparks() -> None:
    table = pa.table(
        {
            "ts": pa.array([T0], pa.timestamp("us", tz="UTC")),
            "ntz": pa.array([dt.datetime(2024, 1, 1, 12)], pa.timestamp("us")),
            "day": pa.array([dt.date(2024, 1, 2)], pa.date32()),
            "dec": pa.array([decimal.Decimal("1.50")], pa.decimal128(10, 2)),
            "bin": pa.array([b"\x01"], pa.binary()),
            "m": pa.array([[("a", [("x", 1)])]], pa.map_(pa.string(), pa.map_(pa.string(), pa.int32()))),
            "s": pa.array([{"k": [("q", 2)]}], pa.struct([("k", pa.map_(pa.string(), pa.int64()))])),
        }
    )
    pdf = to_pandas(table)
    assert str(pdf["ts"].dtype) == "datetime64[ns]" and int(pdf["ts"].astype("int64")[0]) == T0_S * 10**9
    assert str(pdf["ntz"].dtype) == "datetime64[ns]" and pdf["ntz"][0] == pd.Timestamp("2024-01-01 12:00")
    assert pdf["day"][0] == dt.date(2024, 1, 2) and pdf["dec"][0] == decimal.Decimal("1.50")
    assert pdf["bin"][0] == b"\x01" and pdf["m"][0] == {"a": {"x": 1}} and pdf["s"][0] == {"k": {"q": 2}}
    # a zoned timestamp is wall time in the session time zone, as PySpark's _check_series_localize_timestamps
    assert to_pandas(table, "America/New_York")["ts"][0] == pd.Timestamp("2023-12-31 19:00")
    fields = [pa.field("m", pa.map_(pa.string(), pa.struct([("v", pa.map_(pa.string(), pa.string()))])))]
    (column,) = from_pandas(pd.DataFrame({"m": [{"k": {"v": {"a": "b"}}}]}), fields)
    assert column.type == fields[0].type and column.to_pylist() == [[("k", {"v": [("a", "b")]})]]


class _Profile(p._Flavour):
    """A struct ValueState whose schema the next query narrows (``id`` long -> int), in the shape of the evolution
    processors of PySpark's suite: a query restarted with a processor declaring another value schema."""

    ID_TYPE = "long"

    def init(self, handle: Any) -> None:
        self.profile = handle.getValueState("profile", f"id {self.ID_TYPE}, label string")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        for _ in rows:
            pass
        self.profile.update((int(key[0]), f"label-{key[0]}"))
        yield self.emit(id=key[0])


class _NarrowProfile(_Profile):
    ID_TYPE = "int"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_incompatible_value_schema_raises_with_sparks_error_class(flavour: str) -> None:
    """PySpark's suite (test_schema_evolution_fails) matches "[STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION]" and
    "Schema evolution is not possible" in the failed query's error when a restarted query narrows a field."""
    with TwsTester(_Profile(flavour == "pandas"), "id", "id string", input_format=flavour, time_mode="None") as t:
        assert t.run([{"id": "0"}]) == [("0",)]
        t.processor = _NarrowProfile(flavour == "pandas")  # the restarted query's processor
        with pytest.raises(SchemaEvolutionError) as e:
            t.run([{"id": "0"}])
    message = str(e.value)
    assert message.startswith("[STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION] Schema evolution is not possible ")
    assert "new value_schema=struct<id:integer,label:string> and old value_schema=struct<id:long" in message
    assert "field 'value.id' was long in the checkpoint and is declared integer now" in message  # our own detail


class _Counted(p._Flavour):
    """Declares one state variable of each kind (two with a TTL) and one more that it deletes; per key, registers
    two timers and deletes one of them and one that does not exist."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.seen = handle.getValueState("seen", "n long", 60_000)
        handle.getListState("log", "v long", 60_000)
        handle.getMapState("by", "k string", "v long")
        handle.getValueState("scratch", "n long")
        handle.deleteIfExists("scratch")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        for _ in rows:
            pass
        self.seen.update((1,))
        now = timerValues.getCurrentProcessingTimeInMs()
        self.handle.registerTimer(now + 1_000)
        self.handle.registerTimer(now + 2_000)
        self.handle.deleteTimer(now + 2_000)
        self.handle.deleteTimer(now + 3_000)  # none there: counted all the same, as Spark counts calls
        yield self.emit(id=key[0])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_progress_counts_sparks_transform_with_state_metrics(flavour: str) -> None:
    """Spark's transformWithState custom metrics under its names: variables declared per task and deleted,
    timers registered, deleted and expired."""
    from statekeeper.store.spark.metrics import TWS_METRICS, BatchProgress

    with TwsTester(_Counted(flavour == "pandas"), "id", "id string", input_format=flavour) as t:
        t.run([{"id": "a"}, {"id": "b"}], processing_time_ms=1_000)
        first = t.last_metrics
        t.run([], processing_time_ms=2_500)  # the 2 s timers are due, the 3 s ones were deleted
        fired = t.last_metrics
    assert first is not None and fired is not None
    expected = {"numValueStateVars": 1, "numMapStateVars": 1, "numDeletedStateVars": 1}
    expected |= {"numValueStateWithTTLVars": 1, "numListStateWithTTLVars": 1}
    assert first.api_counts == expected | {"numRegisteredTimers": 4, "numDeletedTimers": 4}
    assert fired.api_counts == expected and fired.timers_fired == 2
    base = {"operator": "op", "batch_id": 1, "version": 2, "async_checkpoint": False, "num_partitions": 2}
    progress = BatchProgress.of_partitions(
        {**base, "batch_timestamp_ms": 0},
        "commit",
        [first, fired],
        attempts=1,
        job_ms=0,
        job_started_at_ms=0,
        upload_wait_ms=None,
        commit_record_ms=0,
        watermark_ms=-1,
    )
    custom = progress.state_operator_progress()["customMetrics"]
    assert {n: custom[n] for n in TWS_METRICS} == {n: 0 for n in TWS_METRICS} | {
        n: 2 * c for n, c in expected.items()
    } | {"numRegisteredTimers": 4, "numDeletedTimers": 4, "numExpiredTimers": 2}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_ttl_list_expires_element_by_element_like_pyspark(flavour: str) -> None:
    """Spark keeps an expiry per ListState element: appended in different batches, they expire apart, and
    numValuesRemovedDueToTTLExpiry counts elements."""
    processor = p.ListStateTTL(flavour == "pandas", ttl_ms=2_500)
    with _tester(processor, flavour) as t:
        assert t.run(_rows(("a", 1, 0)), processing_time_ms=0) == [("a", "[1]", False)]
        assert t.run(_rows(("a", 2, 0), ("a", 3, 0)), processing_time_ms=2_000) == [("a", "[1, 2, 3]", True)]
        # 1 expired at 2.5 s; 2 and 3 (until 4.5 s) stay
        assert t.run(_rows(("a", 4, 0)), processing_time_ms=3_000) == [("a", "[2, 3, 4]", True)]
        assert t.last_metrics is not None and t.last_metrics.ttl_removed == 1
        assert t.list_state("temps") == {("a",): [(2,), (3,), (4,)]}
        # at 5 s only 4 (until 5.5 s) is live; at 6 s nothing is: the key's list is gone
        assert t.run(_rows(("b", 9, 0)), processing_time_ms=5_000) == [("b", "[9]", False)]
        assert t.list_state("temps") == {("a",): [(4,)], ("b",): [(9,)]}
        assert t.last_metrics is not None and t.last_metrics.ttl_removed == 2
        assert t.run(_rows(("a", 5, 0)), processing_time_ms=6_000) == [("a", "[5]", False)]
        assert t.last_metrics is not None and t.last_metrics.ttl_removed == 1


def test_declarations_follow_pysparks_handle_rules() -> None:
    """As PySpark's handle: variables are declared (and deleted) in init only and once each, a TTL needs
    ProcessingTime, timers need a time mode -- each refused with Spark's error class, a PySparkRuntimeError."""
    from pyspark.errors import PySparkRuntimeError

    from statekeeper.store.spark import StatefulProcessor

    def refused(mode: str, in_init: Any = None, in_rows: Any = None) -> str:
        class Declaring(StatefulProcessor):
            def init(self, handle: Any) -> None:
                self.handle = handle
                if in_init:
                    in_init(handle)

            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
                if in_rows:
                    in_rows(self.handle)
                yield (key[0],)

        with pytest.raises(PySparkRuntimeError) as e, TwsTester(Declaring(), "id", "id string", time_mode=mode) as t:
            t.run([{"id": "a"}])
        assert isinstance(e.value, StatekeeperError)
        return str(e.value)

    assert "[STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL] Cannot use TTL for state=v in timeMode=NoTime" in (
        refused("None", lambda h: h.getValueState("v", "x int", 1000))
    )
    assert "timeMode=EventTime, use TimeMode.ProcessingTime() instead" in refused(
        "EventTime", lambda h: h.getListState("v", "x int", 1000)
    )
    assert "[STATEFUL_PROCESSOR_DUPLICATE_STATE_VARIABLE_DEFINED] State variable with name v" in refused(
        "None", lambda h: (h.getValueState("v", "x int"), h.getMapState("v", "k int", "x int"))
    )
    for late in (lambda h: h.getValueState("late", "x int"), lambda h: h.deleteIfExists("v")):
        assert "[STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE]" in refused("None", None, late)
    assert "Error register timer: [STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE]" in refused(
        "None", None, lambda h: h.registerTimer(5)
    )


def test_values_pyspark_does_not_store_are_refused_like_pyspark() -> None:
    """An empty list, a null value, list element or map key: refused with Spark's ILLEGAL_STATE_STORE_VALUE
    class, a PySparkRuntimeError naming the variable (PySpark 4.3 refuses each)."""
    from pyspark.errors import PySparkRuntimeError

    from statekeeper.store.spark import StatefulProcessor

    calls = {
        "EMPTY_LIST_VALUE": [lambda s: s.lst.put([]), lambda s: s.lst.appendList([])],
        "NULL_VALUE": [
            lambda s: s.lst.put([(1,), None]),
            lambda s: s.lst.appendValue(None),
            lambda s: s.value.update(None),
            lambda s: s.map.updateValue((1,), None),
            lambda s: s.map.updateValue(None, (1,)),
        ],
    }
    for spark_class, writes in calls.items():
        for write in writes:

            class Writing(StatefulProcessor):
                def init(self, handle: Any) -> None:
                    self.value = handle.getValueState("value", "x int")
                    self.lst = handle.getListState("lst", "x int")
                    self.map = handle.getMapState("map", "k int", "x int")

                def handleInputRows(self, key: Any, rows: Any, timerValues: Any, write: Any = write) -> Any:
                    write(self)
                    yield (key[0],)

            refused = pytest.raises(PySparkRuntimeError, match=rf"\[ILLEGAL_STATE_STORE_VALUE\.{spark_class}\]")
            with refused, TwsTester(Writing(), "id", "id string") as t:
                t.run([{"id": "a"}])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_iteration_orders_and_the_watermark_are_sparks(flavour: str) -> None:
    """What PySpark 4.3's operator gives for IterationOrders (the slow parity matrix runs it beside PySpark):
    map keys and timers in the byte order of Spark's stored rows, watermark 0 in ProcessingTime without event
    time, the past timer fired in the same batch."""
    with _tester(p.IterationOrders(flavour == "pandas"), flavour) as t:
        out = t.run(_rows(("0", 7, 0), ("0", 300, 1)), processing_time_ms=1_000)
    assert sorted(out) == [
        ("0", "[0, 65536, 256, -256, 1, 7, 300, -1]", "[2, 4, 0, 1, 3]", "[1000000000000000, 5, 1099511627783]", 0),
        ("0-expired", "", "", "", -2),
    ]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_output_is_taken_by_name_like_pyspark(flavour: str) -> None:
    """A Row's fields by name (nested Rows too; missing: null, extra: dropped), a frame's columns by name and an
    unnamed frame's in order, as PySpark converts them (compared with PySpark's operator in
    test_pyspark_suite_parity.py's ReorderedOutput)."""
    with _tester(p.ReorderedOutput(flavour == "pandas"), flavour, time_mode="None") as t:
        out = sorted(t.run(_rows(("k", 1, 0), ("k", 2, 1))))
    named = ("k", 2, {"a": 2, "b": "k"}, "a", "z", None)
    assert [(*r[:2], dict(r[2]), *r[3:]) for r in out] == (
        [named, ("k-unnamed", *named[1:])] if flavour == "pandas" else [named]
    )


def test_map_get_value_is_a_row_like_pysparks() -> None:
    """PySpark's MapState.getValue returns the value's Row (its iterator, keys and values give tuples)."""
    from statekeeper.store.spark import StatefulProcessor

    class Getter(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.m = handle.getMapState("m", "k string", "arr array<int>, n long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            self.m.updateValue(("x",), ([3], 1))
            value = self.m.getValue(("x",))
            entries = list(self.m.iterator())
            yield (key[0], value.arr[0] + value.n, type(entries[0][1]) is tuple)

    with TwsTester(Getter(), "id", "id string, total long, plain boolean") as t:
        assert t.run([{"id": "a"}]) == [("a", 4, True)]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_timestamps_read_from_state_are_naive_local_time_like_pyspark(flavour: str) -> None:
    """PySpark's TimestampType.fromInternal: a naive datetime in local time (compared with PySpark's operator in
    test_pyspark_suite_parity.py's StateTimestamps); with TZ=Asia/Kolkata a naive write reads back the same and
    stores the instant 5:30 earlier in UTC, as PySpark's toInternal takes a naive datetime as local time."""
    with _local_time_zone("Asia/Kolkata"), _tester(p.StateTimestamps(flavour == "pandas"), flavour) as t:
        t.run(_rows(("k", 1, 0)))
        (out,) = t.run(_rows(("k", 1, 5)))
        stored = t.value_state("last")[("k",)]
    # rows: the event time is aware (T0, UTC midnight), read back as Kolkata's naive 05:30; pandas: it is naive
    # in the session time zone (UTC), written as Kolkata local time, so its instant is 5:30 earlier
    naive = repr(dt.datetime(2024, 1, 1, 5, 30) if flavour == "rows" else dt.datetime(2024, 1, 1))
    assert out[1] == f"[({naive},), [({naive},)], ({naive},)]"
    shift = dt.timedelta(0) if flavour == "rows" else dt.timedelta(hours=5, minutes=30)
    assert stored == (T0 + dt.timedelta(seconds=5) - shift,)


def test_map_keys_with_timestamps_read_back_naive_like_pyspark() -> None:
    """A MapState key's timestamp is a naive local datetime too; it finds its entry again under another TZ."""
    from statekeeper.store.spark import StatefulProcessor

    written = [dt.datetime(2024, 1, 1, 0, 0, s, s) for s in (5, 0, 7)]

    class ByTime(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.m = handle.getMapState("m", "t timestamp", "n int")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            seen = sorted(k[0] for k in self.m.keys())  # noqa: SIM118 - MapState, not a dict
            for t in written:
                self.m.updateValue((t,), (t.second,))
            yield (key[0], repr(seen), self.m.getValue((written[0],)).n)

    with _local_time_zone("Asia/Kolkata"), TwsTester(ByTime(), "id", "id string, seen string, n int") as t:
        t.run([{"id": "a"}])
        assert t.run([{"id": "a"}]) == [("a", repr(sorted(written)), 5)]
