"""statekeeper's `tws_tester.TwsTester` against PySpark's own (``pyspark.sql.streaming.tws_tester``).

The scenarios of PySpark's suite of its tester (python/pyspark/sql/tests/streaming/test_tws_tester.py in
apache/spark: running count, top-K on a ListState, word frequencies on a MapState, every state method, initial
state, direct state access, keys of every kind, processing-time and event-time timers, late rows, the API's errors)
run here against both testers through one parametrized fixture, with the same expected outputs and state. The
processors (tests/spark/pyspark_tws/tester_processors.py) are our own code. Then the cases where ours follows
the real operator instead of PySpark's tester (TTL, timers at or before the watermark, timers due inside a batch,
typed state and keys, aborted batches).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd  # type: ignore[import-untyped]
import pandas.testing as pdt  # type: ignore[import-untyped]
import pytest
from pyspark.errors import PySparkAssertionError, PySparkRuntimeError, PySparkValueError
from pyspark.errors.exceptions.base import IllegalArgumentException
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.streaming.tws_tester import TwsTester as PySparkTwsTester

from statekeeper.store.spark.state_view import StateView
from statekeeper.store.spark.tws_tester import TwsTester as StatekeeperTwsTester
from tests.spark.pyspark_tws.tester_processors import (
    AllMethods,
    EventTimeCount,
    EventTimeSession,
    RunningCount,
    SessionTimeout,
    TopK,
    WordFrequency,
    event_ms,
)

TESTERS = {"pyspark": PySparkTwsTester, "statekeeper": StatekeeperTwsTester}


@pytest.fixture(params=sorted(TESTERS))
def tester_class(request: pytest.FixtureRequest) -> Any:
    """Each scenario runs once on PySpark's tester and once on ours."""
    return TESTERS[request.param]


# -- PySpark's scenarios, on both testers ----------------------------------------------------------------
def test_running_count(tester_class: Any) -> None:
    t = tester_class(RunningCount())
    assert t.test("key1", [Row(value="a")]) == [Row(key="key1", count=1)]
    assert t.test("key2", [Row(value="a"), Row(value="a")]) == [Row(key="key2", count=2)]
    assert t.test("key3", [Row(value="a")]) == [Row(key="key3", count=1)]
    assert t.test("key1", [Row(value="a")] * 3) == [Row(key="key1", count=4)]
    assert [t.peekValueState("count", k) for k in ("key1", "key2", "key3", "key4")] == [(4,), (2,), (1,), None]


def test_running_count_pandas(tester_class: Any) -> None:
    t = tester_class(RunningCount(use_pandas=True))
    for key, n, want in (("key1", 1, 1), ("key2", 2, 2), ("key3", 1, 1), ("key1", 3, 4)):
        got = t.testInPandas(key, pd.DataFrame({"value": ["a"] * n}))
        pdt.assert_frame_equal(got, pd.DataFrame({"key": [key], "count": [want]}), check_like=True)


def test_direct_access_to_value_state_and_step_function(tester_class: Any) -> None:
    t = tester_class(RunningCount())
    t.updateValueState("count", "foo", (5,))
    t.test("foo", [Row(value="q")])
    assert t.peekValueState("count", "foo") == (6,)

    def step(key: str, value: str, state_in: int) -> int:
        t.updateValueState("count", key, (state_in,))
        t.test(key, [Row(value=value)])
        return int(t.peekValueState("count", key)[0])

    assert step("key1", "a", 10) == 11


def test_topk_on_a_list_state(tester_class: Any) -> None:
    t = tester_class(TopK(k=2))
    assert t.test("key1", [Row(score=2.0), Row(score=3.0), Row(score=1.0)]) == [
        Row(key="key1", score=3.0),
        Row(key="key1", score=2.0),
    ]
    assert t.test("key2", [Row(score=s) for s in (10.0, 20.0, 30.0, 40.0)]) == [
        Row(key="key2", score=40.0),
        Row(key="key2", score=30.0),
    ]
    assert t.test("key3", [Row(score=100.0)]) == [Row(key="key3", score=100.0)]
    assert t.peekListState("topK", "key1") == [(3.0,), (2.0,)]
    assert t.peekListState("topK", "key2") == [(40.0,), (30.0,)]
    assert t.peekListState("topK", "key4") == []
    assert t.test("key1", [Row(score=10.0)]) == [Row(key="key1", score=10.0), Row(key="key1", score=3.0)]
    assert t.peekListState("topK", "key1") == [(10.0,), (3.0,)]


