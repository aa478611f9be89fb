"""Byte encodings of typed state: order-preserving keys and compact schema-driven values.

Nothing here executes code when decoding: every byte is parsed by a schema recorded in the
checkpoint, and bytes that do not fit it raise :class:`CorruptStateError`. docs/formats.md has the
tables; in short:

- **Keys** (:class:`KeyCodec`): the fields of a typed tuple in order, each ``0x00`` (null) or ``0x01``
  followed by a fixed-width big-endian form whose unsigned byte order is the value order (integers of
  every width as ``u64(v + 2**63)``, floats as IEEE-754 doubles with the sign flipped, dates as
  ``u32(days + 2**31)``, timestamps as ``u64(micros + 2**63)``, decimals as ``u128(unscaled + 2**127)``),
  strings and binaries with ``0x00`` escaped as ``0x00 0xFF`` and ending in ``0x00 0x00``. So byte order
  equals value order, the encoding of a tuple is a prefix of the encodings of its extensions, and equal
  values (``5``, ``numpy.int64(5)``, ``5.0`` in a long field) give equal bytes.
- **Stored grouping keys** lead with the key group: ``u16 BE (crc32(key bytes) mod max_key_groups)``.
- **Values** (:class:`ValueCodec`): a row ``null bitmap | fixed-width slots (little-endian) | variable
  data``, variable-width fields (strings, binaries, decimals, arrays, structs) holding their length in
  the slot. Rows of fixed-width fields whose only conversion is the boolean check take one
  ``struct.pack`` / ``unpack`` call, nulls included (store/formats/null_patterns.py: a null's slot is
  pad bytes, which ``struct`` writes as zeros, exactly what the checked path writes).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import operator
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from statekeeper.store.errors import StatekeeperError
from statekeeper.store.formats.null_patterns import NullPatterns
from statekeeper.store.formats.typed_schema import INTEGRAL, DataType, SchemaError

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EPOCH_NAIVE = dt.datetime(1970, 1, 1)
EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_MICRO = dt.timedelta(microseconds=1)
_KEY_GROUP = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_LEN = struct.Struct("<I")
_D = struct.Struct(">d")
_SIGN = 1 << 63
_NULL = b"\x00"
_SOME = b"\x01"
_TRUE = b"\x01\x01"
_FALSE = b"\x01\x00"
MAX_KEY_GROUPS = 65536
_DEC_CTX = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_UP)


class CorruptStateError(StatekeeperError):
    """Stored state bytes do not decode under the variable's recorded schema (foreign or damaged data)."""


# -- scalar conversions ---------------------------------------------------------------------------
def _as_int(v: Any) -> int:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return operator.index(v)


def _micros(v: Any) -> int:
    if isinstance(v, dt.datetime):
        base = EPOCH if v.tzinfo is not None else EPOCH_NAIVE
        return (v - base) // _MICRO
    return _as_int(v)


def _days(v: Any) -> int:
    if isinstance(v, dt.datetime):
        v = v.date()
    if isinstance(v, dt.date):
        return v.toordinal() - EPOCH_ORDINAL
    return _as_int(v)


def _from_micros_utc(m: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=m)


def _from_micros_naive(m: int) -> dt.datetime:
    return EPOCH_NAIVE + dt.timedelta(microseconds=m)


def _from_days(d: int) -> dt.date:
    return dt.date.fromordinal(d + EPOCH_ORDINAL)


def _unscaled(v: Any, precision: int, scale: int) -> int:
    d = v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v) if isinstance(v, float) else v)
    if not d.is_finite():
        raise ValueError(f"{d} is not a finite decimal")
    n = int(d.scaleb(scale, _DEC_CTX).to_integral_value(decimal.ROUND_HALF_UP))
    if abs(n) >= 10**precision:
        raise ValueError(f"{v} does not fit decimal({precision},{scale})")
    return n


def _bool(v: Any) -> bool:
    if isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool")):
        return bool(v)
    raise TypeError(f"expected a boolean, got {type(v).__name__}")


def _text(v: Any) -> bytes:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v.encode()


