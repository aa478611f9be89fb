"""Typed state variables on a :class:`~store.StateStore`, and their on-disk encoding.

One column family per state variable; keys and values are typed by schemas recorded in the
checkpoint (store/spark/schemas.py), never pickled:

- grouping key ``gk`` = ``key group u16 BE | order-preserving key`` (store/formats/typed_keys.py);
  the key group is ``crc32(key bytes) mod max_key_groups`` (fixed at the first batch)
- ValueState / ListState: key ``gk``; a ListState keeps the whole list in one value
- MapState: key ``gk | order-preserving user key``, so one key's entries are a prefix range
- value = ``0x53 | schema id | row`` or, with a TTL, ``0x54 | expiry ms u64 BE | schema id | row``
- ``__ttl``: ``expiry u64 BE | len(name) u16 | name | storage key`` -> b"" (index for eviction)
- ``__timers``: ``gk | expiry u64`` and ``__timer_index``: ``expiry u64 | gk`` -> b"" (time order)
- ``__meta``: ``b"rows_total"`` -> i64 BE, and the schema records of store/spark/schemas.py

Rows are counted exactly (numRowsTotal): one per ValueState/ListState key and one per MapState entry.
"""

# ruff: noqa: N802, N803 - method and argument names follow PySpark's state API

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

from statekeeper.store.column_family import ColumnFamily
from statekeeper.store.errors import ConfigurationError, StoreStateError
from statekeeper.store.formats.typed_keys import MAX_KEY_GROUPS as KEY_GROUP_LIMIT
from statekeeper.store.formats.typed_keys import KeyCodec, stored_key_encoder
from statekeeper.store.formats.typed_schema import (
    DataType,
    SchemaEvolutionError,
    check_evolution,
    infer,
    key_compatible,
)
from statekeeper.store.spark.schemas import (
    DEFAULT_MAX_KEY_GROUPS,
    GROUPING_KEY,
    MAX_KEY_GROUPS,
    META_CF,
    MISSING,
    ValueFormat,
    VariableRecord,
    delete_record,
    expiry_of,
    read_grouping_key,
    read_max_key_groups,
    read_record,
    write_record,
)
from statekeeper.store.state_store import StateStore

TTL_CF = "__ttl"
TIMERS_CF = "__timers"
TIMER_INDEX_CF = "__timer_index"
INTERNAL_PREFIX = "__"
ROWS_TOTAL = b"rows_total"
KEY_GROUP_BYTES = 2

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_I64 = struct.Struct(">q")
_MISSING: Any = MISSING


def value_expiry(raw: bytes) -> int | None:
    return expiry_of(raw)


def validate_state_name(name: str) -> str:
    if not isinstance(name, str) or not name or len(name.encode()) > 200 or name.startswith(INTERNAL_PREFIX):
        raise ConfigurationError(
            f"invalid state variable name {name!r}: 1-200 bytes, not starting with {INTERNAL_PREFIX!r}"
        )
    return name


def grouping_key_codec(schema: DataType) -> KeyCodec:
    return KeyCodec(schema, "grouping key")


def check_max_key_groups(n: int) -> int:
    if not isinstance(n, int) or not 1 <= n <= KEY_GROUP_LIMIT:
        raise ConfigurationError(f"max_key_groups must be an integer in [1, {KEY_GROUP_LIMIT}], got {n!r}")
    return n