def test_topk_pandas(tester_class: Any) -> None:
    t = tester_class(TopK(k=2, use_pandas=True))
    got = t.testInPandas("key1", pd.DataFrame({"score": [2.0, 3.0, 1.0]}))
    pdt.assert_frame_equal(got, pd.DataFrame({"key": ["key1", "key1"], "score": [3.0, 2.0]}), check_like=True)
    got = t.testInPandas("key1", pd.DataFrame({"score": [10.0]}))
    pdt.assert_frame_equal(got, pd.DataFrame({"key": ["key1", "key1"], "score": [10.0, 3.0]}), check_like=True)


def test_direct_access_to_list_state(tester_class: Any) -> None:
    t = tester_class(TopK(k=2))
    t.updateListState("topK", "a", [(6.0,), (5.0,)])
    t.updateListState("topK", "b", [(8.0,), (7.0,)])
    t.test("a", [Row(score=10.0)])
    t.test("b", [Row(score=7.5)])
    t.test("c", [Row(score=1.0)])
    assert t.peekListState("topK", "a") == [(10.0,), (6.0,)]
    assert t.peekListState("topK", "b") == [(8.0,), (7.5,)]
    assert t.peekListState("topK", "c") == [(1.0,)]
    assert t.peekListState("topK", "d") == []


def test_word_frequency_on_a_map_state(tester_class: Any) -> None:
    t = tester_class(WordFrequency())
    got = t.test("user1", [Row(word=w) for w in ("hello", "world", "hello", "world")])
    assert got == [
        Row(key="user1", word=w, count=n) for w, n in (("hello", 1), ("world", 1), ("hello", 2), ("world", 2))
    ]
    t.test("user2", [Row(word="hello"), Row(word="spark")])
    assert t.peekMapState("frequencies", "user1") == {("hello",): (2,), ("world",): (2,)}
    assert t.peekMapState("frequencies", "user2") == {("hello",): (1,), ("spark",): (1,)}
    assert t.peekMapState("frequencies", "user3") == {}
    assert t.test("user1", [Row(word="hello"), Row(word="test")]) == [
        Row(key="user1", word="hello", count=3),
        Row(key="user1", word="test", count=1),
    ]
    assert t.peekMapState("frequencies", "user1") == {("hello",): (3,), ("world",): (2,), ("test",): (1,)}


def test_word_frequency_pandas(tester_class: Any) -> None:
    t = tester_class(WordFrequency(use_pandas=True))
    got = t.testInPandas("user1", pd.DataFrame({"word": ["hello", "world", "hello", "world"]}))
    want = pd.DataFrame({"key": ["user1"] * 4, "word": ["hello", "world", "hello", "world"], "count": [1, 1, 2, 2]})
    pdt.assert_frame_equal(got, want, check_like=True)


def test_direct_access_to_map_state(tester_class: Any) -> None:
    t = tester_class(WordFrequency())
    t.updateMapState("frequencies", "user1", {("hello",): (5,), ("world",): (3,)})
    t.updateMapState("frequencies", "user2", {("spark",): (10,)})
    t.test("user1", [Row(word="hello"), Row(word="goodbye")])
    t.test("user2", [Row(word="spark")])
    t.test("user3", [Row(word="new")])
    assert t.peekMapState("frequencies", "user1") == {("hello",): (6,), ("world",): (3,), ("goodbye",): (1,)}
    assert t.peekMapState("frequencies", "user2") == {("spark",): (11,)}
    assert t.peekMapState("frequencies", "user3") == {("new",): (1,)}
    assert t.peekMapState("frequencies", "user4") == {}


