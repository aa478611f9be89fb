"""PySpark's state variables (ValueState, ListState, MapState) on a partition's `StateContext`.

Each variable is one column family of the store; its values are typed rows (store/spark/schemas.py), with
an optional TTL indexed by the context. The encodings are listed in store/spark/state.py.
"""

# ruff: noqa: N802, N803 - method and argument names follow PySpark's state API

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.formats.typed_keys import KeyCodec
from statekeeper.store.formats.typed_schema import DataType, infer
from statekeeper.store.spark.schemas import (
    MISSING,
    Runs,
    ValueFormat,
    expiry_of,
    live_values,
    merge_runs,
    runs_earliest,
    spark_rows,
)
from statekeeper.store.spark.spark_errors import StateValueError
from statekeeper.store.spark.spark_order import unsafe_row_order
from statekeeper.store.spark.state import StateContext

_MISSING: Any = MISSING


def _OWN_ORDER(key: Any) -> bytes:  # a sentinel: keys whose Spark order is not emulated keep ours
    return b""


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
        self._fmt = ValueFormat(name, self.kind == "list", where, local_time=True)  # PySpark's timestamps
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
        r.add_schema(self.name, schema)
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

    def _refuse(self, what: str, spark_class: str, message: str) -> StateValueError:
        return StateValueError(
            f"{what}: [ILLEGAL_STATE_STORE_VALUE.{spark_class}] Illegal value provided to the State Store {message} "
            f"to State Store for StateName {self.name}."
        )

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
        self._seen_many: tuple[list[Any], list[bytes], int] | None = None
        """getMany's keys, their stored keys and how many held no row: what updateMany of the same keys needs."""

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
        if newValue is None:
            raise self._refuse("Error updating value state", "NULL_VALUE", "Cannot write null values")
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
        raws = self._cf.multi_get(gks)
        self._seen_many = (list(keys), gks, raws.count(None))
        decode, now = self._decode, self._ctx.now_ms
        values = [None if raw is None else decode(raw, now) for raw in raws]
        if _MISSING in values:  # expired (TTL)
            return [None if v is _MISSING else v for v in values]
        return values

    def updateMany(self, keys: Sequence[tuple[Any, ...]], values: Sequence[Any]) -> None:
        if len(keys) != len(values):
            raise ConfigurationError(f"updateMany got {len(keys)} keys and {len(values)} values for {self.name!r}")
        if not keys:
            return
        self._seen_gk = None
        seen, self._seen_many = self._seen_many, None
        if seen is not None and seen[0] == (keys if isinstance(keys, list) else list(keys)):
            gks, new_rows = seen[1], seen[2]  # the keys getMany just read: their encodings and how many are new
        else:
            enc = self._ctx.encode_gk
            gks = [enc(k) for k in keys]
            new_rows = self._cf.multi_get(gks).count(None)
        self._write_many(gks, values, new_rows)

    def _write_many(self, gks: list[bytes], values: Sequence[Any], new_rows: int) -> None:
        """Store `values` under the stored keys `gks`, `new_rows` of which held no value (the row count's
        change: an importer into an empty store knows it without a read per key)."""
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
        ctx.rows_delta += new_rows

    def clearMany(self, keys: Sequence[tuple[Any, ...]]) -> None:
        self._seen_gk = self._seen_many = None
        enc = self._ctx.encode_gk
        gks = [enc(k) for k in keys]
        present = [gk for gk, raw in zip(gks, self._cf.multi_get(gks), strict=True) if raw is not None]
        if present:
            self._cf.delete_batch(present)
        self._ctx.rows_removed += len(present)
        self._ctx.rows_delta -= len(present)


