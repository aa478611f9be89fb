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

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Protocol

from statekeeper.store.column_family import ColumnFamily
from statekeeper.store.errors import ConfigurationError, StoreStateError
from statekeeper.store.formats.limits import MAX_STATE_VARIABLES
from statekeeper.store.formats.typed_keys import MAX_KEY_GROUPS as KEY_GROUP_LIMIT
from statekeeper.store.formats.typed_keys import KeyCodec, stored_key_encoder
from statekeeper.store.formats.typed_scalars import CorruptStateError
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
    TAG_RUNS,
    VariableRecord,
    check_schema_size,
    delete_record,
    drop_expired_elements,
    expiry_of,
    list_length,
    read_grouping_key,
    read_max_key_groups,
    read_record,
    recorded_schema_bytes,
    variable_names,
    write_record,
)
from statekeeper.store.state_store import StateStore

TTL_CF = "__ttl"
TIMERS_CF = "__timers"
TIMER_INDEX_CF = "__timer_index"
INTERNAL_PREFIX = "__"
ROWS_TOTAL = b"rows_total"
INVALID_VALUE_SCHEMA_EVOLUTION = "[STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION]"
"""Spark's error class for a state variable's value schema that cannot read the recorded one: it heads our message
("... Schema evolution is not possible new value_schema=... and old value_schema=..." as Spark's), so code that
matches Spark's error (PySpark's own suite does) matches ours."""
KEY_GROUP_BYTES = 2

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_I64 = struct.Struct(">q")
_MISSING: Any = MISSING


def value_expiry(raw: bytes) -> int | None:
    return expiry_of(raw)


def ttl_entry(k: bytes) -> tuple[int, str, bytes]:
    """(expiry, state variable, storage key) of a ``__ttl`` index key: checked, as replayed changelogs wrote it."""
    n = _U16.unpack_from(k, 8)[0] if len(k) >= 10 else -1
    try:
        name = k[10 : 10 + n].decode() if 0 < n <= len(k) - 10 else ""
    except UnicodeDecodeError:
        name = ""
    if not name or name.startswith(INTERNAL_PREFIX) or len(k) < 10 + n + KEY_GROUP_BYTES + 1:
        raise CorruptStateError(f"{TTL_CF} key {bytes(k[:64])!r} is not expiry | name | storage key of a variable")
    return int(_U64.unpack_from(k)[0]), name, k[10 + n :]


def timer_entry(k: bytes) -> tuple[bytes, int]:
    """(grouping key, expiry) of a ``__timer_index`` key, checked as :func:`ttl_entry`."""
    if len(k) <= 8 + KEY_GROUP_BYTES:
        raise CorruptStateError(f"{TIMER_INDEX_CF} key {bytes(k[:64])!r} is not expiry | grouping key")
    return k[8:], int(_U64.unpack_from(k)[0])


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