def test_row_by_row(tester_class: Any) -> None:
    t = tester_class(RunningCount())
    keys = ["key1", "key2", "key1", "key2", "key1", "key1", "key3"]
    got = [r for k in keys for r in t.test(k, [Row(value="v")])]
    assert got == [Row(key=k, count=n) for k, n in zip(keys, [1, 1, 2, 2, 3, 4, 1], strict=True)]


def test_initial_state(tester_class: Any) -> None:
    t = tester_class(RunningCount(), initialStateRow=[("a", Row(initial_count=10)), ("b", Row(initial_count=20))])
    assert (t.peekValueState("count", "a"), t.peekValueState("count", "b")) == ((10,), (20,))
    assert t.test("a", [Row(value="a")]) == [Row(key="a", count=11)]
    assert t.test("c", [Row(value="c")]) == [Row(key="c", count=1)]
    p = tester_class(
        RunningCount(use_pandas=True),
        initialStatePandas=[("a", pd.DataFrame({"initial_count": [10]})), ("b", pd.DataFrame({"initial_count": [20]}))],
    )
    assert (p.peekValueState("count", "a"), p.peekValueState("count", "b")) == ((10,), (20,))
    got = p.testInPandas("a", pd.DataFrame({"value": ["a"]}))
    pdt.assert_frame_equal(got, pd.DataFrame({"key": ["a"], "count": [11]}), check_like=True)
    assert tester_class(RunningCount(), initialStateRow=[]).test("k", [Row(value="a")]) == [Row(key="k", count=1)]
    empty = tester_class(RunningCount(use_pandas=True), initialStatePandas=[])
    pdt.assert_frame_equal(
        empty.testInPandas("k", pd.DataFrame({"value": ["a"]})), pd.DataFrame({"key": ["k"], "count": [1]})
    )
    with pytest.raises(AssertionError):
        tester_class(
            RunningCount(),
            initialStateRow=[("a", Row(initial_count=10))],
            initialStatePandas=[("a", pd.DataFrame({"initial_count": [10]}))],
        )


def test_all_state_methods(tester_class: Any) -> None:
    cmds = [
        "value-exists", "value-set", "value-exists", "value-clear", "value-exists",
        "list-exists", "list-append", "list-exists", "list-append-array", "list-get",
        "map-exists", "map-add", "map-exists", "map-keys", "map-values", "map-iterator",
        "map-remove", "map-keys", "map-clear", "map-exists",
    ]  # fmt: skip
    results = [
        "False", "done", "True", "done", "False", "False", "done", "True", "done", "a,b,c,d",
        "False", "done", "True", "x,y,z", "1,2,3", "x=1,y=2,z=3", "done", "x,z", "done", "False",
    ]  # fmt: skip
    got = tester_class(AllMethods()).test("k", [Row(cmd=c) for c in cmds])
    assert got == [Row(key="k", result=f"{c}:{r}") for c, r in zip(cmds, results, strict=True)]


def test_edge_inputs_and_keys(tester_class: Any) -> None:
    t = tester_class(RunningCount())
    assert t.test("key1", []) == [Row(key="key1", count=0)]
    assert t.test("key2", [Row(value=None), Row(value="a")]) == [Row(key="key2", count=2)]
    assert t.test("key@#$%", [Row(value="a")]) == [Row(key="key@#$%", count=1)]
    assert t.peekValueState("count", "nonexistent_key") is None
    numeric = tester_class(RunningCount())
    assert numeric.test(1, [Row(value="a"), Row(value="c")]) == [Row(key=1, count=2)]
    assert numeric.test(2, [Row(value="b")]) == [Row(key=2, count=1)]
    assert tester_class(RunningCount()).test((1, 2), [Row(value="a")] * 2) == [Row(key=(1, 2), count=2)]
    assert tester_class(RunningCount()).test(None, [Row(value="a")] * 2) == [Row(key=None, count=2)]
    p = tester_class(RunningCount(use_pandas=True))
    pdt.assert_frame_equal(
        p.testInPandas(None, pd.DataFrame({"value": ["a", "b"]})), pd.DataFrame({"key": [None], "count": [2]})
    )
    got = p.testInPandas("key1", pd.DataFrame({"value": []}))
    pdt.assert_frame_equal(got, pd.DataFrame({"key": ["key1"], "count": [0]}), check_like=True)
    got = p.testInPandas("key2", pd.DataFrame({"value": ["a", "b", "c"]}))
    pdt.assert_frame_equal(got, pd.DataFrame({"key": ["key2"], "count": [3]}), check_like=True)
    assert got["count"].dtype == "int64"