class ListState(_State):
    """A list per grouping key, stored as one value; with a TTL each element expires on its own, as in
    Spark (``put`` gives every element the same expiry, ``appendValue`` / ``appendList`` the new ones theirs).

    Appends are held in memory for the current key and written once when the context moves to another key
    (`StateContext.hold`): a processor appending row by row costs one write per key, not one rewrite of the
    whole list per row. Each append still encodes its new elements, so a value the schema cannot hold fails
    the call that passed it."""

    kind = "list"

    def __init__(self, ctx: StateContext, name: str, ttl_ms: int | None, schema: DataType | None = None) -> None:
        super().__init__(ctx, name, ttl_ms, schema)
        self._held_gk: bytes | None = None
        """The key whose list `_held` holds (with its appends, not yet written), or None."""
        self._held: list[Any] = []
        self._held_runs: Runs = []
        """With a TTL: the expiry runs of `_held` (expired elements stay until the batch's eviction)."""
        self._held_earliest: int | None = None
        """The earliest expiry of the stored value `_held` was read from (its TTL index entry)."""
        self._held_new = False
        """No row was stored for the held key and none is counted yet (`rows_delta`)."""

    def _gk(self) -> bytes:
        """The current key, after writing what is held for another."""
        gk = self._ctx.require_gk()
        if self._held_gk is not None and self._held_gk != gk:
            self.flush()
        return gk

    def _value_bytes(self, value: Any, expiry: int | None) -> bytes:
        if not self._record.schema_id:  # the first element fixes the schema (no null, no empty list is written)
            first = next((v for v in value if v is not None), None)
            if first is not None:
                self._infer(first)
        return self._encode(value, expiry)

    def _values(self) -> list[Any]:
        """The current key's live elements (the held list's own: a caller that keeps them copies them)."""
        gk = self._gk()
        if self._held_gk == gk:
            return self._held if self._ttl is None else live_values(self._held, self._held_runs, self._ctx.now_ms)
        v = self._live(self._cf.get(gk))
        return [] if v is _MISSING else v

    def exists(self) -> bool:
        return bool(self._values())

    def get(self) -> Iterator[Any]:
        values = self._values()
        return iter(values.copy() if self._held_gk is not None else values)  # later appends do not reach it

    def put(self, newState: Sequence[Any]) -> None:
        values = self._checked(newState, "Error updating list state")
        gk = self._gk()
        existed = not self._held_new if self._held_gk == gk else self._cf.get(gk) is not None
        self._held_gk = None  # replaced: nothing held is written
        self._write(gk, values, existed)

    def appendValue(self, newState: Any) -> None:
        self._append(self._checked([newState], "Error appending value to list state"))

    def appendList(self, newState: Sequence[Any]) -> None:
        self._append(self._checked(newState, "Error appending list to list state"))

    def _checked(self, values: Sequence[Any], what: str) -> list[Any]:
        """As PySpark: no empty list and no null element is stored."""
        out = [] if values is None else list(values)
        if not out:
            raise self._refuse(what, "EMPTY_LIST_VALUE", "Cannot write empty list values")
        if any(v is None for v in out):
            raise self._refuse(what, "NULL_VALUE", "Cannot write null values")
        return out

    def _append(self, new: list[Any]) -> None:
        ctx = self._ctx
        gk = self._gk()
        if self._held_gk != gk:
            self._hold(gk)
        # held as a read gives them back (PySpark's types, nothing the caller can still change): the new
        # elements through the codec, which also refuses a value the schema cannot hold
        new = self._decode(self._value_bytes(new, None), None)
        if self._ttl is not None:
            self._held_runs = merge_runs([*self._held_runs, (ctx.now_ms + self._ttl, len(new))])
        if self._held_new:
            ctx.rows_delta += 1  # a list where there was none
            self._held_new = False
        self._held.extend(new)
        ctx.rows_updated += 1

    def _hold(self, gk: bytes) -> None:
        """Read the key's list into memory for appends."""
        raw = self._cf.get(gk)
        self._held_gk, self._held_earliest, self._held_new = gk, None, raw is None
        if self._ttl is None:
            v = self._live(raw)
            self._held = [] if v is _MISSING else list(v)
        elif raw is None:
            self._held, self._held_runs = [], []
        else:
            # expired elements stay until the batch's eviction, which counts them (as Spark's does); elements
            # stored before the variable had a TTL take the new ones' expiry
            expiry = self._ctx.now_ms + self._ttl
            values, runs = self._fmt.decode_runs(raw)
            self._held, self._held_runs = values, [(expiry if e is None else e, n) for e, n in runs]
            self._held_earliest = expiry_of(raw)
        self._ctx.hold(self)

    def flush(self) -> None:
        """Write the list held for appends (the context calls this when it moves to another key)."""
        gk, self._held_gk = self._held_gk, None
        if gk is None or not self._held:
            return
        values, runs = self._held, self._held_runs
        self._held, self._held_runs = [], []
        if self._ttl is None:
            self._cf.put(gk, self._encode(values, None))
            return
        earliest = runs_earliest(runs)
        self._cf.put(gk, self._fmt.encode_runs(values, runs))
        if earliest != self._held_earliest:  # else its index entry stands
            self._ctx.index_ttl(self._name_b, gk, earliest)

    def drop_held(self) -> None:
        """Forget the held list without writing it (its attempt was aborted: `StateContext.next_batch`)."""
        self._held_gk, self._held, self._held_runs = None, [], []

    def clear(self) -> None:
        gk = self._gk()
        if self._held_gk == gk:
            self.flush()
        self._remove(gk)


