"""Typed state variables on a :class:`~store.StateStore`, and their on-disk encoding.

One column family per state variable. Keys and values are pickled Python objects (protocol 5, the
same bytes for the same value), so the state reader can decode any operator's state:

- grouping key ``gk`` = pickle(tuple of grouping values)
- ValueState / ListState: key ``gk``; a ListState keeps the whole list in one value
- MapState: key ``len(gk) u32 BE | gk | pickle(user key)``, so one key's entries are a prefix range
- value = ``0x00 | pickle(v)`` or, with a TTL, ``0x01 | expiry ms u64 BE | pickle(v)``
- ``__ttl``: ``expiry u64 BE | len(name) u16 | name | storage key`` -> b"" (index for eviction)
- ``__timers``: ``len(gk) u32 | gk | expiry u64`` and ``__timer_index``: ``expiry u64 | gk`` -> b""
- ``__meta``: ``b"rows_total"`` -> i64 BE; ``b"state/<name>"`` -> JSON {kind, ttl_ms}

Rows are counted exactly (numRowsTotal): one per ValueState/ListState key and one per MapState entry.
"""

# ruff: noqa: N802, N803 - method and argument names follow PySpark's state API

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Iterator, Sequence
from typing import Any

from store.errors import ConfigurationError, StoreStateError
from store.state_store import ColumnFamily, StateStore

PROTOCOL = 5
TAG_PLAIN = 0
TAG_TTL = 1
META_CF = "__meta"
TTL_CF = "__ttl"
TIMERS_CF = "__timers"
TIMER_INDEX_CF = "__timer_index"
INTERNAL_PREFIX = "__"
ROWS_TOTAL = b"rows_total"
STATE_META_PREFIX = b"state/"

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_I64 = struct.Struct(">q")
_MISSING: Any = object()
_dumps = pickle.dumps
_loads = pickle.loads
_PLAIN = bytes((TAG_PLAIN,))
_TTL = bytes((TAG_TTL,))


def encode_key(key: tuple[Any, ...]) -> bytes:
    return _dumps(key, PROTOCOL)


def decode_key(raw: bytes) -> Any:
    return _loads(raw)


def encode_value(value: Any, expiry_ms: int | None = None) -> bytes:
    if expiry_ms is None:
        return _PLAIN + _dumps(value, PROTOCOL)
    return _TTL + _U64.pack(max(0, expiry_ms)) + _dumps(value, PROTOCOL)


def decode_value(raw: bytes) -> tuple[Any, int | None]:
    """(value, expiry ms or None)."""
    if raw[0] == TAG_PLAIN:
        return _loads(raw[1:]), None
    if raw[0] == TAG_TTL:
        return _loads(raw[9:]), _U64.unpack_from(raw, 1)[0]
    raise StoreStateError(f"unknown state value tag {raw[0]}")


def value_expiry(raw: bytes) -> int | None:
    return _U64.unpack_from(raw, 1)[0] if raw[0] == TAG_TTL else None


def map_prefix(gk: bytes) -> bytes:
    return _U32.pack(len(gk)) + gk


def split_map_key(storage_key: bytes) -> tuple[bytes, bytes]:
    n = _U32.unpack_from(storage_key)[0]
    return storage_key[4 : 4 + n], storage_key[4 + n :]


def validate_state_name(name: str) -> str:
    if not isinstance(name, str) or not name or len(name.encode()) > 200 or name.startswith(INTERNAL_PREFIX):
        raise ConfigurationError(
            f"invalid state variable name {name!r}: 1-200 bytes, not starting with {INTERNAL_PREFIX!r}"
        )
    return name


