"""Schema records of an operator's state, and the value format that reads every recorded schema.

The records live in the store's ``__meta`` column family, so they are committed atomically with the
batch that first writes under them (a schema change and the values written under it are one
changelog), snapshotted with the state, and read back by the state reader and maintenance:

- ``grouping_key`` -> Spark JSON of the grouping-key struct
- ``max_key_groups`` -> u32 BE, fixed at the first batch
- ``state/<name>`` -> JSON ``{"kind", "ttl_ms", "schema_id", "user_key_schema"}``
- ``schema/<name>/<schema id u32 BE>`` -> Spark JSON of the value schema (ListState: of one element)

A stored value is ``tag | [expiry u64 BE] | schema id (LEB128) | row``: tag ``0x53`` ('S') plain or
``0x54`` ('T') with an expiry; a TTL'd list whose elements expire apart (appended in different batches, as
Spark keeps an expiry per element) is ``0x55`` ('U') ``| earliest expiry u64 BE | run count (LEB128) |
(expiry u64 BE | elements (LEB128)) per run | schema id | list row``. docs/formats.md has the row layout.
Values of older schema ids are read through the current schema
(see :func:`statekeeper.store.formats.typed_schema.projector`).
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from statekeeper.store.column_family import ColumnFamily
from statekeeper.store.errors import ConfigurationError, CorruptFileError
from statekeeper.store.formats.framing import parse_json
from statekeeper.store.formats.limits import (
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_VERSIONS,
    MAX_SCHEMAS_BYTES,
    MAX_STATE_VARIABLES,
)
from statekeeper.store.formats.typed_codec import ListCodec, RowFactory, ValueCodec
from statekeeper.store.formats.typed_keys import MAX_KEY_GROUPS as KEY_GROUP_LIMIT
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.formats.typed_schema import (
    DataType,
    SchemaError,
    SchemaEvolutionError,
    from_json,
    from_json_value,
    projector,
)

META_CF = "__meta"
GROUPING_KEY = b"grouping_key"
MAX_KEY_GROUPS = b"max_key_groups"
STATE_META_PREFIX = b"state/"
SCHEMA_PREFIX = b"schema/"
TAG_PLAIN = 0x53
TAG_TTL = 0x54
TAG_RUNS = 0x55
DEFAULT_MAX_KEY_GROUPS = 1024
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_TTL_HEAD = bytes((TAG_TTL,))
_RUNS_HEAD = bytes((TAG_RUNS,))
_EXPIRY_TAGS = (TAG_TTL, TAG_RUNS)
_LEN = struct.Struct("<I")
MISSING: Any = object()

NEVER = 2**64
"""The earliest expiry of runs none of which expires (beyond any u64 expiry)."""

Runs = list[tuple[int | None, int]]
"""A list's elements in order as (expiry ms or None, how many): consecutive elements sharing an expiry."""


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = raw[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


@dataclass
class VariableRecord:
    """What the checkpoint records of one state variable."""

    kind: str
    ttl_ms: int | None = None
    schema_id: int = 0
    """The current value schema's id; 0 until the first value is written (schema inferred)."""
    user_key_schema: DataType | None = None
    schemas: dict[int, DataType] = field(default_factory=dict)

    def add_schema(self, name: str, schema: DataType) -> None:
        """Make `schema` variable `name`'s current value schema, under the next id (ids run 1, 2, ...: at most
        `MAX_SCHEMA_VERSIONS`, which a reader holds every record to)."""
        if len(self.schemas) >= MAX_SCHEMA_VERSIONS:
            raise SchemaEvolutionError(
                f"state variable {name!r} has {len(self.schemas)} value schemas recorded, the limit: declare it "
                "under another name, or handle.deleteIfExists() it first"
            )
        self.schema_id = max(self.schemas, default=0) + 1
        self.schemas[self.schema_id] = schema

    def payload(self) -> bytes:
        uk = None if self.user_key_schema is None else self.user_key_schema.json_value()
        doc = {"kind": self.kind, "ttl_ms": self.ttl_ms, "schema_id": self.schema_id, "user_key_schema": uk}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


class SchemaBytes:
    """The state variables' schema JSON read from one store's ``__meta`` so far: each value at most
    `MAX_SCHEMA_BYTES`, the variables' records and schemas at most `MAX_SCHEMAS_BYTES` in all (a writer records no
    more), checked before it is parsed."""

    def __init__(self) -> None:
        self.total = 0

    def take(self, raw: bytes, what: str, *, counted: bool = True) -> bytes:
        """`raw`, checked; `counted`: toward the total (the grouping key's one schema is not)."""
        if len(raw) > MAX_SCHEMA_BYTES:
            raise CorruptStateError(f"{what} is {len(raw)} bytes, above the limit of {MAX_SCHEMA_BYTES}")
        self.total += len(raw) if counted else 0
        if self.total > MAX_SCHEMAS_BYTES:
            raise CorruptStateError(
                f"{META_CF} records more than {MAX_SCHEMAS_BYTES} bytes of schemas, the limit (reading {what})"
            )
        return raw


def recorded_schema_bytes(meta: ColumnFamily) -> int:
    """The bytes of the state variables' records and schemas `meta` holds (what `SchemaBytes` counts when a
    reader takes them all)."""
    return sum(len(v) for prefix in (STATE_META_PREFIX, SCHEMA_PREFIX) for _k, v in meta.items(prefix=prefix))


def schema_key(name: str, schema_id: int) -> bytes:
    return SCHEMA_PREFIX + name.encode() + b"/" + _U32.pack(schema_id)


def read_record(meta: ColumnFamily, name: str, taken: SchemaBytes | None = None) -> VariableRecord | None:
    """Variable `name`'s record and schemas; `taken`: what the caller read of the same store before (a reader of
    every variable passes one, so that it holds at most `MAX_SCHEMAS_BYTES` of them)."""
    taken = taken or SchemaBytes()
    raw = meta.get(STATE_META_PREFIX + name.encode())
    if raw is None:
        return None
    taken.take(raw, f"the record of state variable {name!r}")
    try:
        doc = parse_json(raw, f"the record of state variable {name!r}")
        uk = doc.get("user_key_schema")
        record = VariableRecord(
            kind=str(doc["kind"]),
            ttl_ms=doc.get("ttl_ms"),
            schema_id=int(doc.get("schema_id", 0)),
            user_key_schema=None if uk is None else from_json_value(uk),
        )
        if not 0 <= record.schema_id <= MAX_SCHEMA_VERSIONS:
            raise ValueError(f"schema_id {record.schema_id} is not in 0..{MAX_SCHEMA_VERSIONS}")
    except (CorruptFileError, SchemaError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise CorruptStateError(f"the record of state variable {name!r} is unreadable: {str(e)[:200]}") from None
    prefix = SCHEMA_PREFIX + name.encode() + b"/"
    for k, v in meta.items(prefix=prefix):
        if len(k) != len(prefix) + 4:
            continue  # another variable's, whose name continues this one's past a "/"
        schema_id = _U32.unpack_from(k, len(prefix))[0]
        if not 1 <= schema_id <= MAX_SCHEMA_VERSIONS:  # ids run 1, 2, ...: so at most that many records are held
            raise CorruptStateError(
                f"schema {schema_id} of state variable {name!r} is not in 1..{MAX_SCHEMA_VERSIONS} (a {META_CF} key)"
            )
        try:
            record.schemas[schema_id] = from_json(taken.take(v, f"schema {schema_id} of state variable {name!r}"))
        except SchemaError as e:  # stored bytes, not a setting: a corrupt state, named
            raise CorruptStateError(f"schema {schema_id} of state variable {name!r} is unreadable: {e}") from None
    return record


def write_record(
    meta: ColumnFamily, name: str, record: VariableRecord, old: VariableRecord | None, recorded: Callable[[], int]
) -> int:
    """Record variable `name` (`old`: what the store records of it now); `recorded()`: the bytes of schemas the
    store records now (`recorded_schema_bytes`, asked only when something changes). Nothing is written when a
    schema would pass `MAX_SCHEMA_BYTES` or all of them `MAX_SCHEMAS_BYTES`, which a reader would refuse.
    Returns the bytes the records grew by."""
    puts: list[tuple[bytes, bytes, int]] = []  # (key, value, the bytes of the value it replaces)
    if old is None or old.payload() != record.payload():
        puts.append((STATE_META_PREFIX + name.encode(), record.payload(), 0 if old is None else len(old.payload())))
    for sid, schema in record.schemas.items():
        before = None if old is None else old.schemas.get(sid)
        if before != schema:
            replaced = 0 if before is None else len(before.to_json().encode())
            puts.append((schema_key(name, sid), schema.to_json().encode(), replaced))
    for _key, value, _replaced in puts:
        check_schema_size(value, f"state variable {name!r}")
    if not puts:
        return 0
    grown = sum(len(value) - replaced for _key, value, replaced in puts)
    if recorded() + grown > MAX_SCHEMAS_BYTES:
        raise ConfigurationError(
            f"state variable {name!r}: recording its schemas would make the store's {META_CF} hold more than "
            f"{MAX_SCHEMAS_BYTES} bytes of schemas, the limit; handle.deleteIfExists() the variables no longer used"
        )
    for key, value, _replaced in puts:
        meta.put(key, value)
    return grown


def check_schema_size(raw: bytes, what: str) -> None:
    """Refuse recording a schema of `what` whose JSON passes `MAX_SCHEMA_BYTES` (a reader would refuse it)."""
    if len(raw) > MAX_SCHEMA_BYTES:
        raise ConfigurationError(
            f"the schema of {what} is {len(raw)} bytes of JSON, above the limit of {MAX_SCHEMA_BYTES}"
        )


def delete_record(meta: ColumnFamily, name: str) -> None:
    keys = [k for k, _ in meta.items(prefix=SCHEMA_PREFIX + name.encode() + b"/")]
    if meta.get(STATE_META_PREFIX + name.encode()) is not None:
        keys.append(STATE_META_PREFIX + name.encode())
    if keys:
        meta.delete_batch(keys)


def variable_names(meta: ColumnFamily) -> list[str]:
    """The state variables recorded, at most `MAX_STATE_VARIABLES` (a writer records no more)."""
    names: list[str] = []
    for k, _ in meta.items(prefix=STATE_META_PREFIX):
        if len(names) == MAX_STATE_VARIABLES:
            raise CorruptStateError(f"{META_CF} records more than {MAX_STATE_VARIABLES} state variables, the limit")
        try:
            names.append(k[len(STATE_META_PREFIX) :].decode())
        except UnicodeDecodeError:
            raise CorruptStateError(f"{META_CF} key {bytes(k[:64])!r} names no state variable (not UTF-8)") from None
    return names


def read_grouping_key(meta: ColumnFamily, taken: SchemaBytes | None = None) -> DataType | None:
    raw = meta.get(GROUPING_KEY)
    if raw is None:
        return None
    try:
        return from_json((taken or SchemaBytes()).take(raw, "the grouping key's schema", counted=False))
    except SchemaError as e:  # stored bytes, not a setting: a corrupt state, named
        raise CorruptStateError(f"the grouping key's schema is unreadable: {e}") from None


def read_max_key_groups(meta: ColumnFamily) -> int | None:
    raw = meta.get(MAX_KEY_GROUPS)
    if raw is None:
        return None
    n = int(_U32.unpack(raw)[0]) if len(raw) == _U32.size else 0
    if not 1 <= n <= KEY_GROUP_LIMIT:
        raise CorruptStateError(
            f"the recorded max_key_groups {bytes(raw[:16])!r} is not a u32 in [1, {KEY_GROUP_LIMIT}]"
        )
    return n


@functools.cache
def spark_rows() -> RowFactory | None:
    """Nested structs decode as ``pyspark.sql.Row`` (as PySpark hands them to a processor) where PySpark
    is installed; tuples elsewhere (maintenance without the [spark] extra)."""
    try:
        from pyspark.sql import Row
    except ImportError:  # pragma: no cover - an install without the [spark] extra
        return None

    def factory(names: tuple[str, ...]) -> Callable[[tuple[Any, ...]], Any]:
        row_class = Row(*names)
        return lambda values: row_class(*values)

    return factory


class ValueFormat:
    """Encodes values under a variable's current schema and decodes values of any recorded schema."""

    def __init__(self, name: str, is_list: bool, where: str = "", local_time: bool = False) -> None:
        """`local_time`: timestamps as PySpark hands them to a processor (naive, local time), not aware in UTC."""
        self.name = name
        self.local_time = local_time
        self.is_list = is_list
        self.kind = "list" if is_list else "value"
        self.what = f"state variable {name!r}"
        self.where = where
        self.schema_id = 0
        self.schema: DataType | None = None
        self._history: dict[int, DataType] = {}
        self._encode: Callable[[Any], bytes] | None = None
        self._decode: Callable[[bytes, int], Any] = self._decode_empty
        self._plain_head = b""
        self._old: dict[int, Callable[[bytes, int], Any]] = {}
        self.encode: Callable[..., bytes] = self.encode_any
        """``encode(value, expiry_ms=None)``: one ``struct.pack`` for fixed-width rows (`ValueCodec.compile`)."""
        self.decode: Callable[..., Any] = self.decode_any
        """``decode(raw, now_ms=None)``: compiled to one ``struct.unpack`` for such rows."""

    def _codec(self, schema: DataType) -> ValueCodec | ListCodec:
        if self.is_list:
            return ListCodec(schema, self.what, rows=spark_rows(), local_time=self.local_time)
        return ValueCodec(schema, self.what, rows=spark_rows(), local_time=self.local_time)

    def use(self, schema_id: int, schema: DataType | None, history: dict[int, DataType]) -> None:
        self.schema_id = schema_id
        self.schema = schema
        self._history = dict(history)
        self._old.clear()
        if schema is None:
            self._encode = None
            self._decode = self._decode_empty
        else:
            codec = self._codec(schema)
            self._encode = codec.encode
            self._decode = codec.decode
        self._plain_head = bytes((TAG_PLAIN,)) + varint(schema_id)
        self.encode, self.decode = self.encode_any, self.decode_any
        if schema is not None and isinstance(codec, ValueCodec):
            self._compile(codec)

    def _compile(self, codec: ValueCodec) -> None:
        """One C call per value for the common case: plain header, fixed-width fields (nulls and booleans too)."""
        compiled = codec.compile(self._plain_head, self.encode_any, self.decode_any)
        if compiled is not None:
            self.encode, self.decode = compiled

    @staticmethod
    def _decode_empty(raw: bytes, pos: int) -> Any:
        if raw[pos:] == b"\x00\x00\x00\x00":
            return []
        raise CorruptStateError("a value of schema id 0 that is not an empty list")

    def encode_any(self, value: Any, expiry_ms: int | None = None) -> bytes:
        enc = self._encode
        if enc is None:
            raise SchemaError(f"{self.what} has no schema yet")
        if expiry_ms is None:
            return self._plain_head + enc(value)
        return bytes((TAG_TTL,)) + _U64.pack(max(0, expiry_ms)) + varint(self.schema_id) + enc(value)

    def encode_runs(self, values: list[Any], runs: Runs) -> bytes:
        """A TTL'd list whose runs of elements have their own expiries (`runs` covers `values`, no None)."""
        if len(runs) == 1:
            return self.encode_any(values, runs[0][0])
        enc = self._encode
        if enc is None:
            raise SchemaError(f"{self.what} has no schema yet")
        return runs_head(runs) + varint(self.schema_id) + enc(values)

    def decode_any(self, raw: bytes, now_ms: int | None = None) -> Any:
        """The value in the current schema; MISSING when expired at `now_ms` (a list whose elements expire
        apart: its live elements, MISSING when none is)."""
        try:
            tag = raw[0]
            runs = None
            if tag == TAG_PLAIN:
                pos = 1
            elif tag == TAG_TTL:
                if now_ms is not None and _U64.unpack_from(raw, 1)[0] <= now_ms:
                    return MISSING
                pos = 9
            elif tag == TAG_RUNS and self.is_list:
                runs, pos = read_runs(raw)
            else:
                raise CorruptStateError(
                    f"unknown value tag 0x{tag:02x}: not a statekeeper typed value of a {self.kind}"
                )
            sid = raw[pos]
            if sid < 0x80 and sid == self.schema_id:
                value = self._decode(raw, pos + 1)
            else:
                sid, pos = read_varint(raw, pos)
                value = self._decode(raw, pos) if sid == self.schema_id else self._old_decoder(sid)(raw, pos)
            if runs is None:
                return value
            return live_values(value, runs, now_ms) or MISSING
        except CorruptStateError as e:
            raise CorruptStateError(f"{self.what}{self.where}: {e}") from None
        except (IndexError, ValueError, struct.error, OverflowError, UnicodeDecodeError) as e:
            raise CorruptStateError(
                f"{self.what}{self.where}: a stored value does not decode under its recorded schema "
                f"(foreign or damaged bytes {bytes(raw[:16])!r}...): {e}"
            ) from None

    def decode_runs(self, raw: bytes) -> tuple[list[Any], Runs]:
        """A list's elements, expired ones too, and their runs (an expiry-less list: one run of None)."""
        value = self.decode_any(raw)
        if raw[:1] == _RUNS_HEAD:
            return value, read_runs(raw)[0]
        return value, [(expiry_of(raw), len(value))] if value else []

    def _old_decoder(self, sid: int) -> Callable[[bytes, int], Any]:
        dec = self._old.get(sid)
        if dec is not None:
            return dec
        if sid == 0:
            return self._decode_empty
        old = self._history.get(sid)
        if old is None:
            raise CorruptStateError(f"schema id {sid} is not recorded (recorded: {sorted(self._history)})")
        decode = self._codec(old).decode
        proj = None if self.schema is None else projector(old, self.schema, spark_rows())
        if proj is None:
            dec = decode
        elif self.is_list:
            p = proj

            def dec(raw: bytes, pos: int) -> Any:
                return [None if e is None else p(e) for e in decode(raw, pos)]
        else:
            q = proj

            def dec(raw: bytes, pos: int) -> Any:
                return q(decode(raw, pos))

        self._old[sid] = dec
        return dec


def expiry_of(raw: bytes) -> int | None:
    """A stored value's expiry, a list's earliest (None: no TTL); a TTL tag without its 8 bytes is a
    corrupt state."""
    if not raw or raw[0] not in _EXPIRY_TAGS:
        return None
    if len(raw) < 9:
        raise CorruptStateError(f"a TTL'd value {bytes(raw[:16])!r} is shorter than its expiry")
    return int(_U64.unpack_from(raw, 1)[0])


def runs_earliest(runs: Runs) -> int:
    """The earliest expiry of runs with at least one (an expiry-less run never expires)."""
    return min((int(e) for e, _ in runs if e is not None), default=NEVER)


def read_runs(raw: bytes) -> tuple[Runs, int]:
    """The runs of a tag 0x55 value and where its schema id starts; checked: at least two runs, each of at
    least one element, no more than the value's bytes can hold, the earliest expiry the one in the head."""
    count, pos = read_varint(raw, 9)
    if not 2 <= count <= (len(raw) - pos) // 9:
        raise CorruptStateError(f"{count} expiry runs in a value of {len(raw)} bytes")
    runs: Runs = []
    for _ in range(count):
        (expiry,) = _U64.unpack_from(raw, pos)
        n, pos = read_varint(raw, pos + 8)
        if not 1 <= n <= len(raw):
            raise CorruptStateError(f"an expiry run of {n} elements in a value of {len(raw)} bytes")
        runs.append((int(expiry), n))
    if runs_earliest(runs) != _U64.unpack_from(raw, 1)[0]:
        raise CorruptStateError("the head's earliest expiry is not its runs' earliest")
    return runs, pos


def live_values(values: list[Any], runs: Runs, now_ms: int | None) -> list[Any]:
    """The elements of the runs that have not expired at `now_ms`."""
    if sum(n for _, n in runs) != len(values):
        raise CorruptStateError(f"expiry runs of {sum(n for _, n in runs)} elements on a list of {len(values)}")
    if now_ms is None or runs_earliest(runs) > now_ms:
        return values
    kept: list[Any] = []
    pos = 0
    for e, n in runs:
        if e is None or e > now_ms:
            kept.extend(values[pos : pos + n])
        pos += n
    return kept


def merge_runs(runs: Runs) -> Runs:
    """Neighbouring runs of one expiry as one."""
    out: Runs = []
    for e, n in runs:
        if n and out and out[-1][0] == e:
            out[-1] = (e, out[-1][1] + n)
        elif n:
            out.append((e, n))
    return out


def drop_expired_elements(raw: bytes, now_ms: int) -> tuple[bytes | None, int, int | None]:
    """A tag 0x55 list without its elements expired at `now_ms`, on its bytes (no schema needed): (the value
    to keep or None when every element expired, elements dropped, the kept value's earliest expiry)."""
    try:
        runs, pos = read_runs(raw)
        _, body = read_varint(raw, pos)
        (count,) = _LEN.unpack_from(raw, body)
        if count != sum(n for _, n in runs):
            raise CorruptStateError(f"expiry runs of {sum(n for _, n in runs)} elements on a list of {count}")
        at = body + 4
        kept_runs: Runs = []
        parts: list[bytes] = []
        for e, n in runs:
            start = at
            for _ in range(n):
                (size,) = _LEN.unpack_from(raw, at)
                at += 4 + (0 if size == 0xFFFFFFFF else size)
            if at > len(raw):
                raise CorruptStateError("a list element runs past the value's end")
            if e is None or e > now_ms:
                kept_runs.append((e, n))
                parts.append(raw[start:at])
    except (IndexError, struct.error) as e:
        raise CorruptStateError(f"expiry runs that do not decode: {e}") from None
    kept = sum(n for _, n in kept_runs)
    if not kept:
        return None, count, None
    head = runs_head(kept_runs) if len(kept_runs) > 1 else _TTL_HEAD + _U64.pack(runs_earliest(kept_runs))
    return head + raw[pos:body] + _LEN.pack(kept) + b"".join(parts), count - kept, runs_earliest(kept_runs)


def runs_head(runs: Runs) -> bytes:
    """Tag 0x55, the earliest expiry and the runs (each with an expiry)."""
    parts = [_RUNS_HEAD, _U64.pack(max(0, runs_earliest(runs))), varint(len(runs))]
    parts += [_U64.pack(max(0, int(e or 0))) + varint(n) for e, n in runs]
    return b"".join(parts)


def list_length(raw: bytes) -> int:
    """The number of elements of a stored list (tag 0x53 or 0x54), read from its bytes."""
    try:
        _, pos = read_varint(raw, 9 if raw[0] == TAG_TTL else 1)
        return int(_LEN.unpack_from(raw, pos)[0])
    except (IndexError, struct.error):
        raise CorruptStateError(f"a list value {bytes(raw[:16])!r}... too short for its element count") from None


def element_expiries(raw: bytes, n: int) -> list[int | None]:
    """The expiry of each of a list value's `n` elements (stored, not filtered by time)."""
    if raw[:1] == _RUNS_HEAD:
        return [e for e, k in read_runs(raw)[0] for _ in range(k)]
    return [expiry_of(raw)] * n


def iter_values(cf: ColumnFamily, fmt: ValueFormat) -> Iterator[tuple[bytes, Any, int | None]]:
    """(storage key, value in the current schema, expiry) of every row of a variable, in key order."""
    for k, raw in cf.items():
        yield k, fmt.decode(raw), expiry_of(raw)


__all__ = [
    "DEFAULT_MAX_KEY_GROUPS",
    "GROUPING_KEY",
    "MAX_KEY_GROUPS",
    "META_CF",
    "MISSING",
    "NEVER",
    "TAG_PLAIN",
    "TAG_RUNS",
    "TAG_TTL",
    "Runs",
    "SchemaBytes",
    "ValueFormat",
    "VariableRecord",
    "check_schema_size",
    "delete_record",
    "drop_expired_elements",
    "element_expiries",
    "expiry_of",
    "iter_values",
    "list_length",
    "live_values",
    "merge_runs",
    "read_grouping_key",
    "read_max_key_groups",
    "read_record",
    "read_runs",
    "recorded_schema_bytes",
    "runs_earliest",
    "spark_rows",
    "variable_names",
    "write_record",
]
