"""Typed state encodings: key order == value order, round trips, schemas, evolution, foreign bytes."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store import StateStore, StoreConfig
from statekeeper.store.formats.typed_codec import ListCodec, ValueCodec
from statekeeper.store.formats.typed_keys import KeyCodec, key_group, stored_key_encoder, with_key_group
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.formats.typed_schema import (
    DataType,
    SchemaError,
    SchemaEvolutionError,
    check_evolution,
    from_json,
    infer,
    parse_ddl,
    projector,
)
from statekeeper.store.spark.handle import StatefulProcessorHandle
from statekeeper.store.spark.schemas import ValueFormat
from statekeeper.store.spark.state import StateContext

UTC = dt.UTC
KEY_DDL = "i long, d double, s string, b binary, f boolean, day date, ts timestamp, amount decimal(12,3), n int"
KEY_SCHEMA = parse_ddl(KEY_DDL)

_doubles = st.floats(allow_nan=False, allow_infinity=True, width=64)
_decimals = st.decimals(min_value=-(10**9) + 1, max_value=10**9 - 1, places=3, allow_nan=False, allow_infinity=False)
_field_values: list[st.SearchStrategy[Any]] = [
    st.integers(-(2**63), 2**63 - 1),
    _doubles,
    st.text(),
    st.binary(),
    st.booleans(),
    st.dates(min_value=dt.date(1, 1, 1)),
    st.datetimes(min_value=dt.datetime(1, 1, 2), timezones=st.just(UTC)),
    _decimals,
    st.integers(-(2**31), 2**31 - 1),
]
_rows = st.tuples(*(st.none() | s for s in _field_values))


def _order_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is not None, 0.0 if isinstance(v, float) and v == 0 else v) for v in row)


@settings(max_examples=150, deadline=None)
@given(st.lists(_rows, min_size=2, max_size=12))
def test_key_bytes_sort_like_values(rows: list[tuple[Any, ...]]) -> None:
    codec = KeyCodec(KEY_SCHEMA, "key")
    by_value = sorted(rows, key=_order_key)
    by_bytes = sorted(rows, key=codec.encode)
    assert [_order_key(r) for r in by_bytes] == [_order_key(r) for r in by_value]
    for r in rows:
        assert _order_key(codec.decode(codec.encode(r))) == _order_key(r)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(), st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=8), st.text())
def test_key_prefixes_select_exactly_one_prefix(rows: list[tuple[str, int]], other: str) -> None:
    """The encoding of a tuple is a prefix of its extensions' encodings and of no other tuple's."""
    outer = KeyCodec(parse_ddl("s string"), "key")
    full = KeyCodec(parse_ddl("s string, n long"), "key")
    for s, n in rows:
        assert full.encode((s, n)).startswith(outer.encode((s,)))
        if other != s:
            assert not full.encode((s, n)).startswith(outer.encode((other,)))


def test_equal_values_of_different_python_types_are_one_key() -> None:
    codec = KeyCodec(parse_ddl("n long, x double"), "key")
    assert codec.encode((5, 1)) == codec.encode((np.int64(5), 1.0)) == codec.encode((5.0, np.float64(1)))
    assert codec.encode((0, 0.0)) == codec.encode((0, -0.0))
    assert codec.encode((0, float("nan"))) == codec.encode((0, -float("nan")))
    with pytest.raises(SchemaError, match=r"field 'n' \(long\) cannot hold 1.5"):
        codec.encode((1.5, 0.0))


_value_schema = parse_ddl(
    "count long not null, ratio double, name string, raw binary, ok boolean, day date, ts timestamp, "
    "amount decimal(20,4), tags array<string>, inner struct<a: int, b: string>"
)
_values = st.tuples(
    st.integers(-(2**63), 2**63 - 1),
    st.none() | st.floats(allow_nan=False),
    st.none() | st.text(),
    st.none() | st.binary(),
    st.none() | st.booleans(),
    st.none() | st.dates(),
    st.none() | st.datetimes(min_value=dt.datetime(1, 1, 2), timezones=st.just(UTC)),
    st.none() | st.decimals(min_value=-(10**15), max_value=10**15, places=4, allow_nan=False, allow_infinity=False),
    st.none() | st.lists(st.none() | st.text(), max_size=4),
    st.none() | st.tuples(st.none() | st.integers(-(2**31), 2**31 - 1), st.none() | st.text()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_values, max_size=5))
def test_values_round_trip(values: list[tuple[Any, ...]]) -> None:
    codec = ValueCodec(_value_schema, "v")
    for v in values:
        assert codec.decode(codec.encode(v)) == v
    lists = ListCodec(_value_schema, "v")
    assert lists.decode(lists.encode(values)) == values


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_values, max_size=4), st.binary(min_size=1, max_size=12), st.data())
def test_a_value_fills_its_bytes_exactly(values: list[tuple[Any, ...]], extra: bytes, data: st.DataObject) -> None:
    """Bytes after a stored value (a row, a list, a map of arrays), or a value cut short, are a CorruptStateError
    naming the variable: a value's bytes hold it exactly, so a reader never takes a well-formed prefix of other
    bytes for the value."""
    row, listed = ValueFormat("v", False), ValueFormat("v", True)
    row.use(1, _value_schema, {1: _value_schema})
    listed.use(1, _value_schema, {1: _value_schema})
    maps = ValueFormat("v", False)
    map_schema = parse_ddl("m map<string, array<long>>")
    maps.use(1, map_schema, {1: map_schema})
    stored = [(row, row.encode_any(v)) for v in values]
    stored += [(listed, listed.encode_any(values)), (maps, maps.encode_any(({"k": [1, 2], "e": []},)))]
    for fmt, raw in stored:
        with pytest.raises(CorruptStateError, match="'v'"):
            fmt.decode_any(raw + extra)
        with pytest.raises(CorruptStateError, match="'v'"):
            fmt.decode_any(raw[: data.draw(st.integers(0, len(raw) - 1))])


def test_bare_values_and_errors_name_variable_and_field() -> None:
    assert ValueCodec(parse_ddl("long"), "v").decode(ValueCodec(parse_ddl("long"), "v").encode(7)) == 7
    codec = ValueCodec(parse_ddl("count long not null, name string"), "state variable 'totals'")
    with pytest.raises(SchemaError, match=r"state variable 'totals': field 'count' \(long\) cannot hold 'x'"):
        codec.encode(("x", "a"))
    with pytest.raises(SchemaError, match=r"state variable 'totals': field 'count' is not nullable"):
        codec.encode((None, "a"))
    with pytest.raises(SchemaError, match="does not match the schema"):
        codec.encode((1,))
    # A value the schema cannot hold is a TypeError too, as PySpark's state clients raise for a non-tuple.
    for wrong in [7, (1,), ("x", "a")]:
        with pytest.raises(TypeError):
            codec.encode(wrong)
    with pytest.raises(TypeError, match="expected a list"):
        ListCodec(parse_ddl("n long"), "v").encode(7)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot hold"):
        ValueCodec(parse_ddl("m map<string, long>"), "v").encode(([1],))


def test_ddl_json_and_inference() -> None:
    s = parse_ddl("a int, `b c` string NOT NULL, d array<struct<x: bigint, y: decimal(5, 2)>>")
    assert s.simple_string() == "struct<a:integer,b c:string,d:array<struct<x:long,y:decimal(5,2)>>>"
    assert not s.fields[1].nullable
    assert from_json(s.to_json()) == s
    assert parse_ddl("long") == DataType("long")
    assert infer((1, "a", [1.5], True), "v").simple_string() == "struct<_1:long,_2:string,_3:array<double>,_4:boolean>"
    with pytest.raises(SchemaError, match="cannot infer a type from None"):
        infer((1, None), "state variable 'x'")
    with pytest.raises(SchemaError, match="cannot parse schema"):
        parse_ddl("a int,, b")


@pytest.mark.parametrize(
    ("old", "new", "value", "expected"),
    [
        ("a long, b string", "a long, b string, c double", (1, "x"), (1, "x", None)),  # added nullable
        ("a long, b string", "b string", (1, "x"), ("x",)),  # removed
        ("a long, b string", "b string, a long", (1, "x"), ("x", 1)),  # reordered
        ("a int, b float", "a long, b double", (1, 0.5), (1, 0.5)),  # widened
        ("a long, s struct<x: int, y: int>", "s struct<y: long>, a long", (1, (2, 3)), ((3,), 1)),  # nested
    ],
)
def test_compatible_evolution_reads_old_values(old: str, new: str, value: Any, expected: Any) -> None:
    before, after = parse_ddl(old), parse_ddl(new)
    check_evolution(before, after, "v")
    proj = projector(before, after)
    decoded = ValueCodec(before, "v").decode(ValueCodec(before, "v").encode(value))
    assert (decoded if proj is None else proj(decoded)) == expected


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        ("a long", "a string", r"field 'value.a' was long in the checkpoint and is declared string"),
        ("a long", "a int", r"field 'value.a' was long .* declared integer"),
        ("a long", "a long, b long not null", r"field 'value.b' \(long not null\) is new"),
        ("a long", "a long not null", r"field 'value.a' was nullable"),
        ("a double", "a float", r"field .value.a. was double in the checkpoint and is declared float"),
    ],
)
def test_incompatible_evolution_names_variable_field_and_types(old: str, new: str, match: str) -> None:
    with pytest.raises(SchemaEvolutionError, match=f"state variable 'v': {match}"):
        check_evolution(parse_ddl(old), parse_ddl(new), "v")


def _store(tmp_path: Path, name: str = "l") -> StateStore:
    return StateStore((tmp_path / "root").as_uri(), "op", 0, config=StoreConfig(local_dir=str(tmp_path / name)))


def _commit(store: StateStore) -> str:
    from statekeeper.store import CommitLog

    result = store.commit()
    CommitLog(store.fm).commit(result.version, {"op": [result.checkpoint_id]})
    return result.checkpoint_id


def test_schema_evolves_across_restarts_without_a_cap(tmp_path: Path) -> None:
    """Each restart declares a wider schema; every old value reads through the newest one."""
    schemas = ["a int", "a long, b string", "b string, a long", "b string, a long, c double", "c double, b string"]
    store = _store(tmp_path)
    store.load(0)
    for i, ddl in enumerate(schemas):
        ctx = StateContext(store, 0, parse_ddl("k long"))
        state = StatefulProcessorHandle(ctx).getValueState("v", ddl)
        ctx.set_key((i,))
        width = len(parse_ddl(ddl).fields)
        state.update(tuple({"a": i, "b": f"b{i}", "c": i / 2}[f.name] for f in parse_ddl(ddl).fields[:width]))
        ckpt = _commit(store)
        store.close()
        store = _store(tmp_path, f"l{i}")
        store.load(i + 1, ckpt)
    ctx = StateContext(store, 0, parse_ddl("k long"))
    state = StatefulProcessorHandle(ctx).getValueState("v", "c double, b string")
    got = []
    for i in range(len(schemas)):
        ctx.set_key((i,))
        got.append(state.get())
    assert got == [(None, None), (None, "b1"), (None, "b2"), (1.5, "b3"), (2.0, "b4")]
    assert ctx.declare("v", "value", None, parse_ddl("c double, b string"), None).schema_id == 5
    store.close()


def test_nested_structs_read_through_an_evolved_schema_are_rows(tmp_path: Path) -> None:
    """As the new schema's own decoder gives them (and PySpark hands them): ``Row``s of the new field names,
    at any depth (in arrays and map values too); the value itself stays a tuple."""
    from pyspark.sql import Row

    old_ddl = "a long, s struct<x: int, y: int>, l array<struct<p: int, q: int>>, m map<string, struct<u: int, v: int>>"
    new_ddl = "s struct<y: long>, a long, l array<struct<q: long>>, m map<string, struct<v: int>>"
    store = _store(tmp_path)
    store.load(0)
    ctx = StateContext(store, 0, parse_ddl("k long"))
    StatefulProcessorHandle(ctx).getValueState("v", old_ddl)
    ctx.set_key((1,))
    StatefulProcessorHandle(ctx).getValueState("v", old_ddl).update(
        (1, (2, 3), [(4, 5), None], {"k": (6, 7), "n": None})
    )
    ckpt = _commit(store)
    store.close()
    store = _store(tmp_path, "l2")
    store.load(1, ckpt)
    ctx = StateContext(store, 0, parse_ddl("k long"))
    state = StatefulProcessorHandle(ctx).getValueState("v", new_ddl)
    ctx.set_key((1,))
    got = state.get()
    assert type(got) is tuple and got == (Row(y=3), 1, [Row(q=5), None], {"k": Row(v=7), "n": None})
    assert got[0].y == 3 and got[2][0].q == 5 and got[3]["k"].v == 7  # type: ignore[union-attr]  # as on Rows
    assert isinstance(got[0], Row) and got[0].asDict() == {"y": 3}
    store.close()


def test_incompatible_schema_fails_at_start_and_writes_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.load(0)
    ctx = StateContext(store, 0, parse_ddl("k string"))
    StatefulProcessorHandle(ctx).getValueState("totals", "count long, total long")
    ckpt = _commit(store)
    store.load(1, ckpt)
    ctx = StateContext(store, 0, parse_ddl("k string"))
    with pytest.raises(SchemaEvolutionError, match=r"'totals': field 'value.total' was long .* declared string"):
        StatefulProcessorHandle(ctx).getValueState("totals", "count long, total string")
    with pytest.raises(SchemaEvolutionError, match="grouping key is struct<k:string> in the checkpoint"):
        StateContext(store, 0, parse_ddl("k long"))
    result = store.commit()
    assert result.metrics.records == 0  # the refused declarations wrote nothing
    store.close()


def test_schema_inferred_from_first_value_is_recorded(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.load(0)
    ctx = StateContext(store, 0)
    h = StatefulProcessorHandle(ctx)
    v, lst, m = h.getValueState("v"), h.getListState("l"), h.getMapState("m")
    ctx.set_key(("k", 1))
    v.update((1, "x"))
    lst.appendValue(2.5)
    m.updateValue(("u", 7), dt.date(2024, 1, 2))
    with pytest.raises(SchemaError, match=r"state variable 'v': field '_1' \(long\) cannot hold 'no'"):
        v.update(("no", "x"))
    ckpt = _commit(store)
    store.load(1, ckpt)
    ctx = StateContext(store, 0)
    h = StatefulProcessorHandle(ctx)
    rec = ctx.declare("v", "value", None, None, None)
    assert rec.schemas[rec.schema_id].simple_string() == "struct<_1:long,_2:string>"
    ctx.set_key(("k", 1))
    assert h.getValueState("v").get() == (1, "x")
    assert list(h.getListState("l").get()) == [2.5]
    assert dict(h.getMapState("m").iterator()) == {("u", 7): dt.date(2024, 1, 2)}
    store.close()


def test_foreign_bytes_are_refused_and_never_executed(tmp_path: Path) -> None:
    """A pickle payload where a value belongs raises CorruptStateError; its code never runs."""
    marker = tmp_path / "executed"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (marker,))

    payload = pickle.dumps(Exploit())
    fmt = ValueFormat("totals", False, " (operator op partition 0)")
    fmt.use(1, parse_ddl("count long"), {1: parse_ddl("count long")})
    for raw in (payload, b"\x53" + payload, b"\x53\x01" + payload[:3], b"\x53\x09" + payload):
        with pytest.raises(CorruptStateError, match=r"state variable 'totals' \(operator op partition 0\)"):
            fmt.decode(raw)
    assert not marker.exists()


def test_key_groups_are_stable_and_spread() -> None:
    codec = KeyCodec(parse_ddl("user string"), "key")
    groups = {key_group(codec.encode((f"user-{i}",)), 1024) for i in range(5000)}
    assert len(groups) > 900
    assert key_group(codec.encode(("alice",)), 1024) == key_group(codec.encode(("alice",)), 1024)
    assert not math.isnan(0.0)  # keep math imported for the NaN checks above
    assert (
        decimal.Decimal("1.000")
        == KeyCodec(parse_ddl("d decimal(5,3)"), "k").decode(
            KeyCodec(parse_ddl("d decimal(5,3)"), "k").encode((decimal.Decimal("1"),))
        )[0]
    )


_plain_rows = st.tuples(st.none() | st.integers(-(2**63), 2**63 - 1), st.none() | st.floats(allow_nan=False))


@settings(max_examples=100, deadline=None)
@given(st.lists(_plain_rows, max_size=6), st.none() | st.integers(0, 2**40))
def test_compiled_fast_paths_agree_with_the_checked_codec(rows: list[tuple[Any, ...]], expiry: int | None) -> None:
    schema = parse_ddl("n long, x double")
    fmt = ValueFormat("v", False)
    fmt.use(3, schema, {3: schema})
    for row in rows:
        raw = fmt.encode(row, expiry)
        assert raw == fmt.encode_any(row, expiry)
        assert fmt.decode(raw) == fmt.decode_any(raw) == row
    for kind, ddl, keys in (
        ("string", "k string", [("a",), ("a\x00b",), ("",)]),
        ("integral", "k int", [(0,), (-(2**31),), (7.0,)]),
    ):
        codec = KeyCodec(parse_ddl(ddl), "k")
        assert codec.single_kind == kind
        encode = stored_key_encoder(codec, 64)
        for key in keys:
            assert encode(key) == with_key_group(codec.encode(key), 64)
            assert codec.decode(encode(key), 2) == tuple(int(k) if kind == "integral" else k for k in key)


@given(micros=st.integers(-(2**63), 2**63 - 1))
@settings(max_examples=200, deadline=None)
def test_hostile_timestamps_in_processor_facing_state_are_a_corrupt_state(micros: int) -> None:
    """Any stored 8-byte timestamp, read as PySpark hands it (naive local time) from a value or a map key:
    a datetime, or CorruptStateError naming the variable -- never another exception."""
    fmt = ValueFormat("t", False, local_time=True)
    schema = parse_ddl("t timestamp")
    fmt.use(1, schema, {1: schema})
    plain = ValueFormat("t", False)
    plain.use(1, schema, {1: schema})
    raw = plain.encode((micros,))  # an int is stored as given: the bytes a hostile file could hold
    keys = KeyCodec(schema, "state variable 't', map key", local_time=True)
    key = KeyCodec(schema, "k").encode((micros,))
    for decode, data in ((fmt.decode, raw), (keys.decode, key)):
        try:
            value = decode(data)
        except CorruptStateError as e:
            assert "'t'" in str(e) or "key" in str(e)
        else:
            assert isinstance(value[0], dt.datetime) and value[0].tzinfo is None


@given(a=st.text(max_size=8), b=st.text(max_size=8), n=st.integers(-(2**63), 2**63 - 1))
def test_a_struct_in_a_key_as_a_dict_encodes_by_field_name(a: str, b: str, n: int) -> None:
    """PySpark hands a struct in a grouping key as a dict, which a processor passes back (getMany, updateMany): it
    encodes by field name, as the Row of the same fields does (it encoded the dict's keys, its field names, so every
    key of one struct type was the same key)."""
    codec = KeyCodec(parse_ddl("w struct<y: string, x: string>, n long"), "key")
    as_row = codec.encode(((a, b), n))
    assert codec.encode(({"x": b, "y": a}, n)) == as_row
    assert codec.decode(as_row) == ((a, b), n)
    with pytest.raises(SchemaError, match="fields"):
        codec.encode(({"y": a, "z": b}, n))
