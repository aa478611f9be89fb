"""Errors a processor meets where PySpark's operator raises its own: each is a statekeeper error and a
``PySparkRuntimeError`` (where PySpark is installed) whose message carries Spark's error class, so a processor
or test that expects PySpark's error runs unchanged."""

from __future__ import annotations

from statekeeper.store.errors import StatekeeperError, StoreStateError

try:
    from pyspark.errors import PySparkRuntimeError
except ImportError:  # pragma: no cover - an install without the [spark] extra
    PySparkRuntimeError = RuntimeError  # type: ignore[assignment,misc]


class HandleStateError(StoreStateError, PySparkRuntimeError):
    """A handle call PySpark refuses: a state variable declared or deleted after ``init``, declared twice, or
    with a TTL outside timeMode "ProcessingTime", with a non-nullable field under Spark's Avro state encoding; a
    timer without a time mode."""


class StateValueError(StatekeeperError, PySparkRuntimeError):
    """A value PySpark does not store: an empty list (``ILLEGAL_STATE_STORE_VALUE.EMPTY_LIST_VALUE``), a null
    value, list element or map key (``ILLEGAL_STATE_STORE_VALUE.NULL_VALUE``)."""


__all__ = ["HandleStateError", "PySparkRuntimeError", "StateValueError"]
