"""Order-preserving byte encodings of typed keys, and the key group stored keys lead with.

Kept apart from the value encoding (`statekeeper.store.formats.typed_codec`) because keys have other
rules: RocksDB sorts them as unsigned bytes, so byte order must equal value order, and a rescale moves
key-group ranges, so every stored key leads with its group. docs/formats.md has the tables; in short:

- **Keys** (:class:`KeyCodec`): the fields of a typed tuple in order, each ``0x00`` (null) or ``0x01``
  followed by a fixed-width big-endian form whose unsigned byte order is the value order (integers of
  every width as ``u64(v + 2**63)``, floats as IEEE-754 doubles with the sign flipped, dates as
  ``u32(days + 2**31)``, timestamps as ``u64(micros + 2**63)``, decimals as ``u128(unscaled + 2**127)``),
  strings and binaries with ``0x00`` escaped as ``0x00 0xFF`` and ending in ``0x00 0x00``. So byte order
  equals value order, the encoding of a tuple is a prefix of the encodings of its extensions, and equal
  values (``5``, ``numpy.int64(5)``, ``5.0`` in a long field) give equal bytes.
- **Stored grouping keys** lead with the key group: ``u16 BE (crc32(key bytes) mod max_key_groups)``.
"""

from __future__ import annotations

import decimal
import math
import struct
import zlib
from collections.abc import Callable
from typing import Any

from statekeeper.store.formats.typed_scalars import (
    CorruptStateError,
    as_blob,
    as_bool,
    as_int,
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
from statekeeper.store.formats.typed_schema import INTEGRAL, DataType, SchemaError

_KEY_GROUP = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_D = struct.Struct(">d")
_SIGN = 1 << 63
_NULL = b"\x00"
_SOME = b"\x01"
_TRUE = b"\x01\x01"
_FALSE = b"\x01\x00"
MAX_KEY_GROUPS = 65536


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


KeyEncoder = Callable[[Any, list[bytes]], None]
KeyDecoder = Callable[[bytes, int], tuple[Any, int]]


def _escape(b: bytes) -> bytes:
    return _SOME + b.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def _read_escaped(raw: bytes, pos: int) -> tuple[bytes, int]:
    # an escaped body never holds 0x00 0x00 (each 0x00 is followed by 0xFF), so the first one ends it
    end = raw.index(b"\x00\x00", pos)
    body = raw[pos:end]
    return (body.replace(b"\x00\xff", b"\x00") if b"\x00" in body else body), end + 2


def _key_parts(typ: DataType, what: str, path: str, local_time: bool = False) -> tuple[KeyEncoder, KeyDecoder]:
    name = typ.name
    if typ.is_struct:
        subs = [_key_parts(f.type, what, f"{path}.{f.name}" if path else f.name, local_time) for f in typ.fields]
        encs = [e for e, _ in subs]
        decs = [d for _, d in subs]
        n = len(subs)
        names = [f.name for f in typ.fields]

        def enc_struct(v: Any, out: list[bytes]) -> None:
            if isinstance(v, dict):  # a struct as PySpark hands it in a key: by field name, not its keys' order
                if sorted(v) != sorted(names):
                    raise SchemaError(f"{what}: key {v!r} has fields {sorted(v)}, the schema {typ.simple_string()}")
                v = [v[name] for name in names]
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
        fixed = (lambda v: _U64.pack(as_int(v) + _SIGN), lambda r, p: _U64.unpack_from(r, p)[0] - _SIGN, 8)
    elif name in ("float", "double"):
        fixed = (lambda v: _U64.pack(_double_bits(v)), lambda r, p: _bits_double(_U64.unpack_from(r, p)[0]), 8)
    elif name == "date":
        fixed = (
            lambda v: _U32.pack(to_days(v) + (1 << 31)),
            lambda r, p: from_days(_U32.unpack_from(r, p)[0] - (1 << 31)),
            4,
        )
    elif name in ("timestamp", "timestamp_ntz"):
        local = local_time and name == "timestamp"  # PySpark's: naive, local time
        back = from_micros_local if local else from_micros_utc if name == "timestamp" else from_micros_naive
        to = to_micros_local if local else to_micros
        fixed = (lambda v: _U64.pack(to(v) + _SIGN), lambda r, p: back(_U64.unpack_from(r, p)[0] - _SIGN), 8)
    elif typ.decimal is not None:
        precision, scale = typ.decimal
        fixed = (
            lambda v: (unscaled(v, precision, scale) + (1 << 127)).to_bytes(16, "big"),
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
                raise field_error(what, path, typ, v, e) from None

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
                out.append(_TRUE if as_bool(v) else _FALSE)
            except TypeError as e:
                raise field_error(what, path, typ, v, e) from None

        def dec_bool(raw: bytes, pos: int) -> tuple[Any, int]:
            return (None, pos + 1) if raw[pos] == 0 else (raw[pos + 1] == 1, pos + 2)

        return enc_bool, dec_bool
    if name in ("string", "binary"):
        conv = as_text if name == "string" else as_blob

        def enc_var(v: Any, out: list[bytes]) -> None:
            if v is None:
                out.append(_NULL)
                return
            try:
                out.append(_escape(conv(v)))
            except TypeError as e:
                raise field_error(what, path, typ, v, e) from None

        def dec_var(raw: bytes, pos: int) -> tuple[Any, int]:
            if raw[pos] == 0:
                return None, pos + 1
            b, pos = _read_escaped(raw, pos + 1)
            return (b.decode() if name == "string" else b), pos

        return enc_var, dec_var
    raise SchemaError(f"{what}: field {path!r} has type {typ.simple_string()}, which cannot be part of a key")


class KeyCodec:
    """Order-preserving bytes of key tuples of one schema (a struct, or one atomic type)."""

    def __init__(self, schema: DataType, what: str, local_time: bool = False) -> None:
        """`local_time`: timestamps as PySpark hands them to a processor (naive, local time), else aware in UTC."""
        self.schema = schema
        self.what = what
        self.bare = not schema.is_struct
        self._enc, self._dec = _key_parts(schema, what, "" if schema.is_struct else "key", local_time)
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
        if self._single_string and raw[pos : pos + 1] == b"\x01" and raw.endswith(b"\x00\x00"):
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


__all__ = ["MAX_KEY_GROUPS", "KeyCodec", "key_group", "stored_key_encoder", "with_key_group"]