def test_undeclared_states_and_the_testers_handle(tester_class: Any) -> None:
    t = tester_class(RunningCount())
    with pytest.raises(AssertionError):
        t.updateValueState("nonexistent_state", "key1", (5,))
    with pytest.raises(AssertionError):
        t.peekValueState("nonexistent_state", "key1")
    with pytest.raises(PySparkAssertionError, match="STATE_NOT_EXISTS"):
        t.deleteState("nonexistent_state", "key1")
    t.handle.setGroupingKey("key1")
    t.handle.getValueState("count", "int").clear()
    t.handle.deleteIfExists("nonexistent_state")
    lists, maps = tester_class(TopK(k=2)), tester_class(WordFrequency())
    lists.handle.setGroupingKey("key1")
    lists.handle.getListState("topK", "double").clear()
    maps.handle.setGroupingKey("key1")
    maps.handle.getMapState("frequencies", "string", "int").clear()
    for call in (lambda: t.handle.registerTimer(12345), lambda: t.handle.deleteTimer(1), t.handle.listTimers):
        with pytest.raises(PySparkValueError, match="UNSUPPORTED_OPERATION"):
            list(call() or [])


def test_init_runs_once(tester_class: Any) -> None:
    calls = []

    class Counting(RunningCount):
        def init(self, handle: Any) -> None:
            calls.append(1)
            super().init(handle)

    t = tester_class(Counting())
    t.test("key1", [Row(value="a")])
    t.test("key1", [Row(value="b")])
    assert calls == [1]


def test_delete_state(tester_class: Any) -> None:
    t = tester_class(RunningCount())
    t.updateValueState("count", "key1", (10,))
    t.updateValueState("count", "key2", (20,))
    t.deleteState("count", "key1")
    assert (t.peekValueState("count", "key1"), t.peekValueState("count", "key2")) == (None, (20,))
    lists = tester_class(TopK(k=3))
    lists.updateListState("topK", "key1", [(1.0,), (2.0,), (3.0,)])
    lists.updateListState("topK", "key2", [(4.0,), (5.0,)])
    assert lists.peekListState("topK", "key1") == [(1.0,), (2.0,), (3.0,)]
    lists.deleteState("topK", "key1")
    assert (lists.peekListState("topK", "key1"), lists.peekListState("topK", "key2")) == ([], [(4.0,), (5.0,)])
    maps = tester_class(WordFrequency())
    maps.updateMapState("frequencies", "user1", {("hello",): (5,), ("world",): (3,)})
    maps.updateMapState("frequencies", "user2", {("spark",): (10,)})
    maps.deleteState("frequencies", "user1")
    assert (maps.peekMapState("frequencies", "user1"), maps.peekMapState("frequencies", "user2")) == (
        {},
        {("spark",): (10,)},
    )


def test_processing_time_timers(tester_class: Any) -> None:
    t = tester_class(SessionTimeout(), timeMode="ProcessingTime")
    assert t.test("key1", [Row(value="hello")]) == [Row(key="key1", result="received:hello")]
    assert t.setProcessingTime(5000) == []
    assert t.test("key2", [Row(value="world")]) == [Row(key="key2", result="received:world")]
    assert t.setProcessingTime(11000) == [Row(key="key1", result="session-expired")]
    assert t.setProcessingTime(16000) == [Row(key="key2", result="session-expired")]
    assert (t.peekValueState("lastSeen", "key1"), t.peekValueState("lastSeen", "key2")) == (None, None)


