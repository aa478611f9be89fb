"""transformWithState semantics through TwsTester (no Spark): event time, watermarks, late rows, timers
per time mode, initial state; and a model-based test of event-time timers (each fires once, in time
order, only when the watermark reaches it)."""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.spark import StatefulProcessor, StatefulProcessorHandle, TimerValues
from statekeeper.store.spark.api import ExpiredTimerInfo
from statekeeper.store.spark.event_time import next_watermark, parse_delay_ms
from statekeeper.store.spark.handle import HandleStateError
from statekeeper.store.spark.testing import TwsTester
from statekeeper.store.spark.time_mode import TimeMode
from tests.spark.tws_processors import OUTPUT, Sessions, pyspark_sessions

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
T0_MS = int(T0.timestamp() * 1000)


def _ev(user: str, seconds: float, page: str = "p") -> dict[str, Any]:
    return {"user": user, "page": page, "ts": T0 + dt.timedelta(seconds=seconds)}


def test_delays_and_time_modes_parse_like_pyspark() -> None:
    assert parse_delay_ms("10 seconds") == 10_000
    assert parse_delay_ms("interval 1 minute 30 seconds") == 90_000
    assert parse_delay_ms(250) == 250
    assert TimeMode.parse("eventtime") is TimeMode.EVENT_TIME
    with pytest.raises(ConfigurationError, match="10 sekunden"):
        parse_delay_ms("10 sekunden")
    with pytest.raises(ConfigurationError, match="timeMode"):
        TimeMode.parse("Event")


def test_watermark_never_goes_back() -> None:
    assert next_watermark(5000, 4000, 1000) == 5000
    assert next_watermark(5000, 9000, 1000) == 8000
    assert next_watermark(5000, None, 1000) == 5000


def test_event_time_sessions_watermark_late_rows_and_initial_state() -> None:
    with TwsTester(
        Sessions(),
        "user",
        OUTPUT,
        time_mode="EventTime",
        event_time_column="ts",
        watermark_delay="5 seconds",
        initial_state=[{"user": "u1", "n": 100}, {"user": "u9", "n": 7}],
    ) as t:
        out = t.run([_ev("u1", 0), _ev("u2", 1)])
        assert out == [("u1", "input", 101, 1, 0, -1), ("u2", "input", 1, 1, 0, -1)]
        assert t.value_state("count") == {("u1",): (101,), ("u2",): (1,), ("u9",): (7,)}
        assert sorted(t.timers()) == [(("u1",), T0_MS + 5000), (("u2",), T0_MS + 6000)]
        # batch 1 runs with watermark max(1 s) - 5 s; nothing fires yet
        assert t.run([_ev("u3", 20)]) == [("u3", "input", 1, 1, T0_MS - 4000, -1)]
        # batch 2: u1's event at 2 s moves its timer to 7 s; watermark 15 s fires u2 (6 s) then u1 (7 s),
        # in time order, after the input rows
        out = t.run([_ev("u1", 2), _ev("u4", 21)])
        wm = T0_MS + 15_000
        assert out[2:] == [("u2", "timer", 1, 1, wm, T0_MS + 6000), ("u1", "timer", 102, 1, wm, T0_MS + 7000)]
        assert t.last_metrics is not None and t.last_metrics.timers_fired == 2
        # batch 3: a row at 10 s is at or before the previous watermark (15 s): late, dropped and counted
        assert t.run([_ev("u5", 10)]) == []
        assert t.last_metrics is not None and t.last_metrics.late_rows == 1
        assert "u5" not in {k[0] for k in t.value_state("count")}
        assert t.map_state("pages")[("u3",)] == {("p",): (1,)}


class _TimerEcho(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        for r in rows:
            self.handle.registerTimer(r.at)
        yield (key[0], timerValues.getCurrentProcessingTimeInMs(), timerValues.getCurrentWatermarkInMs(), -1)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo) -> Any:
        yield (key[0], timerValues.getCurrentProcessingTimeInMs(), -1, expiredTimerInfo.getExpiryTimeInMs())


ECHO = "k string, now long, watermark long, fired long"


def test_processing_time_timers_follow_the_batch_time() -> None:
    with TwsTester(_TimerEcho(), "k", ECHO, time_mode="ProcessingTime") as t:
        # the watermark without event time is 0, as Spark's TimerValues give it in ProcessingTime
        assert t.run([{"k": "a", "at": 1500}], processing_time_ms=1000) == [("a", 1000, 0, -1)]
        assert t.run([{"k": "b", "at": 9000}], processing_time_ms=1400) == [("b", 1400, 0, -1)]
        assert t.run([], processing_time_ms=2000) == [("a", 2000, -1, 1500)]
        assert t.timers() == [(("b",), 9000)]


def test_time_mode_none_has_no_timers_and_no_times() -> None:
    with TwsTester(_TimerEcho(), "k", ECHO, time_mode="None") as t, pytest.raises(HandleStateError, match="NoTime"):
        t.run([{"k": "a", "at": 1}], processing_time_ms=1000)


