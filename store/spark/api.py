"""The user-facing processor API, shaped after PySpark's ``StatefulProcessor``.

A ``transformWithState`` processor (PySpark's own class, or this one) runs unchanged: it has ``init``,
``handleInputRows`` (per grouping key), optional ``handleExpiredTimer`` and ``close``; the handle gives
``getValueState`` / ``getListState`` / ``getMapState`` (with ``ttlDurationMs``) and processing-time timers.
``BatchStatefulProcessor`` is the vectorized variant: one call per partition with the whole batch as an
Arrow table, and bulk state access (``getMany`` / ``updateMany`` / ``clearMany``).
"""

# ruff: noqa: N802, N803 - method and argument names follow PySpark's StatefulProcessor API

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from statekeeper.store.spark.handle import StatefulProcessorHandle


class TimerValues:
    """Time of the current batch: the processing time is fixed per batch (the same on a re-run)."""

    __slots__ = ("_processing_ms", "_watermark_ms")

    def __init__(self, currentProcessingTimeInMs: int = -1, currentWatermarkInMs: int = -1) -> None:
        self._processing_ms = currentProcessingTimeInMs
        self._watermark_ms = currentWatermarkInMs

    def getCurrentProcessingTimeInMs(self) -> int:
        return self._processing_ms

    def getCurrentWatermarkInMs(self) -> int:
        """The batch's event-time watermark (timeMode "EventTime" or a declared event-time column), else -1."""
        return self._watermark_ms

    def __repr__(self) -> str:
        return f"TimerValues(processing={self._processing_ms}, watermark={self._watermark_ms})"


class ExpiredTimerInfo:
    __slots__ = ("_expiry_ms",)

    def __init__(self, expiryTimeInMs: int = -1) -> None:
        self._expiry_ms = expiryTimeInMs

    def getExpiryTimeInMs(self) -> int:
        return self._expiry_ms


class StatefulProcessor(ABC):
    """Arbitrary stateful logic per grouping key.

    With ``input_format="rows"`` (default) ``handleInputRows`` gets an iterator of
    :class:`pyspark.sql.Row` and yields rows (``Row``, tuple in output-schema order, or dict); with
    ``input_format="pandas"`` it gets an iterator of ``pandas.DataFrame`` and yields DataFrames, as in
    ``transformWithStateInPandas``. ``key`` is the tuple of grouping values.

    One instance is deserialized per partition task; ``init`` runs before the partition's rows and
    ``close`` after its state is committed.
    """

    @abstractmethod
    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables (``handle.getValueState(...)`` etc.)."""

    @abstractmethod
    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterable[Any]:
        """Process the rows of one key in this batch; return or yield output rows."""

    def handleExpiredTimer(
        self, key: tuple[Any, ...], timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterable[Any]:
        """Called for each expired timer of `key` (at or before the batch time in ProcessingTime, the
        watermark in EventTime), in time order, after the batch's input rows; each fires once."""
        return ()

    def handleInitialState(  # noqa: B027 - optional hook, as in PySpark
        self, key: tuple[Any, ...], initialState: Any, timerValues: TimerValues
    ) -> None:
        """First batch only, before its input rows: one call per initial-state ``Row`` of `key` (a
        ``pandas.DataFrame`` of the key's rows with ``input_format="pandas"``). Output is not taken."""

    def close(self) -> None:  # noqa: B027 - optional hook, as in PySpark
        """Called once per partition task, after the state is committed."""


class BatchStatefulProcessor(ABC):
    """Vectorized stateful logic: one call per partition with the batch's rows (several for large batches).

    ``handleBatch`` gets the partition's rows of this batch as a ``pyarrow.Table`` (every row of a key
    is in the same call; a partition's input larger than ``task_input_budget_bytes`` comes in several
    calls, cut between keys, so memory stays bounded) and returns its output as a ``pyarrow.Table``, ``RecordBatch``,
    ``pandas.DataFrame``, an iterable of those, or None. State variables are used through their bulk
    methods with explicit keys (tuples of grouping values, see :func:`statekeeper.store.spark.keys_of`).
    """

    @abstractmethod
    def init(self, handle: StatefulProcessorHandle) -> None: ...

    @abstractmethod
    def handleBatch(self, rows: pa.Table, timerValues: TimerValues) -> pa.Table | pa.RecordBatch | Iterable[Any] | Any:
        """Return the output: Arrow table / record batch, pandas DataFrame, an iterable of those, or None."""

    def close(self) -> None:  # noqa: B027 - optional hook, as in PySpark
        """Called once per partition task, after the state is committed."""