def test_processing_time_timers_pandas(tester_class: Any) -> None:
    t = tester_class(SessionTimeout(use_pandas=True), timeMode="ProcessingTime")
    got = t.testInPandas("key1", pd.DataFrame({"value": ["hello"]}))
    pdt.assert_frame_equal(got, pd.DataFrame({"key": ["key1"], "result": ["received:hello"]}), check_like=True)
    assert len(t.setProcessingTime(5000)) == 0
    t.testInPandas("key2", pd.DataFrame({"value": ["world"]}))
    expired = t.setProcessingTime(11000)
    pdt.assert_frame_equal(expired, pd.DataFrame({"key": ["key1"], "result": ["session-expired"]}), check_like=True)
    expired = t.setProcessingTime(16000)
    pdt.assert_frame_equal(expired, pd.DataFrame({"key": ["key2"], "result": ["session-expired"]}), check_like=True)
    assert t.peekValueState("lastSeen", "key2") is None


def test_event_time_timers_by_the_watermark(tester_class: Any) -> None:
    t = tester_class(EventTimeSession(), timeMode="EventTime", eventTimeExtractor=event_ms)
    assert t.test("key1", [Row(event_time_ms=10000, value="hello")]) == [Row(key="key1", result="received:hello@10000")]
    assert t.test("key2", [Row(event_time_ms=11000, value="world")]) == [Row(key="key2", result="received:world@11000")]
    assert t.setWatermark(15000) == [Row(key="key1", result="session-expired@watermark=15000")]
    assert t.setWatermark(16000) == [Row(key="key2", result="session-expired@watermark=16000")]
    assert (t.peekValueState("lastEventTime", "key1"), t.peekValueState("lastEventTime", "key2")) == (None, None)


def test_late_rows_are_dropped(tester_class: Any) -> None:
    t = tester_class(EventTimeCount(), timeMode="EventTime", eventTimeExtractor=event_ms)
    assert t.test("key1", [Row(event_time_ms=ms, value="v") for ms in (5000, 6000, 7000)]) == [Row(key="key1", count=3)]
    t.setWatermark(6000)
    assert t.test("key1", [Row(event_time_ms=ms, value="v") for ms in (4000, 5000, 6000, 8000)]) == [
        Row(key="key1", count=4)
    ]
    assert t.peekValueState("count", "key1") == (4,)
    s = tester_class(EventTimeSession(), timeMode="EventTime", eventTimeExtractor=event_ms)
    s.setWatermark(20000)
    got = s.test("key1", [Row(event_time_ms=10000, value="late"), Row(event_time_ms=25000, value="ontime")])
    assert got == [Row(key="key1", result="received:ontime@25000")]


def test_late_rows_pandas(tester_class: Any) -> None:
    t = tester_class(RunningCount(use_pandas=True), timeMode="EventTime", eventTimeExtractor=event_ms)
    t.setWatermark(6000)
    got = t.testInPandas("k", pd.DataFrame({"event_time_ms": [5000, 6000, 7000, 9000], "value": list("abcd")}))
    pdt.assert_frame_equal(got, pd.DataFrame({"key": ["k"], "count": [2]}), check_like=True)


def test_time_errors(tester_class: Any) -> None:
    none = tester_class(RunningCount(), timeMode="None")
    with pytest.raises(PySparkValueError, match="UNSUPPORTED_OPERATION"):
        none.setProcessingTime(1000)
    with pytest.raises(PySparkValueError, match="UNSUPPORTED_OPERATION"):
        none.setWatermark(1000)
    with pytest.raises(PySparkValueError, match="UNSUPPORTED_OPERATION"):
        tester_class(RunningCount(), timeMode="ProcessingTime").setWatermark(1000)
    with pytest.raises(PySparkValueError, match="ARGUMENT_REQUIRED"):
        tester_class(RunningCount(), timeMode="EventTime")
    pt = tester_class(RunningCount(), timeMode="ProcessingTime")
    pt.setProcessingTime(1000)
    for ms in (1000, 500):
        with pytest.raises(IllegalArgumentException):
            pt.setProcessingTime(ms)
    et = tester_class(RunningCount(), timeMode="EventTime", eventTimeExtractor=event_ms)
    et.setWatermark(1000)
    for ms in (1000, 500):
        with pytest.raises(IllegalArgumentException):
            et.setWatermark(ms)


