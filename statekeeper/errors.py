"""The one root of every statekeeper error, below every package so that `store` and `sql` share it
without importing each other."""

from __future__ import annotations

from typing import Any


class StatekeeperError(Exception):
    """Base class: catch this to handle every statekeeper failure (store, maintenance, catalog).

    Every one crosses to another process as it is (a rescale's build processes, Spark's executors): it is rebuilt
    from its message and attributes, not by calling its constructor again, whose arguments a subclass may choose."""

    def __reduce__(self) -> tuple[Any, ...]:
        state = dict(self.__dict__)
        if isinstance(self, OSError):  # held by OSError itself, not in __dict__
            state["errno"] = self.errno
        return _rebuild, (type(self), self.args, state)


def _rebuild(cls: type[StatekeeperError], args: tuple[Any, ...], state: dict[str, Any]) -> StatekeeperError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    for name, value in state.items():
        setattr(error, name, value)
    return error
