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
from collections.abc import Callable, Iterable, Iterator
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
    methods with explicit keys (tuples of grouping values, see :func:`statekeeper.store.spark.keys_of`; a column's
    values as Python objects: :func:`statekeeper.store.spark.values_of`).
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


def values_of(table: pa.Table, column: str) -> list[Any]:
    """The Python values of `table`'s `column`, as ``to_pylist()`` gives them, ~15x faster for numbers and
    booleans without nulls, strings and binaries (through NumPy: ``to_pylist`` makes an Arrow scalar per value)."""
    from statekeeper.store.spark.task_input import pylist

    return pylist(table.column(column))


_UNREAD: Any = object()


class GroupState:
    """The ``state`` argument of an ``applyInPandasWithState`` function, on a ValueState and timers.

    One per call: the value is read from the store once (``exists`` then ``get``, the usual pair, is
    one read) and again only after ``update``. `on_timer` is told when a timeout is set."""

    def __init__(
        self,
        value: Any,
        handle: StatefulProcessorHandle,
        timer_values: TimerValues,
        timed_out: bool,
        on_timer: Callable[[], None] | None = None,
    ) -> None:
        self._value = value
        self._handle = handle
        self._timer_values = timer_values
        self._timed_out = timed_out
        self._on_timer = on_timer
        self._current = _UNREAD

    def _read(self) -> Any:
        if self._current is _UNREAD:
            self._current = self._value.get()
        return self._current

    @property
    def exists(self) -> bool:
        return self._read() is not None

    @property
    def get(self) -> tuple[Any, ...]:
        v = self._read()
        if v is None:
            raise ValueError("state is not set: check state.exists first")
        return v  # type: ignore[no-any-return]

    @property
    def getOption(self) -> tuple[Any, ...] | None:
        return self._read()  # type: ignore[no-any-return]

    @property
    def hasTimedOut(self) -> bool:
        return self._timed_out

    def update(self, newValue: tuple[Any, ...]) -> None:
        self._value.update(tuple(newValue))
        self._current = _UNREAD  # read back as stored (its schema's types)

    def remove(self) -> None:
        self._value.clear()
        self._current = None

    def _set_timer(self, expiry_ms: int) -> None:
        for t in list(self._handle.listTimers()):
            self._handle.deleteTimer(t)
        self._handle.registerTimer(expiry_ms)
        if self._on_timer is not None:
            self._on_timer()

    def setTimeoutDuration(self, durationMs: int) -> None:
        """Processing-time timeout: the function is called with no rows once it passes without data."""
        self._set_timer(self._timer_values.getCurrentProcessingTimeInMs() + int(durationMs))

    def setTimeoutTimestamp(self, timestampMs: int) -> None:
        """Event-time timeout (operator ``time_mode="EventTime"``): fires once the watermark reaches it."""
        self._set_timer(int(timestampMs))

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
        self._timers: bool | None = None
        """Whether a key may hold a timer: unknown until the first key; false while the partition holds
        none (no timer lookup per key then), true once it held one or a timeout was set."""

    def _timer_set(self) -> None:
        self._timers = True

    def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues) -> Iterable[Any]:
        if self._timers is None:
            self._timers = self._handle.has_any_timer()
        if self._timers:  # data arrived: the pending timeout no longer applies
            for t in list(self._handle.listTimers()):
                self._handle.deleteTimer(t)
        state = GroupState(self._value, self._handle, timerValues, False, self._timer_set)
        return self.func(key, rows, state)  # type: ignore[no-any-return]

    def handleExpiredTimer(
        self, key: tuple[Any, ...], timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterable[Any]:
        state = GroupState(self._value, self._handle, timerValues, True, self._timer_set)
        return self.func(key, iter(()), state)  # type: ignore[no-any-return]


__all__ = [
    "ApplyInPandasWithState",
    "BatchStatefulProcessor",
    "ExpiredTimerInfo",
    "GroupState",
    "StatefulProcessor",
    "TimerValues",
    "keys_of",
    "values_of",
]
