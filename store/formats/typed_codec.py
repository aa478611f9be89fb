"""Byte encodings of typed state values: compact rows driven by the variable's recorded schema.

Nothing here executes code when decoding: every byte is parsed by a schema recorded in the
checkpoint, and bytes that do not fit it raise :class:`CorruptStateError`. docs/formats.md has the
tables; in short:

- **Values** (:class:`ValueCodec`): a row ``null bitmap | fixed-width slots (little-endian) | variable
  data``, variable-width fields (strings, binaries, decimals, arrays, structs) holding their length in
  the slot. Rows of fixed-width fields whose only conversion is the boolean check take one
  ``struct.pack`` / ``unpack`` call, nulls included (store/formats/null_patterns.py: a null's slot is
  pad bytes, which ``struct`` writes as zeros, exactly what the checked path writes).
- **Maps** (:class:`MapCodec`, value side only): ``u32 count`` then ``u32 length | key row | u32 length
  (0xFFFFFFFF for null) | value row`` per entry, in the map's own order (a dict's insertion order), so the
  same map always has the same bytes; decoded as a ``dict``.
- **Keys** are order-preserving and lead with their key group: `statekeeper.store.formats.typed_keys`.
"""

from __future__ import annotations

import decimal
import operator
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from statekeeper.store.formats.null_patterns import NullPatterns
from statekeeper.store.formats.typed_scalars import (
    CorruptStateError,
    as_blob,
    as_bool,
    as_text,
    field_error,
    from_days,
    from_micros_local,
    from_micros_naive,
    from_micros_utc,
    to_days,
    to_micros,
    to_micros_local,
    unscaled,
)
from statekeeper.store.formats.typed_schema import DataType, RowFactory, SchemaError, ValueTypeError

_LEN = struct.Struct("<I")


_FIXED_FORMAT = {
    "boolean": "?",
    "byte": "b",
    "short": "h",
    "integer": "i",
    "long": "q",
    "float": "f",
    "double": "d",
    "date": "i",
    "timestamp": "q",
    "timestamp_ntz": "q",
}
Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes], Any]


def _nested(
    typ: DataType, what: str, path: str, rows: RowFactory | None, local_time: bool = False
) -> tuple[Encoder, Callable[..., Any]]:
    """Encoder and decoder of a value nested in another (a field, an element, a map key or value)."""
    return _as_nested(ValueCodec(typ, what, path, rows, local_time), rows)


def _as_nested(codec: ValueCodec, rows: RowFactory | None) -> tuple[Encoder, Callable[..., Any]]:
    """`codec`'s encoder and decoder for a nested value: structs decode through `rows` when given. Built from the
    one codec of the type (one per level: a codec built twice per level would cost 2**depth)."""
    if not codec.schema.is_struct or rows is None:
        return codec.encode, codec.decode
    make = rows(tuple(codec.names))
    decode = codec.decode
    return codec.encode, lambda b, pos=0: make(decode(b, pos))


def _slot(
    typ: DataType, what: str, path: str, rows: RowFactory | None = None, local_time: bool = False
) -> tuple[str, Callable[[Any], Any] | None, Callable[[Any], Any] | None, bool]:
    """(struct format, to-slot conversion, from-slot conversion, variable width) of one field; `local_time`: a
    timestamp as PySpark hands one to a processor (naive, local time), else aware in UTC."""
    name = typ.name
    if name in ("date",):
        return "i", to_days, from_days, False
    if name == "timestamp":
        if local_time:
            return "q", to_micros_local, from_micros_local, False
        return "q", to_micros, from_micros_utc, False
    if name == "timestamp_ntz":
        return "q", to_micros, from_micros_naive, False
    if name == "boolean":
        return "?", as_bool, None, False
    if name in _FIXED_FORMAT:
        return _FIXED_FORMAT[name], None, None, False
    if name == "string":
        return "I", as_text, lambda b: b.decode(), True
    if name == "binary":
        return "I", as_blob, bytes, True
    if typ.decimal is not None:
        precision, scale = typ.decimal

        def dec_to(v: Any) -> bytes:
            n = unscaled(v, precision, scale)
            return n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)

        def dec_from(b: bytes) -> decimal.Decimal:
            return decimal.Decimal(int.from_bytes(b, "little", signed=True)).scaleb(-scale)

        return "I", dec_to, dec_from, True
    if typ.is_struct:
        encode, decode = _nested(typ, what, path, rows, local_time)
        return "I", encode, decode, True
    if name == "array":
        assert typ.element is not None
        elements = ListCodec(typ.element, what, f"{path}[]", rows, nested=True, local_time=local_time)
        return "I", elements.encode, elements.decode, True
    if name == "map":
        entries = MapCodec(typ, what, path, rows, local_time)
        return "I", entries.encode, entries.decode, True
    raise SchemaError(f"{what}: field {path!r} has unsupported type {typ.simple_string()}")