# -- where ours follows the real operator, not PySpark's tester ------------------------------------------
class Ttl(StatefulProcessor):
    """Counts per key in a ValueState, and keeps the inputs in a ListState and a MapState, all with a 10 s TTL."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long", 10_000)
        self.seen = handle.getListState("seen", "v string", 10_000)
        self.last = handle.getMapState("last", "v string", "at long", 10_000)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        now = timerValues.getCurrentProcessingTimeInMs()
        n = self.count.get()[0] if self.count.exists() else 0
        for row in rows:
            n += 1
            self.seen.appendValue((row.v,))
            self.last.updateValue((row.v,), (now,))
        self.count.update((n,))
        yield Row(key=key[0], count=n)


def test_ttl_expires_with_processing_time() -> None:
    mine = StatekeeperTwsTester(Ttl(), timeMode="ProcessingTime")
    theirs = PySparkTwsTester(Ttl(), timeMode="ProcessingTime")
    for t in (mine, theirs):
        assert t.test("k", [Row(v="a")]) == [Row(key="k", count=1)]  # written at 0: expires at 10 s
        t.setProcessingTime(6000)
        assert t.test("k", [Row(v="b")]) == [Row(key="k", count=2)]  # count rewritten: 16 s; "b" expires at 16 s
    assert mine.peekListState("seen", "k") == [("a",), ("b",)]
    mine.setProcessingTime(10_000)  # "a" (list element and map entry) expired and evicted; the count lives on
    assert mine.peekValueState("count", "k") == (2,)
    assert mine.peekListState("seen", "k") == [("b",)]
    assert mine.peekMapState("last", "k") == {("b",): (6000,)}
    mine.setProcessingTime(16_000)
    assert (mine.peekValueState("count", "k"), mine.peekListState("seen", "k"), mine.peekMapState("last", "k")) == (
        None,
        [],
        {},
    )
    assert mine.test("k", [Row(v="c")]) == [Row(key="k", count=1)]  # starts over
    theirs.setProcessingTime(100_000)  # PySpark's tester ignores the TTL
    assert theirs.peekValueState("count", "k") == (2,)
    assert theirs.peekListState("seen", "k") == [("a",), ("b",)]


def test_ttl_outside_processing_time_is_refused_as_the_operator_refuses_it() -> None:
    with pytest.raises(PySparkRuntimeError, match="STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL"):
        StatekeeperTwsTester(Ttl(), timeMode="None")
    PySparkTwsTester(Ttl(), timeMode="None")  # accepted, the TTL ignored


def test_a_timer_at_or_before_the_watermark_registers_and_fires() -> None:
    with pytest.raises(IllegalArgumentException):  # PySpark's tester refuses it
        theirs = PySparkTwsTester(EventTimeSession(), timeMode="EventTime", eventTimeExtractor=event_ms)
        theirs.setWatermark(10000)
        theirs.handle.setGroupingKey("key1")
        theirs.handle.registerTimer(10000)
    t = StatekeeperTwsTester(EventTimeSession(), timeMode="EventTime", eventTimeExtractor=event_ms)
    t.setWatermark(10000)
    t.handle.setGroupingKey("key1")
    t.handle.registerTimer(10000)  # the operator takes it: it fires in the next batch
    t.handle.registerTimer(5000)
    assert list(t.handle.listTimers()) == [10000, 5000]  # Spark's store order (little-endian longs), not sorted
    assert t.setWatermark(10001) == [Row(key="key1", result="session-expired@watermark=10001")] * 2


class DueNow(StatefulProcessor):
    """Registers a timer at the batch's own time: due in the batch that registers it."""

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs())
        yield Row(key=key[0], what="input", watermark=timerValues.getCurrentWatermarkInMs())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        yield Row(key=key[0], what="timer", watermark=expiredTimerInfo.getExpiryTimeInMs())


