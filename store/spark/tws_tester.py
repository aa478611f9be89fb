"""PySpark's ``TwsTester`` (``pyspark.sql.streaming.tws_tester``), on statekeeper's real store.

Same constructor, methods, argument forms, return shapes and errors as PySpark's, so a suite written for PySpark's
tester runs on this one by changing its import. The difference is where the state lives: not in Python dicts but in
a real :class:`~store.StateStore` (RocksDB) under a temporary checkpoint root, written through the very
``StatefulProcessorHandle`` and state variables the operator's tasks use (store/spark/handle.py, state_variables.py):
typed schemas and their codec, schema records, TTL, timers. A processor's unit tests then exercise what it runs on.

Versions: one store version is always open. Each call that may change state -- the constructor (``init``, then
``handleInitialState``), ``test`` / ``testInPandas``, ``setProcessingTime``, ``setWatermark``, ``update*State``,
``deleteState`` -- ends as a micro-batch ends: held list appends written, expired TTL rows evicted, the row count
saved, the version committed (with its commit record), and the next one opened. ``peek*State`` read the open version.
A call that raises is aborted, as a failed batch is: its state changes are gone. ``tester.handle`` (what PySpark's
tests reach for: ``setGroupingKey``, timers, variables) writes into the open version, committed by the next call.

Where PySpark's in-memory tester departs from the real operator, this one follows the operator:

- TTL is enforced: a value with ``ttlDurationMs`` expires at write time + TTL (processing time), reads hide it once
  the processing time reaches it, and ``setProcessingTime`` evicts it (PySpark's tester keeps it forever). A TTL
  outside timeMode "ProcessingTime" is refused at ``init``, as the operator refuses it.
- An event-time timer at or before the watermark registers (PySpark's tester raises ``IllegalArgumentException``):
  it fires at the next firing, as the operator fires it.
- ``test`` is one micro-batch of one key: after the input, timers already due (at the processing time, or the
  watermark) fire and their output follows the input's, as in the operator's batch; PySpark's tester fires timers
  only in ``setProcessingTime`` / ``setWatermark``.
- Late rows: a row whose event time is at or before the watermark is dropped with the operator's rule
  (`event_time.drop_late`): an event time of None is kept, not compared.
- In timeMode "ProcessingTime" ``TimerValues`` carries watermark 0, as the operator's (PySpark's tester: -1).
- A call that raises is an aborted batch: its state changes are gone (PySpark's tester keeps what the processor
  wrote before it raised).
- State is typed: values go through the declared schema's codec (a value it cannot hold is refused) and come back
  as it reads them (an ``int`` field as ``int``, ``MapState.getValue`` as a ``Row``). The first key fixes the
  grouping key's type (a None first key: string) and a key of another type is refused, as the operator has one key
  schema. ``updateListState(name, key, [])`` clears the list (the store keeps no empty list). ``listTimers`` lists
  in Spark's store order (PySpark's tester sorts).
- The processor's own handle raises the operator's errors (a timer in timeMode "None": ``PySparkRuntimeError``
  ``STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE``); ``tester.handle``'s timer methods raise
  PySpark's tester's (``PySparkValueError`` ``UNSUPPORTED_OPERATION``), which PySpark's tests expect of it.

As in PySpark's tester, ``init`` runs once, ``close`` never, and the key is handed to the handlers as a 1-tuple
(timers get the key as the store decodes it). ``close()`` (not in PySpark's API) frees the store at once; otherwise
it goes with the tester.
"""

# ruff: noqa: N802, N803 - method and argument names follow PySpark's TwsTester

from __future__ import annotations

import contextlib
import importlib
import logging
import tempfile
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
from pyspark.errors import PySparkAssertionError, PySparkValueError
from pyspark.errors.exceptions.base import IllegalArgumentException

from statekeeper.store.formats.typed_schema import DataType, Field, ValueTypeError, atomic, infer, struct
from statekeeper.store.spark.api import StatefulProcessor, TimerValues
from statekeeper.store.spark.event_time import INITIAL_WATERMARK_MS, TaskTime, drop_late
from statekeeper.store.spark.executor import fire_timers
from statekeeper.store.spark.handle import StatefulProcessorHandle
from statekeeper.store.spark.state import StateContext
from statekeeper.store.spark.state_variables import ListState, MapState, ValueState
from statekeeper.store.spark.time_mode import TimeMode
from statekeeper.store.state_store import StateStore, StoreConfig

log = logging.getLogger(__name__)

OPERATOR = "tws_tester"
KEY_FIELD = "key"
"""The grouping key's one field (PySpark's tester has no key column name)."""