class Declared(Protocol):
    """A declared state variable, as the context keeps it: its kind ("value", "list" or "map")."""

    kind: str


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
        self.api_counts: dict[str, int] = {}
        """Spark's transformWithState custom metrics the handle counts (``numValueStateVars``, ``numRegisteredTimers``,
        ...; `statekeeper.store.spark.metrics.TWS_METRICS`)."""
        self.states: dict[str, Declared] = {}
        """The state variables declared in this task (store/spark/state_variables.py), by name."""
        self._held: list[Any] = []
        """Variables holding the current key's writes in memory (a ListState's appends): written by `flush`."""
        self._flush_at_commit = False
        self._meta = store.column_family(META_CF)
        self._schema_bytes: int | None = None
        """The bytes of schemas the store records (`_recorded_schema_bytes`); None until a task records one."""
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
            self.use_key_schema(key_schema)
        if self.key_schema is not None and self._key_codec is None:
            self._use_key_codec(grouping_key_codec(self.key_schema))

    def use_key_schema(self, key_schema: DataType) -> None:
        """Check `key_schema` against the recorded grouping key, or record it: at construction, or later by a caller
        that learns the key's type only from its first key (the tester, store/spark/tws_tester.py)."""
        recorded = self.key_schema
        if recorded is not None and not key_compatible(recorded, key_schema):
            raise SchemaEvolutionError(
                f"the grouping key is {recorded.simple_string()} in the checkpoint and "
                f"{key_schema.simple_string()} now: keys cannot change their fields or types"
            )
        if recorded is None:
            self._record_key_schema(key_schema)

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
        raw = schema.to_json().encode()
        check_schema_size(raw, "the grouping key")
        self._meta.put(GROUPING_KEY, raw)
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
        if self._held:
            self.flush()
        self.key = key
        self.gk = self.encode_gk(key)

    def clear_key(self) -> None:
        self.flush()
        self.key = None
        self.gk = None

    def next_batch(self, now_ms: int) -> None:
        """Go on with this context (and the variables declared on it) into the store's next attempt at batch time
        `now_ms`, as the tester does, which initialises its processor once (store/spark/tws_tester.py): the batch's
        counters start at 0, and writes still held in memory (an aborted attempt's) are dropped, not written."""
        held, self._held = self._held, []
        for state in held:
            state.drop_held()
        self.key = self.gk = None
        self.now_ms = now_ms
        self.rows_updated = self.rows_removed = self.rows_delta = self.ttl_removed = 0
        self.api_counts = {}
        self._flush_at_commit = False
        self._schema_bytes = None
        self._groups_recorded = read_max_key_groups(self._meta) is not None
        if self.key_schema is not None and read_grouping_key(self._meta) is None:  # recorded in an aborted attempt
            self._record_key_schema(self.key_schema)

    def hold(self, state: Any) -> None:
        """`state` holds writes of the current key in memory until the next `flush` (a `flush()` method; `drop_held()`
        forgets them), at the latest the store's commit."""
        if not self._flush_at_commit:
            self.store.before_commit(self.flush)
            self._flush_at_commit = True
        self._held.append(state)

    def flush(self) -> None:
        """Write what variables hold in memory: before another key, and before the batch's end reads the store."""
        held, self._held = self._held, []
        for state in held:
            state.flush()

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
        if raw is None:
            return 0
        if len(raw) != _I64.size:
            raise CorruptStateError(f"the recorded {META_CF} row count {bytes(raw[:16])!r} is not an i64")
        return int(_I64.unpack(raw)[0])

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
        if old is None and len(variable_names(self._meta)) >= MAX_STATE_VARIABLES:  # what a reader holds
            raise ConfigurationError(
                f"state variable {name!r}: the store already records {MAX_STATE_VARIABLES} state variables, the "
                "limit; handle.deleteIfExists() the ones no longer used"
            )
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
                try:
                    check_evolution(old_schema, schema, name)
                except SchemaEvolutionError as e:
                    raise SchemaEvolutionError(
                        f"{INVALID_VALUE_SCHEMA_EVOLUTION} Schema evolution is not possible new value_schema="
                        f"{schema.simple_string()} and old value_schema={old_schema.simple_string()}: {e}"
                    ) from None
            record.add_schema(name, schema)
        self._write_record(name, record, old)
        return record

    def record_inferred(self, name: str, record: VariableRecord) -> None:
        self._write_record(name, record, read_record(self._meta, name))

    def _write_record(self, name: str, record: VariableRecord, old: VariableRecord | None) -> None:
        grown = write_record(self._meta, name, record, old, self._recorded_schema_bytes)
        if grown and self._schema_bytes is not None:
            self._schema_bytes += grown

    def _recorded_schema_bytes(self) -> int:
        """The bytes of schemas the store records (a reader holds at most `MAX_SCHEMAS_BYTES`): counted once a task
        first records a schema, then kept."""
        if self._schema_bytes is None:
            self._schema_bytes = recorded_schema_bytes(self._meta)
        return self._schema_bytes

    def undeclare(self, name: str) -> None:
        delete_record(self._meta, name)
        self._schema_bytes = None

    # -- TTL ------------------------------------------------------------------------------------
    def expiry_for(self, ttl_ms: int | None) -> int | None:
        return None if ttl_ms is None else self.now_ms + ttl_ms

    def index_ttl(self, name: bytes, storage_key: bytes, expiry_ms: int) -> None:
        self.ttl_cf.put(_U64.pack(expiry_ms) + _U16.pack(len(name)) + name + storage_key, b"")

    def next_expiry_ms(self) -> int | None:
        """When the earliest TTL'd value left in the partition expires (one seek: the TTL index leads with it)."""
        k = self._first_key(TTL_CF)
        return None if k is None else ttl_entry(k)[0]

    def evict_expired(self) -> int:
        """Remove every TTL'd row whose expiry is at or before the batch time (index entries too); of a list
        whose elements expire apart, the expired elements. Returns the rows removed."""
        self.flush()
        if self._ttl is None and TTL_CF not in self.store.column_families():
            return 0
        ttl = self.ttl_cf
        end = _U64.pack(self.now_ms + 1)
        stale: list[bytes] = []
        kept: list[tuple[str, bytes, bytes, int]] = []
        removed = 0
        known = set(self.store.column_families())
        kinds: dict[str, str | None] = {}
        for k, _ in ttl.items(end=end):
            stale.append(k)
            expiry, name, storage_key = ttl_entry(k)
            if name not in known:
                continue
            cf = self.store.column_family(name)
            raw = cf.get(storage_key)
            if raw is None or value_expiry(raw) != expiry:
                continue
            if raw[0] == TAG_RUNS:  # a list whose elements expire apart: the live ones stay
                rest, gone, earliest = drop_expired_elements(raw, self.now_ms)
                self.ttl_removed += gone
                if rest is not None and earliest is not None:
                    kept.append((name, storage_key, rest, earliest))
                    continue
            else:
                if name not in kinds:
                    kinds[name] = self._kind(name)
                self.ttl_removed += list_length(raw) if kinds[name] == "list" else 1
            cf.delete(storage_key)
            removed += 1
        if stale:
            ttl.delete_batch(stale)
        for name, storage_key, rest, earliest in kept:
            self.store.column_family(name).put(storage_key, rest)
            self.index_ttl(name.encode(), storage_key, earliest)
        self.rows_updated += len(kept)
        self.rows_removed += removed
        self.rows_delta -= removed
        return removed

    def _kind(self, name: str) -> str | None:
        declared = self.states.get(name)
        if declared is not None:
            return declared.kind
        record = read_record(self._meta, name)
        return None if record is None else record.kind

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

    def count(self, metric: str) -> None:
        """One more of Spark's transformWithState custom metric `metric` in this task."""
        self.api_counts[metric] = self.api_counts.get(metric, 0) + 1

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
        return [timer_entry(k) for k, _ in idx.items(end=_U64.pack(deadline + 1))]

    def next_timer_ms(self) -> int | None:
        """When the earliest timer left in the partition is due (one seek: the timer index leads with it)."""
        k = self._first_key(TIMER_INDEX_CF)
        return None if k is None else timer_entry(k)[1]

    def _first_key(self, cf: str) -> bytes | None:
        """The first key of internal column family `cf` (one seek), None when it is empty or absent."""
        if cf not in self.store.column_families():
            return None
        for k, _ in self.store.column_family(cf).items():
            return bytes(k)
        return None

    def pop_expired_timers(self, deadline_ms: int | None = None) -> list[tuple[bytes, int]]:
        """Remove and return every (gk, expiry) with expiry <= `deadline_ms` (default: the batch time),
        in time order."""
        fired = self.expired_timers(deadline_ms)
        if fired:
            idx = self.timer_index_cf
            idx.delete_batch([_U64.pack(e) + gk for gk, e in fired])
            self.timers_cf.delete_batch([gk + _U64.pack(e) for gk, e in fired])
        return fired


__all__ = ["KEY_GROUP_BYTES", "SchemaEvolutionError", "StateContext", "grouping_key_codec"]