class StateContext:
    """Per-task state of one partition: the store, the batch time, the current key and counters."""

    def __init__(self, store: StateStore, now_ms: int) -> None:
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

    # -- current key ----------------------------------------------------------------------------
    def set_key(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.gk = _dumps(key, PROTOCOL)

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

    def declare(self, name: str, kind: str, ttl_ms: int | None) -> None:
        key = STATE_META_PREFIX + name.encode()
        want = json.dumps({"kind": kind, "ttl_ms": ttl_ms}, sort_keys=True).encode()
        have = self._meta.get(key)
        if have == want:
            return
        if have is not None:
            old = json.loads(have)
            if old.get("kind") != kind:
                raise ConfigurationError(
                    f"state variable {name!r} is a {old.get('kind')} in the checkpoint, declared now as a {kind}; "
                    "use another name or handle.deleteIfExists() first"
                )
        self._meta.put(key, want)

    def undeclare(self, name: str) -> None:
        key = STATE_META_PREFIX + name.encode()
        if self._meta.get(key) is not None:
            self._meta.delete(key)

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
        self.timers_cf.put(map_prefix(gk) + e, b"")
        self.timer_index_cf.put(e + gk, b"")

    def delete_timer(self, expiry_ms: int) -> None:
        gk = self.require_gk()
        e = _U64.pack(max(0, int(expiry_ms)))
        if self.timers_cf.get(map_prefix(gk) + e) is not None:
            self.timers_cf.delete(map_prefix(gk) + e)
            self.timer_index_cf.delete(e + gk)

    def list_timers(self) -> Iterator[int]:
        prefix = map_prefix(self.require_gk())
        for k, _ in self.timers_cf.items(prefix=prefix):
            yield _U64.unpack_from(k, len(prefix))[0]

    def pop_expired_timers(self) -> list[tuple[bytes, int]]:
        """Remove and return every (gk, expiry) with expiry <= batch time, in time order."""
        if self._timer_index is None and TIMER_INDEX_CF not in self.store.column_families():
            return []
        idx = self.timer_index_cf
        fired = [(k[8:], _U64.unpack_from(k)[0]) for k, _ in idx.items(end=_U64.pack(self.now_ms + 1))]
        if fired:
            idx.delete_batch([_U64.pack(e) + gk for gk, e in fired])
            self.timers_cf.delete_batch([map_prefix(gk) + _U64.pack(e) for gk, e in fired])
        return fired


class _State:
    kind = ""

    def __init__(self, ctx: StateContext, name: str, ttl_ms: int | None) -> None:
        if ttl_ms is not None and (not isinstance(ttl_ms, int) or ttl_ms <= 0):
            raise ConfigurationError(f"ttlDurationMs of state {name!r} must be a positive integer, got {ttl_ms!r}")
        self._ctx = ctx
        self.name = name
        self._name_b = name.encode()
        self._ttl = ttl_ms
        self._cf = ctx.store.column_family(name)
        ctx.declare(name, self.kind, ttl_ms)

    def _live(self, raw: bytes | None) -> Any:
        """The decoded value, or _MISSING when absent or expired."""
        if raw is None:
            return _MISSING
        if raw[0] == TAG_PLAIN:
            return _loads(raw[1:])
        if _U64.unpack_from(raw, 1)[0] <= self._ctx.now_ms:
            return _MISSING
        return _loads(raw[9:])

    def _write(self, storage_key: bytes, value: Any, existed: bool) -> None:
        ctx = self._ctx
        expiry = None if self._ttl is None else ctx.now_ms + self._ttl
        self._cf.put(storage_key, encode_value(value, expiry))
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
    """One value per grouping key."""

    kind = "value"

    def __init__(self, ctx: StateContext, name: str, ttl_ms: int | None) -> None:
        super().__init__(ctx, name, ttl_ms)
        self._seen_gk: bytes | None = None  # the key of the last read, and whether a row was there
        self._seen_row = False

    def _read(self) -> Any:
        gk = self._ctx.require_gk()
        raw = self._cf.get(gk)
        self._seen_gk = gk
        self._seen_row = raw is not None
        return self._live(raw)

    def exists(self) -> bool:
        return self._read() is not _MISSING

    def get(self) -> Any:
        v = self._read()
        return None if v is _MISSING else v

    def update(self, newValue: Any) -> None:
        ctx = self._ctx
        gk = ctx.require_gk()
        existed = self._seen_row if gk is self._seen_gk else self._cf.get(gk) is not None
        self._seen_gk = gk
        self._seen_row = True
        if self._ttl is None:
            self._cf.put(gk, _PLAIN + _dumps(newValue, PROTOCOL))
            ctx.rows_updated += 1
            if not existed:
                ctx.rows_delta += 1
        else:
            self._write(gk, newValue, existed)

    def clear(self) -> None:
        self._seen_gk = None
        self._remove(self._ctx.require_gk())

    # -- bulk, with explicit keys ---------------------------------------------------------------
    def getMany(self, keys: Sequence[tuple[Any, ...]]) -> list[Any]:
        """The value of each key (None where absent or expired), in the order given."""
        raws = self._cf.multi_get([_dumps(k, PROTOCOL) for k in keys])
        live = self._live
        out = [live(r) for r in raws]
        return [None if v is _MISSING else v for v in out]

    def updateMany(self, keys: Sequence[tuple[Any, ...]], values: Sequence[Any]) -> None:
        if len(keys) != len(values):
            raise ConfigurationError(f"updateMany got {len(keys)} keys and {len(values)} values for {self.name!r}")
        self._seen_gk = None
        gks = [_dumps(k, PROTOCOL) for k in keys]
        existed = self._cf.multi_get(gks)
        ctx = self._ctx
        expiry = None if self._ttl is None else ctx.now_ms + self._ttl
        if expiry is None:
            self._cf.put_batch(gks, [_PLAIN + _dumps(v, PROTOCOL) for v in values])
        else:
            self._cf.put_batch(gks, [encode_value(v, expiry) for v in values])
            for gk in gks:
                ctx.index_ttl(self._name_b, gk, expiry)
        ctx.rows_updated += len(gks)
        ctx.rows_delta += sum(1 for e in existed if e is None)

    def clearMany(self, keys: Sequence[tuple[Any, ...]]) -> None:
        self._seen_gk = None
        gks = [_dumps(k, PROTOCOL) for k in keys]
        present = [gk for gk, raw in zip(gks, self._cf.multi_get(gks), strict=True) if raw is not None]
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

    def _skey(self, userKey: Any) -> bytes:
        return map_prefix(self._ctx.require_gk()) + _dumps(userKey, PROTOCOL)

    def _entries(self) -> Iterator[tuple[bytes, Any]]:
        prefix = map_prefix(self._ctx.require_gk())
        n = len(prefix)
        for k, raw in self._cf.items(prefix=prefix):
            v = self._live(raw)
            if v is not _MISSING:
                yield k[n:], v

    def exists(self) -> bool:
        return next(self._entries(), None) is not None

    def getValue(self, key: Any) -> Any:
        v = self._live(self._cf.get(self._skey(key)))
        return None if v is _MISSING else v

    def containsKey(self, key: Any) -> bool:
        return self._live(self._cf.get(self._skey(key))) is not _MISSING

    def updateValue(self, key: Any, value: Any) -> None:
        sk = self._skey(key)
        self._write(sk, value, self._cf.get(sk) is not None)

    def iterator(self) -> Iterator[tuple[Any, Any]]:
        return ((_loads(uk), v) for uk, v in list(self._entries()))

    def keys(self) -> Iterator[Any]:
        return (_loads(uk) for uk, _ in list(self._entries()))

    def values(self) -> Iterator[Any]:
        return (v for _, v in list(self._entries()))

    def removeKey(self, key: Any) -> None:
        self._remove(self._skey(key))

    def clear(self) -> None:
        prefix = map_prefix(self._ctx.require_gk())
        keys = [k for k, _ in self._cf.items(prefix=prefix)]
        if keys:
            self._cf.delete_batch(keys)
            self._ctx.rows_removed += len(keys)
            self._ctx.rows_delta -= len(keys)


class StatefulProcessorHandle:
    """What ``init`` gets: declares state variables and manages timers of the current key."""

    def __init__(self, ctx: StateContext) -> None:
        self._ctx = ctx

    def _get(self, cls: type[_State], name: str, ttl: int | None) -> Any:
        validate_state_name(name)
        existing = self._ctx.states.get(name)
        if existing is not None:
            if type(existing) is not cls:
                raise ConfigurationError(f"state variable {name!r} is already declared as a {existing.kind}")
            return existing
        state = cls(self._ctx, name, ttl)
        self._ctx.states[name] = state
        return state

    def getValueState(self, stateName: str, schema: Any = None, ttlDurationMs: int | None = None) -> ValueState:
        """`schema` is accepted for compatibility; values are any picklable Python objects."""
        return self._get(ValueState, stateName, ttlDurationMs)  # type: ignore[no-any-return]

    def getListState(self, stateName: str, schema: Any = None, ttlDurationMs: int | None = None) -> ListState:
        return self._get(ListState, stateName, ttlDurationMs)  # type: ignore[no-any-return]

    def getMapState(
        self, stateName: str, userKeySchema: Any = None, valueSchema: Any = None, ttlDurationMs: int | None = None
    ) -> MapState:
        return self._get(MapState, stateName, ttlDurationMs)  # type: ignore[no-any-return]

    def registerTimer(self, expiryTimestampMs: int) -> None:
        """A processing-time timer for the current key; fires in the first batch at or after it."""
        self._ctx.register_timer(expiryTimestampMs)

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._ctx.delete_timer(expiryTimestampMs)

    def listTimers(self) -> Iterator[int]:
        return iter(list(self._ctx.list_timers()))

    def deleteIfExists(self, stateName: str) -> None:
        """Drop every row of a state variable (in every key of this partition)."""
        validate_state_name(stateName)
        if stateName not in self._ctx.store.column_families():
            return
        self._ctx.states.pop(stateName, None)
        cf = self._ctx.store.column_family(stateName)
        keys = [k for k, _ in cf.items()]
        if keys:
            cf.delete_batch(keys)
            self._ctx.rows_removed += len(keys)
            self._ctx.rows_delta -= len(keys)
        self._ctx.undeclare(stateName)


__all__ = [
    "ListState",
    "MapState",
    "StateContext",
    "StatefulProcessorHandle",
    "ValueState",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
]