_NONE = (None,)


def _type_check(fields: Sequence[int], allowed: tuple[type, ...]) -> Callable[[Any], bool] | None:
    """A check that the given fields of a row have only `allowed` types (None: no field to check)."""
    if not fields:
        return None
    if len(fields) == 1:
        i = fields[0]
        if len(allowed) == 1:
            only = allowed[0]
            return lambda row: type(row[i]) is only
        return lambda row: type(row[i]) in allowed
    pick = operator.itemgetter(*fields)
    kinds = set(allowed)
    return lambda row: set(map(type, pick(row))) <= kinds


class ValueCodec:
    """Row bytes of values of one schema; a non-struct schema holds bare values (not 1-tuples)."""

    def __init__(
        self, schema: DataType, what: str, path: str = "", rows: RowFactory | None = None, local_time: bool = False
    ) -> None:
        self.schema = schema
        self.what = what
        self.bare = not schema.is_struct
        fields = schema.fields if schema.is_struct else ()
        types = [f.type for f in fields] if fields else [schema]
        self.names = [f.name for f in fields] if fields else ["value"]
        self.paths = [f"{path}.{n}" if path else n for n in self.names]
        self.nullable = [f.nullable for f in fields] if fields else [True]
        slots = [_slot(t, what, p, rows, local_time) for t, p in zip(types, self.paths, strict=True)]
        self.types = types
        self.n = len(slots)
        self.nbytes = (self.n + 7) // 8
        self._zero = bytes(self.nbytes)
        self._formats = [s[0] for s in slots]
        self._row = struct.Struct(f"<{self.nbytes}s" + "".join(self._formats))
        self._checks = [struct.Struct("<" + s[0]) for s in slots]
        self._to = [s[1] for s in slots]
        self._from = [s[2] for s in slots]
        self._var = [s[3] for s in slots]
        self._not_null = sum(1 << i for i, ok in enumerate(self.nullable) if not ok)
        self._bits = [1 << i for i in range(self.n)]
        self._plain_decode = not any(self._from) and not any(self._var)
        booleans = [i for i, t in enumerate(types) if t.name == "boolean"]
        self._fixed = self._plain_decode and all(to is None or i in booleans for i, to in enumerate(self._to))
        """Fixed-width fields whose only conversion is the boolean check: the one-``struct`` paths."""
        self._bools = _type_check(booleans, (bool,))
        self._bools_or_none = _type_check(booleans, (bool, type(None)))
        self._nulls = NullPatterns(self._formats, self.nbytes, b"", self._not_null) if self._fixed else None

    def encode(self, value: Any) -> bytes:
        row = (value,) if self.bare else value
        if self._fixed and type(row) is tuple:
            try:
                if None not in row:
                    if self._bools is None or self._bools(row):
                        return self._row.pack(self._zero, *row)
                elif len(row) == self.n and (self._bools_or_none is None or self._bools_or_none(row)):
                    assert self._nulls is not None
                    packed = self._nulls.pack(row)
                    if packed is not None:
                        return packed
            except (struct.error, TypeError):
                pass  # a wrong arity or a bad value: the checked path names it
        return self._encode_checked(row)  # conversions, a wrong arity or a bad value: it says which

    def compile(
        self, head: bytes, encode_any: Callable[..., bytes], decode_any: Callable[..., Any]
    ) -> tuple[Callable[..., bytes], Callable[..., Any]] | None:
        """``encode(value, expiry_ms=None)`` / ``decode(raw, now_ms=None)`` of rows behind the fixed `head`,
        one ``struct`` call each for fixed-width rows (nulls and booleans included), anything else handed
        to `encode_any` / `decode_any` (None: this schema has no such path)."""
        if not self._fixed:
            return None
        prefix = head + self._zero
        row = struct.Struct(f"<{len(prefix)}s" + "".join(self._formats))
        pack, unpack, size = row.pack, row.unpack, row.size
        nulls = NullPatterns(self._formats, self.nbytes, head, self._not_null)
        pack_nulls, spread_of, spreads, singles = nulls.pack, nulls.spread, nulls.spreads, nulls.singles
        bare, n = self.bare, self.n
        bools, bools_or_none = self._bools, self._bools_or_none
        null_bare = head + b"\x01" + bytes(row.size - len(prefix))

        def encode(value: Any, expiry_ms: int | None = None) -> bytes:
            if expiry_ms is None:
                try:
                    if bare:
                        if value is None:
                            return null_bare
                        if bools is None or type(value) is bool:
                            return pack(prefix, value)
                    elif None not in value:
                        if bools is None or bools(value):
                            return pack(prefix, *value)
                    elif type(value) is tuple and len(value) == n and (bools_or_none is None or bools_or_none(value)):
                        if value.count(None) == 1:  # the common case, inline (`NullPatterns.pack` has it too)
                            i = value.index(None)
                            single = singles[i]
                            if single is not None:
                                return single[0](single[1], *value[:i], *value[i + 1 :])
                        packed = pack_nulls(value)
                        if packed is not None:
                            return packed
                except (struct.error, TypeError):
                    pass  # a value the schema cannot hold: the checked path names it
            return encode_any(value, expiry_ms)  # a TTL, or a value for the checked path

        def decode(raw: bytes, now_ms: int | None = None) -> Any:
            if len(raw) == size:
                t = unpack(raw)
                if t[0] == prefix:
                    return t[1] if bare else t[1:]
                spread = spreads.get(t[0]) or spread_of(t[0])
                if spread is not None:
                    if bare:
                        return None
                    return tuple(map((t + _NONE).__getitem__, spread))
            return decode_any(raw, now_ms)

        return encode, decode

    def _encode_checked(self, row: Any) -> bytes:
        if isinstance(row, dict):
            row = tuple(row.get(n) for n in self.names)
        if not isinstance(row, tuple | list) or len(row) != self.n:
            shape = self.schema.simple_string()
            raise ValueTypeError(f"{self.what}: value {row!r} does not match the schema {shape} ({self.n} fields)")
        nulls = 0
        slots: list[Any] = []
        var: list[bytes] = []
        for i, v in enumerate(row):
            if v is None:
                if not self.nullable[i]:
                    raise SchemaError(f"{self.what}: field {self.paths[i]!r} is not nullable, got None")
                nulls |= 1 << i
                slots.append(0)
                continue
            to = self._to[i]
            try:
                x = v if to is None else to(v)
                if self._var[i]:
                    var.append(x)
                    x = len(x)
                self._checks[i].pack(x)
            except SchemaError:
                raise
            except (TypeError, ValueError, OverflowError, struct.error, decimal.InvalidOperation) as e:
                raise field_error(self.what, self.paths[i], self.types[i], v, e) from None
            slots.append(x)
        head = self._row.pack(nulls.to_bytes(self.nbytes, "little"), *slots)
        return head + b"".join(var) if var else head

    def decode(self, raw: bytes, pos: int = 0) -> Any:
        """The value whose row fills `raw` from `pos` to its end (a value's bytes, or a nested value's own)."""
        t = self._row.unpack_from(raw, pos)
        if self._plain_decode:
            if len(raw) != pos + self._row.size:
                raise CorruptStateError(_trailing(self.what, len(raw) - pos - self._row.size))
            if t[0] == self._zero:
                return t[1] if self.bare else t[1:]
            spread = self._nulls.spread(t[0]) if self._nulls is not None else None
            if spread is not None:
                return None if self.bare else tuple(map((t + _NONE).__getitem__, spread))
            nulls = int.from_bytes(t[0], "little")
            row = tuple([None if nulls & b else x for b, x in zip(self._bits, t[1:], strict=True)])
            return row[0] if self.bare else row
        nulls = int.from_bytes(t[0], "little")
        at = pos + self._row.size
        out: list[Any] = []
        for i in range(self.n):
            x = t[i + 1]
            if nulls >> i & 1:
                out.append(None)
                continue
            if self._var[i]:
                b = raw[at : at + x]
                if len(b) != x:
                    raise CorruptStateError(f"{self.what}: field {self.paths[i]!r} runs past the value's end")
                at += x
                x = b
            conv = self._from[i]
            out.append(x if conv is None else conv(x))
        if at != len(raw):
            raise CorruptStateError(_trailing(self.what, len(raw) - at))
        return out[0] if self.bare else tuple(out)