def keys_of(table: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    """The grouping-key tuples of every row of `table` (the form state variables take as keys)."""
    from statekeeper.store.spark.task_input import pylist

    return list(zip(*(pylist(table.column(c)) for c in columns), strict=True))


class GroupState:
    """The ``state`` argument of an ``applyInPandasWithState`` function, on a ValueState and timers."""

    def __init__(self, value: Any, handle: StatefulProcessorHandle, timer_values: TimerValues, timed_out: bool) -> None:
        self._value = value
        self._handle = handle
        self._timer_values = timer_values
        self._timed_out = timed_out

    @property
    def exists(self) -> bool:
        return bool(self._value.exists())

    @property
    def get(self) -> tuple[Any, ...]:
        v = self._value.get()
        if v is None:
            raise ValueError("state is not set: check state.exists first")
        return v  # type: ignore[no-any-return]

    @property
    def getOption(self) -> tuple[Any, ...] | None:
        return self._value.get()  # type: ignore[no-any-return]

    @property
    def hasTimedOut(self) -> bool:
        return self._timed_out

    def update(self, newValue: tuple[Any, ...]) -> None:
        self._value.update(tuple(newValue))

    def remove(self) -> None:
        self._value.clear()

    def setTimeoutDuration(self, durationMs: int) -> None:
        """Processing-time timeout: the function is called with no rows once it passes without data."""
        for t in list(self._handle.listTimers()):
            self._handle.deleteTimer(t)
        self._handle.registerTimer(self._timer_values.getCurrentProcessingTimeInMs() + int(durationMs))

    def setTimeoutTimestamp(self, timestampMs: int) -> None:
        """Event-time timeout (operator ``time_mode="EventTime"``): fires once the watermark reaches it."""
        for t in list(self._handle.listTimers()):
            self._handle.deleteTimer(t)
        self._handle.registerTimer(int(timestampMs))

    def getCurrentProcessingTimeMs(self) -> int:
        return self._timer_values.getCurrentProcessingTimeInMs()

    def getCurrentWatermarkMs(self) -> int:
        return self._timer_values.getCurrentWatermarkInMs()


class ApplyInPandasWithState(StatefulProcessor):
    """Runs an ``applyInPandasWithState`` function ``func(key, Iterator[pd.DataFrame], state)`` unchanged.

    Use with ``input_format="pandas"``. The group state is a ValueState named `state_name`;
    ``setTimeoutDuration`` maps to a processing-time timer (on expiry the function gets no rows and
    ``state.hasTimedOut`` is true). Keys on which every row of a batch arrives in one DataFrame.
    """

    def __init__(self, func: Any, state_name: str = "group_state") -> None:
        self.func = func
        self.state_name = state_name

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._handle = handle
        self._value = handle.getValueState(self.state_name)

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterable[Any]:
        for t in list(self._handle.listTimers()):  # data arrived: the pending timeout no longer applies
            self._handle.deleteTimer(t)
        return self.func(key, rows, GroupState(self._value, self._handle, timerValues, False))  # type: ignore[no-any-return]

    def handleExpiredTimer(
        self, key: tuple[Any, ...], timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterable[Any]:
        return self.func(key, iter(()), GroupState(self._value, self._handle, timerValues, True))  # type: ignore[no-any-return]


__all__ = [
    "ApplyInPandasWithState",
    "BatchStatefulProcessor",
    "ExpiredTimerInfo",
    "GroupState",
    "StatefulProcessor",
    "TimerValues",
    "keys_of",
]