_TIME_MODES = ("none", "processingtime", "eventtime")
_NO_KEY: Any = object()


class TwsTester:
    """Tests a ``StatefulProcessor`` key by key, as PySpark's ``TwsTester``, on a real store (module docstring).

    `initialStateRow`: ``[(key, Row), ...]``; `initialStatePandas`: ``[(key, DataFrame), ...]`` (not both).
    `timeMode`: "None", "ProcessingTime" or "EventTime"; EventTime needs `eventTimeExtractor` (row -> event ms),
    which decides late rows. `outputMode` is kept, unused, as PySpark's tester keeps it.
    """

    def __init__(
        self,
        processor: Any,
        initialStateRow: list[tuple[Any, Any]] | None = None,
        initialStatePandas: list[tuple[Any, Any]] | None = None,
        timeMode: str = "None",
        outputMode: str = "Append",
        eventTimeExtractor: Callable[[Any], int] | None = None,
    ) -> None:
        self.processor = processor
        self._outputMode = outputMode
        self._eventTimeExtractor = eventTimeExtractor
        if not isinstance(timeMode, str) or timeMode.lower() not in _TIME_MODES:
            raise AssertionError(f"timeMode must be 'None', 'ProcessingTime' or 'EventTime', got {timeMode!r}")
        self._mode = TimeMode.parse(timeMode)
        if self._mode is TimeMode.EVENT_TIME and eventTimeExtractor is None:
            raise PySparkValueError(
                errorClass="ARGUMENT_REQUIRED",
                messageParameters={"arg_name": "eventTimeExtractor", "condition": "timeMode is EventTime"},
            )
        if initialStateRow is not None and initialStatePandas is not None:
            raise AssertionError("Cannot specify both Row and Pandas initial states.")
        self._usingPandas = initialStatePandas is not None
        self._processingTimeMs = 0
        self._watermarkMs = INITIAL_WATERMARK_MS if self._mode is TimeMode.EVENT_TIME else -1
        self._tmp = tempfile.TemporaryDirectory(prefix="statekeeper-tws-tester-")
        base = Path(self._tmp.name)
        self.store = StateStore(
            (base / "checkpoint").as_uri(), OPERATOR, 0, config=StoreConfig(local_dir=str(base / "local"))
        )
        """The partition's store, a version open: read it, do not commit it."""
        self._finalizer = weakref.finalize(self, _close, self.store, self._tmp)
        self._committed: tuple[int, str | None] = (0, None)
        self.store.load(0)
        self._ctx = StateContext(self.store, self._processingTimeMs)
        self._handle = StatefulProcessorHandle(self._ctx, self._mode)
        self.handle = TesterHandle(self)
        """The tester's handle, as PySpark's tester's ``handle``: ``setGroupingKey``, timers, the variables."""
        with self._batch():
            processor.init(self._handle)
            self._handle.initialized = True
            for key, state in initialStateRow or initialStatePandas or []:
                self._set_key(key)
                processor.handleInitialState((key,), state, self._timer_values())

    # -- PySpark's TwsTester API ----------------------------------------------------------------
    def test(self, key: Any, input: list[Any]) -> list[Any]:
        """One micro-batch of `key`'s rows (late ones dropped in EventTime): the Rows it outputs."""
        self._usingPandas = False
        items = list(input)
        rows = self._on_time(items, lambda extract: [extract(r) for r in items])
        return cast("list[Any]", self._run(key, rows))

    def testInPandas(self, key: Any, input: Any) -> Any:
        """As :meth:`test` with a pandas DataFrame in and out (transformWithStateInPandas processors)."""
        self._usingPandas = True
        frame = input
        if self._late_applies() and len(input):
            kept = self._on_time(list(range(len(input))), lambda extract: [extract(r) for _, r in input.iterrows()])
            frame = input.iloc[kept].reset_index(drop=True)
        return self._run(key, [frame])

    def updateValueState(self, stateName: str, key: Any, value: tuple[Any, ...]) -> None:
        with self._batch():
            self._variable(stateName, ValueState, key).update(value)

    def peekValueState(self, stateName: str, key: Any) -> Any:
        """The key's value (None when absent or expired)."""
        state = self._variable(stateName, ValueState)
        return state.get() if self._peek_key(key) else None

    def updateListState(self, stateName: str, key: Any, value: list[Any]) -> None:
        """Replace the key's list (an empty list clears it: the store keeps no empty list)."""
        with self._batch():
            state = self._variable(stateName, ListState, key)
            if value:
                state.put(value)
            else:
                state.clear()

    def peekListState(self, stateName: str, key: Any) -> list[Any]:
        state = self._variable(stateName, ListState)
        return list(state.get()) if self._peek_key(key) else []

    def updateMapState(self, stateName: str, key: Any, value: dict[Any, Any]) -> None:
        """Replace the key's map with `value`."""
        with self._batch():
            state = self._variable(stateName, MapState, key)
            state.clear()
            for user_key, v in dict(value).items():
                state.updateValue(user_key, v)

    def peekMapState(self, stateName: str, key: Any) -> dict[Any, Any]:
        state = self._variable(stateName, MapState)
        return dict(state.iterator()) if self._peek_key(key) else {}

    def deleteState(self, stateName: str, key: Any) -> None:
        """Clear the key's value of state variable `stateName`."""
        state = self._ctx.states.get(stateName)
        if not isinstance(state, ValueState | ListState | MapState):
            raise PySparkAssertionError(errorClass="STATE_NOT_EXISTS", messageParameters={})
        with self._batch():
            self._set_key(key)
            state.clear()

    def setProcessingTime(self, currentTimeMs: int) -> Any:
        """Move the processing time forward: a micro-batch without input (timers due fire, TTL rows expire)."""
        self._processingTimeMs = self._ctx.now_ms = _forward(
            self._mode, TimeMode.PROCESSING_TIME, "Processing time", self._processingTimeMs, currentTimeMs
        )
        return self._run(None, None)

    def setWatermark(self, currentWatermarkMs: int) -> Any:
        """Move the watermark forward: a micro-batch without input (event-time timers due fire)."""
        self._watermarkMs = _forward(
            self._mode, TimeMode.EVENT_TIME, "Watermark", self._watermarkMs, currentWatermarkMs
        )
        return self._run(None, None)

    def close(self) -> None:
        """Close the store and delete its directory (statekeeper's; PySpark's tester holds nothing to free)."""
        self._finalizer()

    # -- batches --------------------------------------------------------------------------------
    def _run(self, key: Any, rows: Any) -> Any:
        """A micro-batch: `key`'s rows (none: only timers), then the timers due; the output, shaped as PySpark's."""
        out: list[Any] = []
        with self._batch():
            values = self._timer_values()
            if rows is not None:
                self._set_key(key)
                out.extend(self.processor.handleInputRows((key,), iter(rows), values))
            fired = self._ctx.expired_timers(self._time().timer_deadline_ms(self._processingTimeMs))
            for _ in fire_timers(self._ctx, cast("StatefulProcessor", self.processor), fired, values, None, out.extend):
                pass
        if not self._usingPandas:
            return out
        pd: Any = importlib.import_module("pandas")  # as PySpark's tester: the frames concatenated
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame()

    @contextlib.contextmanager
    def _batch(self) -> Iterator[None]:
        """Commit the open version as a batch ends (held writes, TTL eviction, row count) and open the next; on
        an error, abort it and reopen the last committed one."""
        ctx, store = self._ctx, self.store
        try:
            yield
            ctx.clear_key()
            ctx.evict_expired()
            ctx.save_rows_total()
            result = store.commit()
        except BaseException:
            store.abort()
            store.load(*self._committed)
            ctx.next_batch(self._processingTimeMs)
            raise
        store.commit_log.commit(result.version, {OPERATOR: [result.checkpoint_id]})
        log.debug("tws tester: committed version %d", result.version)
        self._committed = (result.version, result.checkpoint_id)
        store.load(*self._committed)
        ctx.next_batch(self._processingTimeMs)

    def _time(self) -> TaskTime:
        return TaskTime(self._mode, None, self._watermarkMs, self._watermarkMs)

    def _timer_values(self) -> TimerValues:
        return self._time().timer_values(self._processingTimeMs)

    def _late_applies(self) -> bool:
        return self._mode is TimeMode.EVENT_TIME and self._eventTimeExtractor is not None

    def _on_time(self, items: list[Any], event_ms: Callable[[Callable[[Any], int]], list[Any]]) -> list[Any]:
        """`items` whose event time (`event_ms` of the extractor, one per item) is not late, by the operator's rule."""
        if not self._late_applies() or not items:
            return items
        assert self._eventTimeExtractor is not None
        times = pa.table({"ms": pa.array(event_ms(self._eventTimeExtractor), pa.int64()), "i": range(len(items))})
        kept, _, _ = drop_late(times, "ms", self._watermarkMs)
        return [items[i] for i in kept.column("i").to_pylist()]

    # -- keys and variables ---------------------------------------------------------------------
    def _set_key(self, key: Any) -> None:
        ctx = self._ctx
        if ctx.key_schema is None:  # the first key fixes the key's type, as the operator's key columns do
            ctx.use_key_schema(struct(Field(KEY_FIELD, _key_type(key))))
        try:
            ctx.set_key((key,))
        except ValueTypeError as e:
            ctx.clear_key()
            raise ValueTypeError(f"{e} (the tester's keys have one type, the first key's, as the operator's)") from None

    def _peek_key(self, key: Any) -> bool:
        """Make `key` current for a read; False when no such key can be stored: none ever was (nothing is then
        recorded), or its type is not the key's."""
        if self._ctx.key_schema is None:
            return False
        try:
            self._set_key(key)
        except ValueTypeError:
            return False
        return True

    def _variable(self, name: str, kind: type[Any], key: Any = _NO_KEY) -> Any:
        """The variable `init` declared under `name` (PySpark's tester asserts it is there), `key` made current."""
        state = self._ctx.states.get(name)
        if not isinstance(state, kind):
            raise AssertionError(f"State {name} has not been initialized.")
        if key is not _NO_KEY:
            self._set_key(key)
        return state