def _trailing(what: str, extra: int) -> str:
    return f"{what}: {extra} bytes after the value's end (a value fills its bytes exactly)"


class ListCodec:
    """A list of values of one schema: ``u32 count`` then ``u32 length | value row`` per element.

    A ListState's list is top-level (its struct elements decode as tuples, as PySpark's ``get`` yields
    them); an array field is `nested` (struct elements decode through `rows`)."""

    def __init__(
        self,
        element: DataType,
        what: str,
        path: str = "",
        rows: RowFactory | None = None,
        nested: bool = False,
        local_time: bool = False,
    ) -> None:
        self.element = ValueCodec(element, what, path, rows, local_time)
        self._enc = self.element.encode
        self._dec = _as_nested(self.element, rows)[1] if nested else self.element.decode

    def encode(self, values: Sequence[Any]) -> bytes:
        if not isinstance(values, list | tuple) and not _is_ndarray(values):
            raise ValueTypeError(f"{self.element.what}: expected a list, got {type(values).__name__}")
        enc = self._enc
        parts = [_LEN.pack(len(values))]
        for v in values:
            if v is None:
                parts.append(b"\xff\xff\xff\xff")
                continue
            b = enc(v)
            parts.append(_LEN.pack(len(b)))
            parts.append(b)
        return b"".join(parts)

    def decode(self, raw: bytes, pos: int = 0) -> list[Any]:
        (count,) = _LEN.unpack_from(raw, pos)
        pos += 4
        dec = self._dec
        out: list[Any] = []
        for _ in range(count):
            (n,) = _LEN.unpack_from(raw, pos)
            pos += 4
            if n == 0xFFFFFFFF:
                out.append(None)
                continue
            if pos + n > len(raw):
                raise CorruptStateError(f"{self.element.what}: a list element runs past the value's end")
            out.append(dec(raw[pos : pos + n]))
            pos += n
        if pos != len(raw):
            raise CorruptStateError(_trailing(self.element.what, len(raw) - pos))
        return out