class MapState(_State):
    """A map per grouping key; each entry is its own row (and has its own TTL)."""

    kind = "map"

    _uk: KeyCodec | None = None
    _one_field_key = False
    _order: Callable[[Any], bytes] | None = None

    def _use_record(self) -> None:
        super()._use_record()
        value_schema = self._record.schemas.get(self._record.schema_id)
        rows = spark_rows()
        self._value_row = (
            rows(tuple(f.name for f in value_schema.fields))
            if rows is not None and value_schema is not None and value_schema.is_struct
            else None
        )
        schema = self._record.user_key_schema
        if self._uk is None and schema is not None:
            self._uk = KeyCodec(schema, f"state variable {self.name!r}, map key", local_time=True)
            # a bare value for a one-field key struct, as PySpark takes one ("name string" keyed by "a")
            self._one_field_key = schema.is_struct and len(schema.fields) == 1

    def _uk_codec(self, userKey: Any) -> KeyCodec:
        if self._uk is None:
            schema = infer(userKey, f"state variable {self.name!r}, map key")
            self._record.user_key_schema = schema
            self._ctx.record_inferred(self.name, self._record)
            self._uk = KeyCodec(schema, f"state variable {self.name!r}, map key", local_time=True)
        return self._uk

    def _skey(self, userKey: Any) -> bytes:
        if userKey is None:
            raise self._refuse("Error using map state key", "NULL_VALUE", "Cannot write null values (the map key)")
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
        """The entry's value: a ``Row`` of the value schema's fields, as PySpark's ``getValue`` returns it (its
        ``iterator``, ``keys`` and ``values`` give tuples, as PySpark's do)."""
        if self._uk is None:
            return None
        v = self._live(self._cf.get(self._skey(key)))
        if v is _MISSING:
            return None
        return v if self._value_row is None else self._value_row(v)

    def containsKey(self, key: Any) -> bool:
        return self._uk is not None and self._live(self._cf.get(self._skey(key))) is not _MISSING

    def updateValue(self, key: Any, value: Any) -> None:
        if value is None:
            raise self._refuse("Error updating map state value", "NULL_VALUE", "Cannot write null values")
        sk = self._skey(key)
        self._write(sk, value, self._cf.get(sk) is not None)

    def iterator(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._items())

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self._items())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self._items())

    def _items(self) -> list[tuple[Any, Any]]:
        """The current key's live entries in the order PySpark iterates them (store/spark/spark_order.py)."""
        items = [(self._user_key(uk), v) for uk, v in self._entries()]
        if len(items) > 1 and self._record.user_key_schema is not None:
            if self._order is None:
                self._order = unsafe_row_order(self._record.user_key_schema) or _OWN_ORDER
            order = self._order
            if order is not _OWN_ORDER:
                items.sort(key=lambda item: order(item[0]))
        return items

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


__all__ = ["ListState", "MapState", "ValueState"]