def test_a_timer_due_in_its_batch_fires_after_the_input() -> None:
    theirs = PySparkTwsTester(DueNow(), timeMode="ProcessingTime")
    assert theirs.test("k", [Row(v=1)]) == [Row(key="k", what="input", watermark=-1)]
    mine = StatekeeperTwsTester(DueNow(), timeMode="ProcessingTime")
    # the operator's batch: input, then the timers due (here the one just registered); watermark 0, as Spark's
    assert mine.test("k", [Row(v=1)]) == [
        Row(key="k", what="input", watermark=0),
        Row(key="k", what="timer", watermark=0),
    ]


def test_late_row_rule_is_the_operators_a_null_event_time_is_kept() -> None:
    t = StatekeeperTwsTester(EventTimeCount(), timeMode="EventTime", eventTimeExtractor=lambda r: r.event_time_ms)
    t.setWatermark(6000)
    assert t.test("k", [Row(event_time_ms=None), Row(event_time_ms=5000), Row(event_time_ms=7000)]) == [
        Row(key="k", count=2)
    ]
    theirs = PySparkTwsTester(EventTimeCount(), timeMode="EventTime", eventTimeExtractor=lambda r: r.event_time_ms)
    with pytest.raises(TypeError):
        theirs.test("k", [Row(event_time_ms=None)])


def test_state_is_typed_and_stored_in_a_real_store() -> None:
    t = StatekeeperTwsTester(RunningCount())
    t.test("a", [Row(value="x")])
    before = t.store.version or 0
    with pytest.raises(Exception, match=r"integer|int"):
        t.updateValueState("count", "a", ("not a number",))  # the schema's codec refuses it
    assert t.store.version == before and t.peekValueState("count", "a") == (1,)
    with pytest.raises(ValueError, match="the tester's keys have one type"):
        t.test(5, [Row(value="x")])  # the first key fixed the key's type: string
    assert t.peekValueState("count", 5) is None  # no such key can be stored
    t.updateValueState("count", "b", (7,))
    assert t.store.version == before + 1  # one committed version per call
    assert t.store.commit_log.get(before + 1) is not None
    t.close()


class FailsOnBoom(RunningCount):
    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        rows = list(rows)
        yield from super().handleInputRows(key, iter(rows), timerValues)
        if any(r.value == "boom" for r in rows):
            raise ValueError("boom")


def test_a_failing_call_is_an_aborted_batch() -> None:
    mine, theirs = StatekeeperTwsTester(FailsOnBoom()), PySparkTwsTester(FailsOnBoom())
    for t in (mine, theirs):
        t.test("k", [Row(value="a")])
        with pytest.raises(ValueError, match="boom"):
            t.test("k", [Row(value="boom")])
    assert mine.peekValueState("count", "k") == (1,)  # the operator's failed batch leaves no trace
    assert theirs.peekValueState("count", "k") == (2,)  # PySpark's tester keeps the half-done update
    assert mine.test("k", [Row(value="b")]) == [Row(key="k", count=2)]


class Appender(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.items = handle.getListState("items", "v string")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        for row in rows:
            self.items.appendValue((row.v,))
            if row.v == "boom":
                raise ValueError("boom")
        yield Row(key=key[0], items=len(list(self.items.get())))


def test_an_aborted_first_batch_records_the_key_schema_again() -> None:
    t = StatekeeperTwsTester(FailsOnBoom())
    with pytest.raises(ValueError, match="boom"):
        t.test("k", [Row(value="boom")])  # the key's type was recorded in the aborted attempt
    t.test("k", [Row(value="a")])
    view = StateView(t.store)  # a reader of the checkpoint decodes the keys: the key's type is recorded
    assert [(key, value) for key, _, value, _ in view.rows("count")] == [(("k",), (1,))]


def test_an_aborted_batch_drops_list_appends_held_in_memory() -> None:
    t = StatekeeperTwsTester(Appender())
    t.test("k", [Row(v="a")])
    with pytest.raises(ValueError, match="boom"):
        t.test("k", [Row(v="b"), Row(v="boom")])
    assert t.test("j", [Row(v="c")]) == [Row(key="j", items=1)]
    assert t.peekListState("items", "k") == [("a",)]