def _is_ndarray(values: Any) -> bool:
    """A NumPy array (what pandas gives for an array column): encoded as the list it holds."""
    return type(values).__name__ == "ndarray" and type(values).__module__ == "numpy"


def _hashable(key: Any) -> Any:
    """A decoded map key usable as a dict key (an array key becomes a tuple)."""
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


class MapCodec:
    """A map (a dict, or a list of key-value pairs as Arrow gives them) in its own entry order."""

    def __init__(
        self, typ: DataType, what: str, path: str = "", rows: RowFactory | None = None, local_time: bool = False
    ) -> None:
        assert typ.key is not None and typ.element is not None
        self.what = what
        self.path = path or "value"
        self._enc_key, self._dec_key = _nested(typ.key, what, f"{path}{{key}}", rows, local_time)
        self._enc_value, self._dec_value = _nested(typ.element, what, f"{path}{{}}", rows, local_time)
        self._values_nullable = typ.contains_null

    def encode(self, value: Any) -> bytes:
        if isinstance(value, Mapping):
            items: Any = value.items()
        elif isinstance(value, list | tuple):
            items = value
        else:
            raise ValueTypeError(f"{self.what}: field {self.path!r} expects a map (dict), got {type(value).__name__}")
        parts = [_LEN.pack(len(items))]
        enc_key, enc_value = self._enc_key, self._enc_value
        for k, v in items:
            if k is None:
                raise SchemaError(f"{self.what}: field {self.path!r} has a null map key")
            kb = enc_key(k)
            parts.append(_LEN.pack(len(kb)))
            parts.append(kb)
            if v is None:
                if not self._values_nullable:
                    raise SchemaError(
                        f"{self.what}: field {self.path!r} has a null map value (valueContainsNull is false)"
                    )
                parts.append(b"\xff\xff\xff\xff")
                continue
            vb = enc_value(v)
            parts.append(_LEN.pack(len(vb)))
            parts.append(vb)
        return b"".join(parts)

    def decode(self, raw: bytes, pos: int = 0) -> dict[Any, Any]:
        try:
            (count,) = _LEN.unpack_from(raw, pos)
            pos += 4
            out: dict[Any, Any] = {}
            for _ in range(count):
                (n,) = _LEN.unpack_from(raw, pos)
                pos += 4
                if pos + n > len(raw):
                    raise struct.error("a key's length")
                key = _hashable(self._dec_key(raw[pos : pos + n]))
                pos += n
                (n,) = _LEN.unpack_from(raw, pos)
                pos += 4
                if n == 0xFFFFFFFF:
                    out[key] = None
                    continue
                if pos + n > len(raw):
                    raise struct.error("a value's length")
                out[key] = self._dec_value(raw[pos : pos + n])
                pos += n
        except struct.error as e:
            raise CorruptStateError(f"{self.what}: map field {self.path!r} runs past the value's end: {e}") from None
        if pos != len(raw):
            raise CorruptStateError(_trailing(f"{self.what}: map field {self.path!r}", len(raw) - pos))
        return out


__all__ = ["ListCodec", "MapCodec", "RowFactory", "ValueCodec"]
