"""Python values to and from the scalars typed state stores, shared by the key and the value encodings.

Both encodings (`statekeeper.store.formats.typed_keys`, `statekeeper.store.formats.typed_codec`) accept
the same Python values for a field (``5``, ``numpy.int64(5)``, ``5.0`` in a long field; aware or naive
datetimes; dates; decimals) and turn them into the same integers and bytes, so the conversions, the
error that names a field, and :class:`CorruptStateError` live here once.
"""

from __future__ import annotations

import datetime as dt
import decimal
import operator
import time
from typing import Any

from statekeeper.store.errors import StatekeeperError
from statekeeper.store.formats.typed_schema import DataType, ValueTypeError

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EPOCH_NAIVE = dt.datetime(1970, 1, 1)
EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_MICRO = dt.timedelta(microseconds=1)
_DEC_CTX = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_UP)


class CorruptStateError(StatekeeperError):
    """Stored state bytes do not decode under the variable's recorded schema (foreign or damaged data)."""


def as_int(v: Any) -> int:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return operator.index(v)


def to_micros(v: Any) -> int:
    if isinstance(v, dt.datetime):
        base = EPOCH if v.tzinfo is not None else EPOCH_NAIVE
        return (v - base) // _MICRO
    return as_int(v)


def to_micros_local(v: Any) -> int:
    """As PySpark's ``TimestampType.toInternal``: a naive datetime is local time (an aware one its instant)."""
    if isinstance(v, dt.datetime) and v.tzinfo is None:
        return int(time.mktime(v.timetuple())) * 1_000_000 + v.microsecond
    return to_micros(v)


def from_micros_local(m: int) -> dt.datetime:
    """As PySpark's ``TimestampType.fromInternal``: a naive datetime in local time (ValueError out of range)."""
    try:
        return dt.datetime.fromtimestamp(m // 1_000_000).replace(microsecond=m % 1_000_000)
    except OSError as e:  # a platform's time_t limit: out of range like the others
        raise ValueError(f"timestamp {m} µs is out of range: {e}") from None


def to_days(v: Any) -> int:
    if isinstance(v, dt.datetime):
        v = v.date()
    if isinstance(v, dt.date):
        return v.toordinal() - EPOCH_ORDINAL
    return as_int(v)


def from_micros_utc(m: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=m)


def from_micros_naive(m: int) -> dt.datetime:
    return EPOCH_NAIVE + dt.timedelta(microseconds=m)


def from_days(d: int) -> dt.date:
    return dt.date.fromordinal(d + EPOCH_ORDINAL)


def unscaled(v: Any, precision: int, scale: int) -> int:
    d = v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v) if isinstance(v, float) else v)
    if not d.is_finite():
        raise ValueError(f"{d} is not a finite decimal")
    n = int(d.scaleb(scale, _DEC_CTX).to_integral_value(decimal.ROUND_HALF_UP))
    if abs(n) >= 10**precision:
        raise ValueError(f"{v} does not fit decimal({precision},{scale})")
    return n


def as_bool(v: Any) -> bool:
    if isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool")):
        return bool(v)
    raise TypeError(f"expected a boolean, got {type(v).__name__}")


def as_text(v: Any) -> bytes:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v.encode()


def as_blob(v: Any) -> bytes:
    if not isinstance(v, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, got {type(v).__name__}")
    return bytes(v)


def field_error(what: str, path: str, typ: DataType, v: Any, e: Exception) -> ValueTypeError:
    return ValueTypeError(f"{what}: field {path!r} ({typ.simple_string()}) cannot hold {v!r}: {e}")


__all__ = [
    "EPOCH",
    "EPOCH_NAIVE",
    "EPOCH_ORDINAL",
    "CorruptStateError",
    "as_blob",
    "as_bool",
    "as_int",
    "as_text",
    "field_error",
    "from_days",
    "from_micros_local",
    "from_micros_naive",
    "from_micros_utc",
    "to_days",
    "to_micros",
    "to_micros_local",
    "unscaled",
]
