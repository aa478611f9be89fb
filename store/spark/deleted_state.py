"""The handle of a state variable after ``handle.deleteIfExists``: every use raises, as PySpark's does.

A live handle pays nothing for this: deletion swaps the object's class for a subclass whose state
methods raise :class:`StateVariableDeletedError`, with PySpark's messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from statekeeper.store.errors import StoreStateError
from statekeeper.store.spark.spark_errors import PySparkRuntimeError
from statekeeper.store.spark.state_variables import _State


class StateVariableDeletedError(StoreStateError, PySparkRuntimeError):
    """A state variable's handle was used after ``handle.deleteIfExists`` removed the variable.

    A ``PySparkRuntimeError`` too (where PySpark is installed), with PySpark's message, so a processor that
    expects PySpark's error (``assertRaisesRegex(PySparkRuntimeError, "Error checking value state exists")``)
    runs unchanged."""


_DELETED_MESSAGES = {
    "value": {
        "exists": "Error checking value state exists",
        "get": "Error getting value state",
        "update": "Error updating value state",
        "clear": "Error clearing value state",
        "getMany": "Error getting value state",
        "updateMany": "Error updating value state",
        "clearMany": "Error clearing value state",
    },
    "list": {
        "exists": "Error checking list state exists",
        "get": "Error getting list state",
        "put": "Error updating list state",
        "appendValue": "Error appending value to list state",
        "appendList": "Error appending list to list state",
        "clear": "Error clearing list state",
    },
    "map": {
        "exists": "Error checking map state exists",
        "getValue": "Error getting value",
        "containsKey": "Error checking map state contains key",
        "updateValue": "Error updating map state value",
        "iterator": "Error getting map state iterator",
        "keys": "Error getting map state keys",
        "values": "Error getting map state values",
        "removeKey": "Error removing key from map state",
        "clear": "Error clearing map state",
    },
}


def _raiser(message: str) -> Callable[..., NoReturn]:
    def deleted(self: _State, *args: Any, **kwargs: Any) -> NoReturn:
        raise StateVariableDeletedError(
            f"{message}: state variable {self.name!r} was deleted by handle.deleteIfExists; "
            "declare it again (handle.getValueState / getListState / getMapState) to use it"
        )

    return deleted


_DELETED_CLASSES: dict[str, type[_State]] = {}


def _deleted_class(cls: type[_State]) -> type[_State]:
    """`cls` with every state method raising :class:`StateVariableDeletedError` (no check on live handles)."""
    deleted = _DELETED_CLASSES.get(cls.kind)
    if deleted is None:
        methods = {name: _raiser(message) for name, message in _DELETED_MESSAGES[cls.kind].items()}
        deleted = _DELETED_CLASSES[cls.kind] = type(f"Deleted{cls.__name__}", (cls,), methods)
    return deleted


def retire(state: _State) -> None:
    """Make a handle of a deleted variable raise on every use, as PySpark's does."""
    state.__class__ = _deleted_class(type(state))


__all__ = ["StateVariableDeletedError", "retire"]