class StateContext:
    """Per-task state of one partition: the store, the batch time, the current key and counters.

    `key_schema` is the grouping key's struct (the types of the key columns); without it the
    schema is recorded or inferred from the first key. It and `max_key_groups` are recorded in the
    checkpoint at the first batch; a later incompatible key schema is refused.
    """

    def __init__(
        self,
        store: StateStore,
        now_ms: int,
        key_schema: DataType | None = None,
        max_key_groups: int = DEFAULT_MAX_KEY_GROUPS,
    ) -> None:
        self.store = store
        self.now_ms = now_ms
        self.key: tuple[Any, ...] | None = None
        self.gk: bytes | None = None
        self.rows_updated = 0
        self.rows_removed = 0
        self.rows_delta = 0
        self.ttl_removed = 0
        self.states: dict[str, _State] = {}
        self._meta = store.column_family(META_CF)
        self._ttl: ColumnFamily | None = None
        self._timers: ColumnFamily | None = None
        self._timer_index: ColumnFamily | None = None
        recorded_groups = read_max_key_groups(self._meta)
        self.max_key_groups = recorded_groups or check_max_key_groups(max_key_groups)
        self._groups_recorded = recorded_groups is not None
        recorded = read_grouping_key(self._meta)
        self.key_schema: DataType | None = recorded
        self._key_codec: KeyCodec | None = None
        self.encode_gk: Any = self._encode_first_gk
        """``key tuple -> stored grouping key`` (key group | order-preserving key bytes)."""
        if key_schema is not None:
            if recorded is not None and not key_compatible(recorded, key_schema):
                raise SchemaEvolutionError(
                    f"the grouping key is {recorded.simple_string()} in the checkpoint and "
                    f"{key_schema.simple_string()} now: keys cannot change their fields or types"
                )
            if recorded is None:
                self._record_key_schema(key_schema)
        if self.key_schema is not None and self._key_codec is None:
            self._use_key_codec(grouping_key_codec(self.key_schema))

    def _use_key_codec(self, codec: KeyCodec) -> None:
        self._key_codec = codec
        self.encode_gk = stored_key_encoder(codec, self.max_key_groups)

    def _encode_first_gk(self, key: tuple[Any, ...]) -> bytes:
        """The first key of a store with no recorded key schema: infer and record it."""
        self._record_key_schema(infer(tuple(key), "grouping key"))
        encode: bytes = self.encode_gk(key)
        return encode

    def _record_key_schema(self, schema: DataType) -> None:
        self.key_schema = schema
        self._use_key_codec(grouping_key_codec(schema))
        self._meta.put(GROUPING_KEY, schema.to_json().encode())
        if not self._groups_recorded:
            self._meta.put(MAX_KEY_GROUPS, _U32.pack(self.max_key_groups))
            self._groups_recorded = True

    # -- current key ----------------------------------------------------------------------------
    def decode_gk(self, gk: bytes) -> Any:
        codec = self._key_codec
        if codec is None:
            raise StoreStateError("no grouping key schema is recorded in this store")
        return codec.decode(gk, KEY_GROUP_BYTES)

    def set_key(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.gk = self.encode_gk(key)

    def clear_key(self) -> None:
        self.key = None
        self.gk = None

    def require_gk(self) -> bytes:
        gk = self.gk
        if gk is None:
            raise StoreStateError(
                "no current grouping key: per-key state methods work inside handleInputRows / "
                "handleExpiredTimer; in a BatchStatefulProcessor use getMany / updateMany / clearMany"
            )
        return gk

    # -- internal column families ---------------------------------------------------------------
    @property
    def ttl_cf(self) -> ColumnFamily:
        if self._ttl is None:
            self._ttl = self.store.column_family(TTL_CF)
        return self._ttl

    @property
    def timers_cf(self) -> ColumnFamily:
        if self._timers is None:
            self._timers = self.store.column_family(TIMERS_CF)
        return self._timers

    @property
    def timer_index_cf(self) -> ColumnFamily:
        if self._timer_index is None:
            self._timer_index = self.store.column_family(TIMER_INDEX_CF)
        return self._timer_index

    def rows_total_before(self) -> int:
        raw = self._meta.get(ROWS_TOTAL)
        return _I64.unpack(raw)[0] if raw else 0

    def save_rows_total(self) -> int:
        total = self.rows_total_before() + self.rows_delta
        if self.rows_delta:
            self._meta.put(ROWS_TOTAL, _I64.pack(total))
        return total

    # -- schema records -------------------------------------------------------------------------
    def declare(
        self, name: str, kind: str, ttl_ms: int | None, schema: DataType | None, user_key_schema: DataType | None
    ) -> VariableRecord:
        """Record (or check against the checkpoint) a variable's kind, TTL and schemas; nothing is
        written when the declared schema cannot read the recorded one."""
        old = read_record(self._meta, name)
        if old is not None and old.kind != kind:
            raise ConfigurationError(
                f"state variable {name!r} is a {old.kind} in the checkpoint, declared now as a {kind}; "
                "use another name or handle.deleteIfExists() first"
            )
        record = (
            VariableRecord(kind, ttl_ms)
            if old is None
            else VariableRecord(kind, ttl_ms, old.schema_id, old.user_key_schema, dict(old.schemas))
        )
        if user_key_schema is not None:
            have = record.user_key_schema
            if have is not None and not key_compatible(have, user_key_schema):
                raise SchemaEvolutionError(
                    f"state variable {name!r}: the map key is {have.simple_string()} in the checkpoint and "
                    f"{user_key_schema.simple_string()} now: map keys cannot change their fields or types"
                )
            record.user_key_schema = user_key_schema
        if schema is not None and record.schemas.get(record.schema_id) != schema:
            for old_schema in record.schemas.values():
                check_evolution(old_schema, schema, name)
            record.schema_id = max(record.schemas, default=0) + 1
            record.schemas[record.schema_id] = schema
        write_record(self._meta, name, record, old)
        return record

    def record_inferred(self, name: str, record: VariableRecord) -> None:
        old = read_record(self._meta, name)
        write_record(self._meta, name, record, old)

    def undeclare(self, name: str) -> None:
        delete_record(self._meta, name)

    # -- TTL ------------------------------------------------------------------------------------
    def expiry_for(self, ttl_ms: int | None) -> int | None:
        return None if ttl_ms is None else self.now_ms + ttl_ms

    def index_ttl(self, name: bytes, storage_key: bytes, expiry_ms: int) -> None:
        self.ttl_cf.put(_U64.pack(expiry_ms) + _U16.pack(len(name)) + name + storage_key, b"")

    def evict_expired(self) -> int:
        """Remove every TTL'd row whose expiry is at or before the batch time (index entries too)."""
        if self._ttl is None and TTL_CF not in self.store.column_families():
            return 0
        ttl = self.ttl_cf
        end = _U64.pack(self.now_ms + 1)
        stale: list[bytes] = []
        removed = 0
        known = set(self.store.column_families())
        for k, _ in ttl.items(end=end):
            stale.append(k)
            expiry = _U64.unpack_from(k)[0]
            n = _U16.unpack_from(k, 8)[0]
            name = k[10 : 10 + n].decode()
            storage_key = k[10 + n :]
            if name not in known:
                continue
            cf = self.store.column_family(name)
            raw = cf.get(storage_key)
            if raw is not None and value_expiry(raw) == expiry:
                cf.delete(storage_key)
                removed += 1
        if stale:
            ttl.delete_batch(stale)
        self.rows_removed += removed
        self.rows_delta -= removed
        self.ttl_removed += removed
        return removed

    # -- timers ---------------------------------------------------------------------------------
    def register_timer(self, expiry_ms: int) -> None:
        gk = self.require_gk()
        e = _U64.pack(max(0, int(expiry_ms)))
        self.timers_cf.put(gk + e, b"")
        self.timer_index_cf.put(e + gk, b"")

    def delete_timer(self, expiry_ms: int) -> None:
        gk = self.require_gk()
        e = _U64.pack(max(0, int(expiry_ms)))
        if self.timers_cf.get(gk + e) is not None:
            self.timers_cf.delete(gk + e)
            self.timer_index_cf.delete(e + gk)

    def list_timers(self) -> Iterator[int]:
        prefix = self.require_gk()
        for k, _ in self.timers_cf.items(prefix=prefix):
            if len(k) == len(prefix) + 8:
                yield _U64.unpack_from(k, len(prefix))[0]

    def expired_timers(self, deadline_ms: int | None = None) -> list[tuple[bytes, int]]:
        """Every (gk, expiry) with expiry <= `deadline_ms` (default: the batch time), in time order, left in
        place: as in PySpark, a firing timer is listed (``listTimers``) until its handler has run, and
        the caller deletes it then (:meth:`delete_timer`)."""
        deadline = self.now_ms if deadline_ms is None else deadline_ms
        if deadline < 0:
            return []
        if self._timer_index is None and TIMER_INDEX_CF not in self.store.column_families():
            return []
        idx = self.timer_index_cf
        return [(k[8:], _U64.unpack_from(k)[0]) for k, _ in idx.items(end=_U64.pack(deadline + 1))]

    def pop_expired_timers(self, deadline_ms: int | None = None) -> list[tuple[bytes, int]]:
        """Remove and return every (gk, expiry) with expiry <= `deadline_ms` (default: the batch time),
        in time order."""
        fired = self.expired_timers(deadline_ms)
        if fired:
            idx = self.timer_index_cf
            idx.delete_batch([_U64.pack(e) + gk for gk, e in fired])
            self.timers_cf.delete_batch([gk + _U64.pack(e) for gk, e in fired])
        return fired


class _State:
    kind = ""

    def __init__(
        self,
        ctx: StateContext,
        name: str,
        ttl_ms: int | None,
        schema: DataType | None = None,
        user_key_schema: DataType | None = None,
    ) -> None:
        if ttl_ms is not None and (not isinstance(ttl_ms, int) or ttl_ms <= 0):
            raise ConfigurationError(f"ttlDurationMs of state {name!r} must be a positive integer, got {ttl_ms!r}")
        self._ctx = ctx
        self.name = name
        self._name_b = name.encode()
        self._ttl = ttl_ms
        self._record = ctx.declare(name, self.kind, ttl_ms, schema, user_key_schema)
        self._cf = ctx.store.column_family(name)
        where = f" (store {ctx.store.store_id.operator} partition {ctx.store.store_id.partition})"
        self._fmt = ValueFormat(name, self.kind == "list", where)
        self._use_record()

    def _use_record(self) -> None:
        r = self._record
        self._fmt.use(r.schema_id, r.schemas.get(r.schema_id), r.schemas)
        self._encode = self._fmt.encode
        self._decode = self._fmt.decode
        self._plain_ok = self._ttl is None and r.schema_id > 0

    def _infer(self, value: Any) -> None:
        """Record the schema of the first value written to a variable declared without one."""
        if self._record.schema_id:
            return
        schema = infer(value, f"state variable {self.name!r}")
        r = self._record
        r.schema_id = max(r.schemas, default=0) + 1
        r.schemas[r.schema_id] = schema
        self._ctx.record_inferred(self.name, r)
        self._use_record()

    def _live(self, raw: bytes | None) -> Any:
        """The decoded value, or _MISSING when absent or expired."""
        if raw is None:
            return _MISSING
        return self._decode(raw, self._ctx.now_ms)

    def _value_bytes(self, value: Any, expiry: int | None) -> bytes:
        if not self._record.schema_id:
            self._infer(value)
        return self._encode(value, expiry)

    def _write(self, storage_key: bytes, value: Any, existed: bool) -> None:
        ctx = self._ctx
        expiry = None if self._ttl is None else ctx.now_ms + self._ttl
        self._cf.put(storage_key, self._value_bytes(value, expiry))
        if expiry is not None:
            ctx.index_ttl(self._name_b, storage_key, expiry)
        ctx.rows_updated += 1
        if not existed:
            ctx.rows_delta += 1

    def _remove(self, storage_key: bytes) -> bool:
        if self._cf.get(storage_key) is None:
            return False
        self._cf.delete(storage_key)
        self._ctx.rows_removed += 1
        self._ctx.rows_delta -= 1
        return True


class ValueState(_State):
    """One value per grouping key: a tuple for a struct schema, a bare value for an atomic one."""

    kind = "value"

    def __init__(self, ctx: StateContext, name: str, ttl_ms: int | None, schema: DataType | None = None) -> None:
        super().__init__(ctx, name, ttl_ms, schema)
        self._seen_gk: bytes | None = None  # the key of the last read, and whether a row was there
        self._seen_row = False
        self._seen_many: tuple[list[Any], list[bytes], list[bytes | None]] | None = None  # getMany's, likewise

    def _read(self) -> Any:
        gk = self._ctx.require_gk()
        raw = self._cf.get(gk)
        self._seen_gk = gk
        self._seen_row = raw is not None
        return self._live(raw)

    def exists(self) -> bool:
        return self._read() is not _MISSING

    def get(self) -> Any:
        gk = self._ctx.gk or self._ctx.require_gk()  # _read and _live inlined: the per-key hot path
        raw = self._cf.get(gk)
        self._seen_gk = gk
        self._seen_row = raw is not None
        if raw is None:
            return None
        v = self._decode(raw, self._ctx.now_ms)
        return None if v is _MISSING else v

    def update(self, newValue: Any) -> None:
        ctx = self._ctx
        gk = ctx.gk or ctx.require_gk()
        existed = self._seen_row if gk is self._seen_gk else self._cf.get(gk) is not None
        self._seen_gk = gk
        self._seen_row = True
        self._seen_many = None
        if self._plain_ok:
            self._cf.put(gk, self._encode(newValue))
            ctx.rows_updated += 1
            if not existed:
                ctx.rows_delta += 1
        else:
            self._write(gk, newValue, existed)

    def clear(self) -> None:
        self._seen_gk = self._seen_many = None
        self._remove(self._ctx.require_gk())

    # -- bulk, with explicit keys ---------------------------------------------------------------
    def getMany(self, keys: Sequence[tuple[Any, ...]]) -> list[Any]:
        """The value of each key (None where absent or expired), in the order given."""
        enc = self._ctx.encode_gk
        gks = [enc(k) for k in keys]
        raws = self._get_each(gks)
        self._seen_many = (list(keys), gks, raws)
        decode, now = self._decode, self._ctx.now_ms
        values = [None if raw is None else decode(raw, now) for raw in raws]
        if _MISSING in values:  # expired (TTL)
            return [None if v is _MISSING else v for v in values]
        return values

    def _get_each(self, gks: list[bytes]) -> list[bytes | None]:
        """The stored value of each key: a point get each (rocksdict's batched get costs ~1.6x as much per
        key, in the memtable and in SSTs alike)."""
        return list(map(self._cf.get, gks))

    def updateMany(self, keys: Sequence[tuple[Any, ...]], values: Sequence[Any]) -> None:
        if len(keys) != len(values):
            raise ConfigurationError(f"updateMany got {len(keys)} keys and {len(values)} values for {self.name!r}")
        if not keys:
            return
        self._seen_gk = None
        seen, self._seen_many = self._seen_many, None
        if seen is not None and seen[0] == (keys if isinstance(keys, list) else list(keys)):
            gks, existed = seen[1], seen[2]  # the keys getMany just read: their encodings and presence
        else:
            enc = self._ctx.encode_gk
            gks = [enc(k) for k in keys]
            existed = self._get_each(gks)
        ctx = self._ctx
        expiry = None if self._ttl is None else ctx.now_ms + self._ttl
        if not self._record.schema_id:
            self._infer(values[0])
        encode = self._encode
        self._cf.put_batch(gks, [encode(v, expiry) for v in values])
        if expiry is not None:
            for gk in gks:
                ctx.index_ttl(self._name_b, gk, expiry)
        ctx.rows_updated += len(gks)
        ctx.rows_delta += sum(1 for e in existed if e is None)

    def clearMany(self, keys: Sequence[tuple[Any, ...]]) -> None:
        self._seen_gk = self._seen_many = None
        enc = self._ctx.encode_gk
        gks = [enc(k) for k in keys]
        present = [gk for gk, raw in zip(gks, self._get_each(gks), strict=True) if raw is not None]
        if present:
            self._cf.delete_batch(present)
        self._ctx.rows_removed += len(present)
        self._ctx.rows_delta -= len(present)


class ListState(_State):
    """A list per grouping key, stored as one value (a TTL applies to the list as a whole)."""

    kind = "list"

    def _current(self) -> tuple[bytes, bytes | None, Any]:
        gk = self._ctx.require_gk()
        raw = self._cf.get(gk)
        return gk, raw, self._live(raw)

    def _value_bytes(self, value: Any, expiry: int | None) -> bytes:
        if not self._record.schema_id:
            first = next((v for v in value if v is not None), None)
            if first is None:
                return self._fmt.encode_empty_list(expiry)
            self._infer(first)
        return self._encode(value, expiry)

    def exists(self) -> bool:
        return self._current()[2] is not _MISSING

    def get(self) -> Iterator[Any]:
        v = self._current()[2]
        return iter(() if v is _MISSING else v)

    def put(self, newState: Sequence[Any]) -> None:
        gk, raw, _ = self._current()
        self._write(gk, list(newState), raw is not None)

    def appendValue(self, newState: Any) -> None:
        gk, raw, v = self._current()
        self._write(gk, [*(() if v is _MISSING else v), newState], raw is not None)

    def appendList(self, newState: Sequence[Any]) -> None:
        gk, raw, v = self._current()
        self._write(gk, [*(() if v is _MISSING else v), *newState], raw is not None)

    def clear(self) -> None:
        self._remove(self._ctx.require_gk())


class MapState(_State):
    """A map per grouping key; each entry is its own row (and has its own TTL)."""

    kind = "map"

    _uk: KeyCodec | None = None
    _one_field_key = False

    def _use_record(self) -> None:
        super()._use_record()
        schema = self._record.user_key_schema
        if self._uk is None and schema is not None:
            self._uk = KeyCodec(schema, f"state variable {self.name!r}, map key")
            # a bare value for a one-field key struct, as PySpark takes one ("name string" keyed by "a")
            self._one_field_key = schema.is_struct and len(schema.fields) == 1

    def _uk_codec(self, userKey: Any) -> KeyCodec:
        if self._uk is None:
            schema = infer(userKey, f"state variable {self.name!r}, map key")
            self._record.user_key_schema = schema
            self._ctx.record_inferred(self.name, self._record)
            self._uk = KeyCodec(schema, f"state variable {self.name!r}, map key")
        return self._uk

    def _skey(self, userKey: Any) -> bytes:
        key = (userKey,) if self._one_field_key and not isinstance(userKey, tuple | list) else userKey
        return self._ctx.require_gk() + (self._uk or self._uk_codec(key)).encode(key)

    def _entries(self) -> Iterator[tuple[bytes, Any]]:
        prefix = self._ctx.require_gk()
        n = len(prefix)
        for k, raw in self._cf.items(prefix=prefix):
            v = self._live(raw)
            if v is not _MISSING:
                yield k[n:], v

    def _user_key(self, raw: bytes) -> Any:
        assert self._uk is not None
        return self._uk.decode(raw)

    def exists(self) -> bool:
        return next(self._entries(), None) is not None

    def getValue(self, key: Any) -> Any:
        if self._uk is None:
            return None
        v = self._live(self._cf.get(self._skey(key)))
        return None if v is _MISSING else v

    def containsKey(self, key: Any) -> bool:
        return self._uk is not None and self._live(self._cf.get(self._skey(key))) is not _MISSING

    def updateValue(self, key: Any, value: Any) -> None:
        sk = self._skey(key)
        self._write(sk, value, self._cf.get(sk) is not None)

    def iterator(self) -> Iterator[tuple[Any, Any]]:
        return ((self._user_key(uk), v) for uk, v in list(self._entries()))

    def keys(self) -> Iterator[Any]:
        return (self._user_key(uk) for uk, _ in list(self._entries()))

    def values(self) -> Iterator[Any]:
        return (v for _, v in list(self._entries()))

    def removeKey(self, key: Any) -> None:
        if self._uk is not None:
            self._remove(self._skey(key))

    def clear(self) -> None:
        prefix = self._ctx.require_gk()
        keys = [k for k, _ in self._cf.items(prefix=prefix)]
        if keys:
            self._cf.delete_batch(keys)
            self._ctx.rows_removed += len(keys)
            self._ctx.rows_delta -= len(keys)


__all__ = [
    "KEY_GROUP_BYTES",
    "ListState",
    "MapState",
    "SchemaEvolutionError",
    "StateContext",
    "ValueState",
    "grouping_key_codec",
]
