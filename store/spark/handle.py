"""``StatefulProcessorHandle``: what a processor's ``init`` gets, with PySpark's method signatures.

It declares state variables (checking their schemas against the ones recorded in the checkpoint,
store/spark/state.py) and manages the current key's processing-time timers.
"""

# ruff: noqa: N802, N803 - method and argument names follow PySpark's state API

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from statekeeper.store.formats.typed_schema import to_schema
from statekeeper.store.spark.deleted_state import retire
from statekeeper.store.spark.spark_errors import HandleStateError
from statekeeper.store.spark.spark_order import long_order
from statekeeper.store.spark.state import TIMERS_CF, StateContext, validate_state_name
from statekeeper.store.spark.state_variables import ListState, MapState, ValueState, _State
from statekeeper.store.spark.time_mode import TimeMode

_SPARK_MODE_NAMES = {TimeMode.NONE: "NoTime", TimeMode.EVENT_TIME: "EventTime"}


class StatefulProcessorHandle:
    """What ``init`` gets: declares state variables (PySpark's signatures) and manages timers.

    Schemas are a ``StructType`` / ``DataType`` or a DDL string (``"count long, total long"``), as in
    PySpark; a struct schema's values are tuples, an atomic schema's are bare values. Without a
    schema, the first value written fixes it (recorded in the checkpoint). As in PySpark, variables are
    declared (and deleted) in ``init`` only, once each, and a TTL needs timeMode "ProcessingTime".
    `nullable_fields`: refuse a schema with a non-nullable field, as Spark does under its Avro state encoding.
    """

    def __init__(
        self, ctx: StateContext, timeMode: TimeMode | str = TimeMode.PROCESSING_TIME, nullable_fields: bool = False
    ) -> None:
        self._ctx = ctx
        self._time_mode = TimeMode.parse(timeMode)
        self._nullable_fields = nullable_fields
        self.initialized = False
        """Set once the processor's ``init`` returned: declarations are refused from then on."""
        self._declared: set[str] = set()

    def _check_init(self, operation: str, what: str) -> None:
        if self.initialized:
            raise HandleStateError(
                f"{what}: [STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE] Failed to perform "
                f"stateful processor operation={operation} with invalid handle state=INITIALIZED. State variables "
                "are declared and deleted in init()"
            )

    def _timers(self, operation: str = "list_timers", what: str = "Error listing timers") -> StateContext:
        if self._time_mode is TimeMode.NONE:
            raise HandleStateError(
                f"{what}: [STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE] Failed to perform "
                f"stateful processor operation={operation} with invalid timeMode=NoTime (timers need timeMode "
                '"ProcessingTime" or "EventTime")'
            )
        return self._ctx

    def _get(
        self, cls: type[_State], name: str, ttl: int | None, schema: Any = None, user_key_schema: Any = None
    ) -> Any:
        what = f"Error initializing {cls.kind} state"
        self._check_init(f"get_{cls.kind}_state", what)
        validate_state_name(name)
        if name in self._declared:
            raise HandleStateError(
                f"{what}: [STATEFUL_PROCESSOR_DUPLICATE_STATE_VARIABLE_DEFINED] State variable with name {name} has "
                "already been defined in the StatefulProcessor."
            )
        if ttl is not None and self._time_mode is not TimeMode.PROCESSING_TIME:
            raise HandleStateError(
                f"{what}: [STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL] Cannot use TTL for state={name} in "
                f"timeMode={_SPARK_MODE_NAMES[self._time_mode]}, use TimeMode.ProcessingTime() instead."
            )
        kind = cls.kind.capitalize()  # per declaration, as Spark's handle counts: with a TTL or without
        self._ctx.count(f"num{kind}StateWithTTLVars" if ttl else f"num{kind}StateVars")
        what = f"the schema of state variable {name!r}"
        value_schema = to_schema(schema, what)
        key_schema = to_schema(user_key_schema, f"the map key schema of state variable {name!r}")
        if self._nullable_fields and value_schema is not None and not all(f.nullable for f in value_schema.fields):
            raise HandleStateError(
                f"{what}: [TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE] If Avro encoding is enabled, all the fields "
                f"in the schema for column family {name} must be nullable when using the TransformWithState "
                f"operator. Please make the schema nullable. Current schema: {value_schema.simple_string()}"
            )
        state = (
            cls(self._ctx, name, ttl, value_schema)
            if key_schema is None
            else MapState(self._ctx, name, ttl, value_schema, key_schema)
        )
        self._ctx.states[name] = state
        self._declared.add(name)
        return state

    def getValueState(self, stateName: str, schema: Any = None, ttlDurationMs: int | None = None) -> ValueState:
        """`schema`: StructType, DataType or DDL string (inferred from the first value when omitted)."""
        return self._get(ValueState, stateName, ttlDurationMs, schema)  # type: ignore[no-any-return]

    def getListState(self, stateName: str, schema: Any = None, ttlDurationMs: int | None = None) -> ListState:
        """`schema`: the schema of one element."""
        return self._get(ListState, stateName, ttlDurationMs, schema)  # type: ignore[no-any-return]

    def getMapState(
        self, stateName: str, userKeySchema: Any = None, valueSchema: Any = None, ttlDurationMs: int | None = None
    ) -> MapState:
        return self._get(MapState, stateName, ttlDurationMs, valueSchema, userKeySchema)  # type: ignore[no-any-return]

    def registerTimer(self, expiryTimestampMs: int) -> None:
        """A timer for the current key: in ProcessingTime it fires in the first batch whose processing
        time is at or after it, in EventTime in the first batch whose watermark is at or after it."""
        self._timers("register_timer", "Error register timer").register_timer(expiryTimestampMs)
        self._ctx.count("numRegisteredTimers")  # per call, as Spark's handle counts

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._timers("delete_timer", "Error deleting timer").delete_timer(expiryTimestampMs)
        self._ctx.count("numDeletedTimers")  # per call, as Spark's handle counts

    def listTimers(self) -> Iterator[int]:
        """The current key's timers in Spark's order: its state store lists them by the little-endian bytes of
        each expiry (an UnsafeRow's long), so 10**15 comes before 5."""
        return iter(sorted(self._timers().list_timers(), key=long_order))

    def has_any_timer(self) -> bool:
        """Whether any key of this partition holds a timer (one seek; statekeeper's, not PySpark's): lets a
        wrapper that clears each key's timers skip the lookup per key when there are none."""
        ctx = self._timers()
        if TIMERS_CF not in ctx.store.column_families():
            return False
        return next(iter(ctx.timers_cf.items()), None) is not None

    def deleteIfExists(self, stateName: str) -> None:
        """Drop every row of a state variable (in every key of this partition) and its schema records.

        A handle of it declared before raises ``StateVariableDeletedError`` (a ``PySparkRuntimeError``)
        on any use, as in PySpark; declaring it again gives a new, empty variable."""
        self._check_init("delete_if_exists", "Error deleting state")
        validate_state_name(stateName)
        self._declared.discard(stateName)
        declared = self._ctx.states.pop(stateName, None)
        if isinstance(declared, _State):  # every declared variable is one
            retire(declared)
        stored = stateName in self._ctx.store.column_families()
        if declared is not None or stored:
            self._ctx.count("numDeletedStateVars")
        if not stored:
            return
        cf = self._ctx.store.column_family(stateName)
        keys = [k for k, _ in cf.items()]
        if keys:
            cf.delete_batch(keys)
            self._ctx.rows_removed += len(keys)
            self._ctx.rows_delta -= len(keys)
        self._ctx.undeclare(stateName)


__all__ = ["HandleStateError", "StatefulProcessorHandle"]