def _blob(v: Any) -> bytes:
    if not isinstance(v, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, got {type(v).__name__}")
    return bytes(v)


def _double_bits(v: Any) -> int:
    f = float(v) + 0.0  # -0.0 -> 0.0
    if math.isnan(f):
        return 0xFFF8000000000000  # one NaN, after +inf
    bits: int = _U64.unpack(_D.pack(f))[0]
    return bits ^ 0xFFFFFFFFFFFFFFFF if bits & _SIGN else bits | _SIGN


def _bits_double(bits: int) -> float:
    bits = bits ^ _SIGN if bits & _SIGN else bits ^ 0xFFFFFFFFFFFFFFFF
    value: float = _D.unpack(_U64.pack(bits))[0]
    return value


def _field_error(what: str, path: str, typ: DataType, v: Any, e: Exception) -> SchemaError:
    return SchemaError(f"{what}: field {path!r} ({typ.simple_string()}) cannot hold {v!r}: {e}")


# -- keys -----------------------------------------------------------------------------------------
KeyEncoder = Callable[[Any, list[bytes]], None]
KeyDecoder = Callable[[bytes, int], tuple[Any, int]]


def _escape(b: bytes) -> bytes:
    return _SOME + b.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def _read_escaped(raw: bytes, pos: int) -> tuple[bytes, int]:
    # an escaped body never holds 0x00 0x00 (each 0x00 is followed by 0xFF), so the first one ends it
    end = raw.index(b"\x00\x00", pos)
    body = raw[pos:end]
    return (body.replace(b"\x00\xff", b"\x00") if b"\x00" in body else body), end + 2


def _key_parts(typ: DataType, what: str, path: str) -> tuple[KeyEncoder, KeyDecoder]:
    name = typ.name
    if typ.is_struct:
        subs = [_key_parts(f.type, what, f"{path}.{f.name}" if path else f.name) for f in typ.fields]
        encs = [e for e, _ in subs]
        decs = [d for _, d in subs]
        n = len(subs)

        def enc_struct(v: Any, out: list[bytes]) -> None:
            if len(v) != n:
                raise SchemaError(f"{what}: key {v!r} has {len(v)} fields, the schema {typ.simple_string()} has {n}")
            for e, x in zip(encs, v, strict=True):
                e(x, out)

        def dec_struct(raw: bytes, pos: int) -> tuple[Any, int]:
            vals = []
            for d in decs:
                x, pos = d(raw, pos)
                vals.append(x)
            return tuple(vals), pos

        return enc_struct, dec_struct

    fixed: tuple[Callable[[Any], bytes], Callable[[bytes, int], Any], int] | None = None
    if name in INTEGRAL:
        fixed = (lambda v: _U64.pack(_as_int(v) + _SIGN), lambda r, p: _U64.unpack_from(r, p)[0] - _SIGN, 8)
    elif name in ("float", "double"):
        fixed = (lambda v: _U64.pack(_double_bits(v)), lambda r, p: _bits_double(_U64.unpack_from(r, p)[0]), 8)
    elif name == "date":
        fixed = (
            lambda v: _U32.pack(_days(v) + (1 << 31)),
            lambda r, p: _from_days(_U32.unpack_from(r, p)[0] - (1 << 31)),
            4,
        )
    elif name in ("timestamp", "timestamp_ntz"):
        back = _from_micros_utc if name == "timestamp" else _from_micros_naive
        fixed = (lambda v: _U64.pack(_micros(v) + _SIGN), lambda r, p: back(_U64.unpack_from(r, p)[0] - _SIGN), 8)
    elif typ.decimal is not None:
        precision, scale = typ.decimal
        fixed = (
            lambda v: (_unscaled(v, precision, scale) + (1 << 127)).to_bytes(16, "big"),
            lambda r, p: decimal.Decimal(int.from_bytes(r[p : p + 16], "big") - (1 << 127)).scaleb(-scale),
            16,
        )
    if fixed is not None:
        to_bytes, from_bytes, width = fixed

        def enc_fixed(v: Any, out: list[bytes]) -> None:
            if v is None:
                out.append(_NULL)
                return
            try:
                out.append(_SOME + to_bytes(v))
            except (TypeError, ValueError, OverflowError, struct.error, decimal.InvalidOperation) as e:
                raise _field_error(what, path, typ, v, e) from None

        def dec_fixed(raw: bytes, pos: int) -> tuple[Any, int]:
            if raw[pos] == 0:
                return None, pos + 1
            return from_bytes(raw, pos + 1), pos + 1 + width

        return enc_fixed, dec_fixed
    if name == "boolean":

        def enc_bool(v: Any, out: list[bytes]) -> None:
            if v is None:
                out.append(_NULL)
                return
            try:
                out.append(_TRUE if _bool(v) else _FALSE)
            except TypeError as e:
                raise _field_error(what, path, typ, v, e) from None

        def dec_bool(raw: bytes, pos: int) -> tuple[Any, int]:
            return (None, pos + 1) if raw[pos] == 0 else (raw[pos + 1] == 1, pos + 2)

        return enc_bool, dec_bool
    if name in ("string", "binary"):
        conv = _text if name == "string" else _blob

        def enc_var(v: Any, out: list[bytes]) -> None:
            if v is None:
                out.append(_NULL)
                return
            try:
                out.append(_escape(conv(v)))
            except TypeError as e:
                raise _field_error(what, path, typ, v, e) from None

        def dec_var(raw: bytes, pos: int) -> tuple[Any, int]:
            if raw[pos] == 0:
                return None, pos + 1
            b, pos = _read_escaped(raw, pos + 1)
            return (b.decode() if name == "string" else b), pos

        return enc_var, dec_var
    raise SchemaError(f"{what}: field {path!r} has type {typ.simple_string()}, which cannot be part of a key")


class KeyCodec:
    """Order-preserving bytes of key tuples of one schema (a struct, or one atomic type)."""

    def __init__(self, schema: DataType, what: str) -> None:
        self.schema = schema
        self.what = what
        self.bare = not schema.is_struct
        self._enc, self._dec = _key_parts(schema, what, "" if schema.is_struct else "key")
        single = schema.fields[0].type.name if schema.is_struct and len(schema.fields) == 1 else None
        self._single_string = single == "string"
        self.single_kind = "string" if single == "string" else "integral" if single in INTEGRAL else None
        """The kind of a one-field key with a hot path (``string`` / ``integral``), else None."""

    def encode(self, key: Any) -> bytes:
        if self._single_string and type(key) is tuple and len(key) == 1 and type(key[0]) is str:
            return _SOME + key[0].encode().replace(b"\x00", b"\x00\xff") + b"\x00\x00"  # hot path
        if not self.bare and not isinstance(key, tuple | list):
            raise SchemaError(f"{self.what}: a key of {self.schema.simple_string()} must be a tuple, got {key!r}")
        out: list[bytes] = []
        self._enc(key, out)
        return b"".join(out)

    def decode(self, raw: bytes, pos: int = 0) -> Any:
        if self._single_string and raw[pos] == 1 and raw.endswith(b"\x00\x00"):
            body = raw[pos + 1 : -2]
            if b"\x00" not in body:
                return (body.decode(),)  # hot path
        try:
            value, end = self._dec(raw, pos)
        except (IndexError, ValueError, struct.error, OverflowError) as e:
            raise CorruptStateError(f"{self.what}: key {raw[pos:]!r} does not decode: {e}") from None
        if end != len(raw):
            raise CorruptStateError(f"{self.what}: key {raw[pos:]!r} has {len(raw) - end} trailing bytes")
        return value

    def decode_prefix(self, raw: bytes, pos: int = 0) -> tuple[Any, int]:
        """(key, end offset) of a key followed by more bytes."""
        try:
            value, end = self._dec(raw, pos)
        except (IndexError, ValueError, struct.error, OverflowError) as e:
            raise CorruptStateError(f"{self.what}: key {raw[pos:]!r} does not decode: {e}") from None
        return value, end


def key_group(encoded: bytes, max_key_groups: int) -> int:
    """The key group of an encoded grouping key: crc32 mod the groups recorded at the first batch."""
    return zlib.crc32(encoded) % max_key_groups


def with_key_group(encoded: bytes, max_key_groups: int) -> bytes:
    return _KEY_GROUP.pack(zlib.crc32(encoded) % max_key_groups) + encoded


def stored_key_encoder(codec: KeyCodec, max_key_groups: int) -> Callable[[Any], bytes]:
    """``key -> key group | key bytes`` in one Python call (the per-key hot path)."""
    groups = [_KEY_GROUP.pack(g) for g in range(max_key_groups)]
    crc32 = zlib.crc32
    encode = codec.encode
    if codec.single_kind == "string":

        def encode_string(key: Any) -> bytes:
            try:
                if len(key) == 1:
                    b = b"\x01%b\x00\x00" % key[0].encode().replace(b"\x00", b"\x00\xff")
                    return groups[crc32(b) % max_key_groups] + b
            except (AttributeError, TypeError):
                pass  # not a 1-tuple of str: the general encoder converts or names the problem
            b = encode(key)
            return groups[crc32(b) % max_key_groups] + b

        return encode_string
    if codec.single_kind == "integral":
        pack = _U64.pack

        def encode_int(key: Any) -> bytes:
            try:
                if len(key) == 1:
                    b = b"\x01" + pack(key[0] + _SIGN)
                    return groups[crc32(b) % max_key_groups] + b
            except (struct.error, TypeError):
                pass
            b = encode(key)
            return groups[crc32(b) % max_key_groups] + b

        return encode_int

    def encode_any(key: Any) -> bytes:
        b = encode(key)
        return groups[crc32(b) % max_key_groups] + b

    return encode_any


# -- values ---------------------------------------------------------------------------------------
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


def _slot(
    typ: DataType, what: str, path: str
) -> tuple[str, Callable[[Any], Any] | None, Callable[[Any], Any] | None, bool]:
    """(struct format, to-slot conversion, from-slot conversion, variable width) of one field."""
    name = typ.name
    if name in ("date",):
        return "i", _days, _from_days, False
    if name == "timestamp":
        return "q", _micros, _from_micros_utc, False
    if name == "timestamp_ntz":
        return "q", _micros, _from_micros_naive, False
    if name == "boolean":
        return "?", _bool, None, False
    if name in _FIXED_FORMAT:
        return _FIXED_FORMAT[name], None, None, False
    if name == "string":
        return "I", _text, lambda b: b.decode(), True
    if name == "binary":
        return "I", _blob, bytes, True
    if typ.decimal is not None:
        precision, scale = typ.decimal

        def dec_to(v: Any) -> bytes:
            n = _unscaled(v, precision, scale)
            return n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)

        def dec_from(b: bytes) -> decimal.Decimal:
            return decimal.Decimal(int.from_bytes(b, "little", signed=True)).scaleb(-scale)

        return "I", dec_to, dec_from, True
    if typ.is_struct:
        inner = ValueCodec(typ, what, path)
        return "I", inner.encode, inner.decode, True
    if name == "array":
        assert typ.element is not None
        elements = ListCodec(typ.element, what, f"{path}[]")
        return "I", elements.encode, elements.decode, True
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

    def __init__(self, schema: DataType, what: str, path: str = "") -> None:
        self.schema = schema
        self.what = what
        self.bare = not schema.is_struct
        fields = schema.fields if schema.is_struct else ()
        types = [f.type for f in fields] if fields else [schema]
        self.names = [f.name for f in fields] if fields else ["value"]
        self.paths = [f"{path}.{n}" if path else n for n in self.names]
        self.nullable = [f.nullable for f in fields] if fields else [True]
        slots = [_slot(t, what, p) for t, p in zip(types, self.paths, strict=True)]
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
            raise SchemaError(f"{self.what}: value {row!r} does not match the schema {shape} ({self.n} fields)")
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
                raise _field_error(self.what, self.paths[i], self.types[i], v, e) from None
            slots.append(x)
        head = self._row.pack(nulls.to_bytes(self.nbytes, "little"), *slots)
        return head + b"".join(var) if var else head

    def decode(self, raw: bytes, pos: int = 0) -> Any:
        t = self._row.unpack_from(raw, pos)
        if self._plain_decode:
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
        return out[0] if self.bare else tuple(out)


class ListCodec:
    """A list of values of one schema: ``u32 count`` then ``u32 length | value row`` per element."""

    def __init__(self, element: DataType, what: str, path: str = "") -> None:
        self.element = ValueCodec(element, what, path)

    def encode(self, values: Sequence[Any]) -> bytes:
        if not isinstance(values, list | tuple):
            raise SchemaError(f"{self.element.what}: expected a list, got {type(values).__name__}")
        enc = self.element.encode
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
        dec = self.element.decode
        out: list[Any] = []
        for _ in range(count):
            (n,) = _LEN.unpack_from(raw, pos)
            pos += 4
            if n == 0xFFFFFFFF:
                out.append(None)
                continue
            out.append(dec(raw[pos : pos + n]))
            pos += n
        return out


__all__ = [
    "MAX_KEY_GROUPS",
    "CorruptStateError",
    "KeyCodec",
    "ListCodec",
    "ValueCodec",
    "key_group",
    "stored_key_encoder",
    "with_key_group",
]
