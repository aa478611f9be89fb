"""PySpark's ``timeMode`` of a stateful operator, as an enum (its own module: the handle and the
event-time logic both need it)."""

from __future__ import annotations

import enum

from statekeeper.store.errors import ConfigurationError


class TimeMode(enum.Enum):
    """PySpark's ``timeMode`` names (compared case-insensitively, as PySpark does)."""

    NONE = "None"
    PROCESSING_TIME = "ProcessingTime"
    EVENT_TIME = "EventTime"

    @classmethod
    def parse(cls, value: str | TimeMode) -> TimeMode:
        if isinstance(value, TimeMode):
            return value
        for mode in cls:
            if isinstance(value, str) and value.lower() == mode.value.lower():
                return mode
        raise ConfigurationError(
            f"time_mode must be one of {[m.value for m in cls]} (as PySpark's timeMode), got {value!r}"
        )


__all__ = ["TimeMode"]