class TesterHandle:
    """``tester.handle``: what PySpark's tests do with their tester's handle, on the real one.

    ``getValueState`` / ``getListState`` / ``getMapState`` give the variable ``init`` declared under the name (a
    new name is declared, as ``init`` would); ``deleteIfExists`` deletes as in ``init``. Timer methods in timeMode
    "None" raise PySpark's tester's ``PySparkValueError``. Writes land in the open version (module docstring)."""

    def __init__(self, tester: TwsTester) -> None:
        self._tester = tester

    def setGroupingKey(self, key: Any) -> None:
        self._tester._set_key(key)

    def _declared(self, name: str, kind: type[Any], declare: Callable[[], Any]) -> Any:
        state = self._tester._ctx.states.get(name)
        if state is not None:
            if not isinstance(state, kind):
                raise AssertionError(f"state {name!r} is a {type(state).__name__}, not a {kind.__name__}")
            return state
        with self._in_init():
            return declare()

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> ValueState:
        real = self._tester._handle
        return cast(
            ValueState,
            self._declared(stateName, ValueState, lambda: real.getValueState(stateName, schema, ttlDurationMs)),
        )

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> ListState:
        real = self._tester._handle
        return cast(
            ListState, self._declared(stateName, ListState, lambda: real.getListState(stateName, schema, ttlDurationMs))
        )

    def getMapState(
        self, stateName: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: int | None = None
    ) -> MapState:
        real = self._tester._handle
        return cast(
            MapState,
            self._declared(
                stateName, MapState, lambda: real.getMapState(stateName, userKeySchema, valueSchema, ttlDurationMs)
            ),
        )

    def deleteIfExists(self, stateName: str) -> None:
        with self._in_init():
            self._tester._handle.deleteIfExists(stateName)

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._timers().registerTimer(expiryTimestampMs)

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._timers().deleteTimer(expiryTimestampMs)

    def listTimers(self) -> Iterator[int]:
        return self._timers().listTimers()

    def _timers(self) -> StatefulProcessorHandle:
        if self._tester._mode is TimeMode.NONE:
            raise PySparkValueError(
                errorClass="UNSUPPORTED_OPERATION", messageParameters={"operation": "Timers with TimeMode.None"}
            )
        return self._tester._handle

    @contextlib.contextmanager
    def _in_init(self) -> Iterator[None]:
        """The real handle as ``init`` has it: declarations and deletions allowed."""
        real = self._tester._handle
        real.initialized = False
        try:
            yield
        finally:
            real.initialized = True


def _key_type(key: Any) -> DataType:
    """The grouping key's type, from its first value (None: string -- the only hint there is)."""
    return atomic("string") if key is None else infer(key, "the grouping key")


def _forward(mode: TimeMode, needs: TimeMode, what: str, current: int, new: int) -> int:
    """`new`, checked as PySpark's tester checks a time it is given: only in its time mode, and only forward."""
    if mode is not needs:
        setter = "setProcessingTime" if needs is TimeMode.PROCESSING_TIME else "setWatermark"
        other = "ProcessingTime" if needs is TimeMode.PROCESSING_TIME else "EventTime"
        raise PySparkValueError(
            errorClass="UNSUPPORTED_OPERATION",
            messageParameters={"operation": f"{setter} with TimeMode other than {other}"},
        )
    if new <= current:
        raise IllegalArgumentException(message=f"{what} must move forward. Current: {current} ms, provided: {new} ms.")
    return int(new)


def _close(store: StateStore, tmp: tempfile.TemporaryDirectory[str]) -> None:
    with contextlib.suppress(Exception):
        store.close(discard=True)
    tmp.cleanup()


__all__ = ["TesterHandle", "TwsTester"]
