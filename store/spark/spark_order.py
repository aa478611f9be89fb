"""The orders a processor sees on Spark: its state store (RocksDB) compares keys bytewise, and Spark stores a
MapState's user key (a struct nested in the row after the grouping key) and a timer's expiry as UnsafeRow
bytes, fixed-width fields little-endian. So PySpark iterates a map's entries and lists a key's timers in that
byte order (``256`` before ``1``; ``"b"`` before ``"aa"`` and a key row with shorter strings first).
statekeeper keeps its own order-preserving keys (store/formats/typed_keys.py) and sorts what a processor
iterates by these keys instead.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct
from collections.abc import Callable
from typing import Any

from statekeeper.store.formats.typed_scalars import to_micros_local
from statekeeper.store.formats.typed_schema import DataType

_FIXED = {
    "boolean": "<?",
    "byte": "<b",
    "short": "<h",
    "integer": "<i",
    "date": "<i",
    "long": "<q",
    "timestamp": "<q",
    "timestamp_ntz": "<q",
    "float": "<f",
    "double": "<d",
}
_SIZE = struct.Struct("<I")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_NTZ = dt.datetime(1970, 1, 1)
_MICRO = dt.timedelta(microseconds=1)


def long_order(v: int) -> bytes:
    """A timer's expiry as Spark's timer index orders it (an UnsafeRow's long)."""
    return int(v).to_bytes(8, "little", signed=True)


def _fixed_value(name: str, v: Any) -> Any:
    if name == "date" and isinstance(v, dt.date):
        return (v - dt.date(1970, 1, 1)).days
    if name == "timestamp" and isinstance(v, dt.datetime):
        return to_micros_local(v)  # a processor's naive timestamp is local time, as PySpark's
    if name == "timestamp_ntz" and isinstance(v, dt.datetime):
        return (v - (_EPOCH if v.tzinfo else _EPOCH_NTZ)) // _MICRO
    if name in ("float", "double"):
        v = float(v)
        return math.nan if math.isnan(v) else (0.0 if v == 0.0 else v)  # Spark normalizes -0.0 and NaN
    return v


def unsafe_row_order(schema: DataType) -> Callable[[Any], bytes] | None:
    """``key -> its UnsafeRow bytes`` for keys of `schema` (a struct's tuple, or a bare atomic value), or None
    when a field nests (arrays, maps, structs): such keys keep statekeeper's order."""
    fields = [f.type for f in schema.fields] if schema.is_struct else [schema]
    if not all(t.name in _FIXED or t.name in ("string", "binary") or t.decimal for t in fields):
        return None
    n = len(fields)
    head = ((n + 63) // 64) * 8 + 8 * n

    def row(key: Any) -> bytes:
        values = key if schema.is_struct else (key,)
        out = bytearray(head)
        var = bytearray()
        for i, (t, v) in enumerate(zip(fields, values, strict=False)):
            slot = ((n + 63) // 64) * 8 + 8 * i
            dec = t.decimal
            if v is None:
                out[(i // 64) * 8 + (i % 64) // 8] |= 1 << (i % 8)
                if dec is not None and dec[0] > 18:  # Spark keeps a null wide decimal's 16 bytes and offset
                    struct.pack_into("<q", out, slot, (head + len(var)) << 32)
                    var += bytes(16)
                continue
            fmt = _FIXED.get(t.name)
            if fmt is not None:
                struct.pack_into(fmt, out, slot, _fixed_value(t.name, v))
                continue
            if dec is not None:
                unscaled = int(decimal.Decimal(v).scaleb(dec[1]).to_integral_value(decimal.ROUND_HALF_UP))
                if dec[0] <= 18:
                    struct.pack_into("<q", out, slot, unscaled)
                    continue
                size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1  # Java's toByteArray
                data = unscaled.to_bytes(size, "big", signed=True)
                struct.pack_into("<q", out, slot, ((head + len(var)) << 32) | len(data))
                var += data + bytes(16 - len(data))  # Spark reserves 16 bytes for a wide decimal
                continue
            data = v.encode() if isinstance(v, str) else bytes(v)
            struct.pack_into("<q", out, slot, ((head + len(var)) << 32) | len(data))
            var += data + bytes((-len(data)) % 8)
        nested = bytes(out + var)
        # a struct key is one field of the row Spark stores after the grouping key: its slot (size, then
        # offset, little-endian) precedes its bytes, so a shorter key row sorts first
        return _SIZE.pack(len(nested)) + nested if schema.is_struct else nested

    return row


__all__ = ["long_order", "unsafe_row_order"]