class _Seed(StatefulProcessor):
    """Pandas flavour: initial state arrives as one DataFrame per key."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.total = handle.getValueState("total", "v long")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        self.total.update((int(initialState["v"].sum()),))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        pd = importlib.import_module("pandas")
        total = (self.total.get() or (0,))[0] + sum(int(f["v"].sum()) for f in rows)
        self.total.update((total,))
        yield pd.DataFrame({"k": [key[0]], "total": [total]})


def test_pandas_initial_state_only_in_the_first_batch() -> None:
    pd = importlib.import_module("pandas")

    seed = pd.DataFrame({"k": ["a", "a", "b"], "v": [10, 5, 1]})
    with TwsTester(_Seed(), "k", "k string, total long", input_format="pandas", initial_state=seed) as t:
        assert t.run(pd.DataFrame({"k": ["a"], "v": [1]})) == [("a", 16)]
        assert t.run(pd.DataFrame({"k": ["b"], "v": [1]})) == [("b", 2)]
        assert t.value_state("total") == {("a",): (16,), ("b",): (2,)}


@settings(max_examples=10, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 60)), max_size=4), st.integers(0, 20)),
        min_size=1,
        max_size=6,
    )
)
def test_event_time_timers_fire_once_in_order_when_the_watermark_reaches_them(
    batches: list[tuple[list[tuple[str, int]], int]],
) -> None:
    """Model: a set of pending (key, time) timers. Each batch registers its timers, then every pending
    timer at or before the batch's watermark fires exactly once, in time order; the rest stay."""
    far = 10**9
    pending = {("a", far)}
    watermark = 0
    with TwsTester(_TimerEcho(), "k", ECHO, time_mode="EventTime") as t:
        t.run([{"k": "a", "at": far}], watermark_ms=watermark)  # the first batch fixes the input columns
        for timers, step in batches:
            watermark += step
            out = t.run([{"k": k, "at": at} for k, at in timers], watermark_ms=watermark)
            pending.update(timers)
            due = {p for p in pending if p[1] <= watermark}
            fired = [(k, f) for k, _, _, f in out if f >= 0]
            assert sorted(fired) == sorted(due)  # each due timer once, no other
            assert [f for _, f in fired] == sorted(f for _, f in fired)  # in time order
            assert all(wm == watermark for _, _, wm, f in out if f < 0)
            pending -= due
        assert sorted((k[0], at) for k, at in t.timers()) == sorted(pending)


def test_pyspark_options_we_lack_raise_naming_them(tmp_path: Any) -> None:
    from statekeeper.store.spark import StatefulOperator

    root = (tmp_path / "state").as_uri()
    with pytest.raises(NotImplementedError, match="eventTimeColumnName"):
        StatefulOperator(root, "op", "user", Sessions(), OUTPUT, eventTimeColumnName="ts")
    with pytest.raises(NotImplementedError, match="Complete"):
        StatefulOperator(root, "op", "user", Sessions(), OUTPUT, output_mode="Complete")
    with pytest.raises(ConfigurationError, match="go together"):
        StatefulOperator(root, "op", "user", Sessions(), OUTPUT, event_time_column="ts")
    with pytest.raises(ConfigurationError, match=r"pyspark\.sql\.streaming\.StatefulProcessor, got dict"):
        StatefulOperator(root, "op", "user", {}, OUTPUT)  # type: ignore[arg-type]
    StatefulOperator(root, "op", "user", pyspark_sessions(), OUTPUT)  # PySpark's own processor is accepted


@pytest.mark.parametrize("input_format", ["rows", "pandas"])
def test_a_batch_larger_than_the_task_budget_in_any_order_runs(input_format: str) -> None:
    """A batch past the task input budget (cut into chunks between keys) in any key order: the tester sorts it
    as a task sorts its input, so every key's rows reach one call (it failed naming the budget)."""
    from testkit.processors import CountSum, CountSumPandas

    keys = [f"user{(i * 7919) % 5000:05d}" for i in range(150_000)]  # every key's rows spread over the whole batch
    rows: list[dict[str, Any]] = [{"user": k, "value": i % 10} for i, k in enumerate(keys)]
    proc = CountSum() if input_format == "rows" else CountSumPandas(schema="count long, total long")
    schema = "user string, count long, total long"
    with TwsTester(proc, key="user", output_schema=schema, input_format=input_format) as t:
        out = t.run(rows)
        expected: dict[str, tuple[int, int]] = {}
        for r in rows:
            c, s = expected.get(r["user"], (0, 0))
            expected[r["user"]] = (c + 1, s + r["value"])
        assert len(out) == len(expected)  # one output row per key: no key's rows split over calls
        assert {u: (c, s) for u, c, s in out} == expected
        assert t.value_state("totals") == {(u,): v for u, v in expected.items()}
