"""Rows with nulls and booleans on the one-``struct`` paths: the documented bytes, round trips, refusals.

The reference below writes the value row format of docs/formats.md by hand (null bitmap, then
little-endian fixed-width slots, zeros in a null's slot), so the fast paths are checked against the
format itself, not against another path of the same code.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.store.formats.null_patterns import MAX_NULL_PATTERNS
from statekeeper.store.formats.typed_codec import ListCodec, ValueCodec
from statekeeper.store.formats.typed_keys import KeyCodec
from statekeeper.store.formats.typed_schema import SchemaError, parse_ddl
from statekeeper.store.spark.schemas import TAG_PLAIN, ValueFormat

DDL = "n long not null, x double, ok boolean, small int, flag boolean"
SLOTS = "qd?i?"
SCHEMA = parse_ddl(DDL)
HEAD = bytes((TAG_PLAIN, 7))  # the plain tag and schema id 7 (one varint byte)

_rows = st.tuples(
    st.integers(-(2**63), 2**63 - 1),
    st.none() | st.floats(allow_nan=False),
    st.none() | st.booleans(),
    st.none() | st.integers(-(2**31), 2**31 - 1),
    st.none() | st.booleans(),
)


def reference(row: tuple[Any, ...], slots: str = SLOTS) -> bytes:
    """The row bytes as docs/formats.md specifies them."""
    nulls = sum(1 << i for i, v in enumerate(row) if v is None)
    body = b"".join(struct.pack("<" + f, 0 if v is None else v) for f, v in zip(slots, row, strict=True))
    return nulls.to_bytes((len(row) + 7) // 8, "little") + body


def _format() -> ValueFormat:
    fmt = ValueFormat("v", False)
    fmt.use(7, SCHEMA, {7: SCHEMA})
    return fmt


@settings(max_examples=200, deadline=None)
@given(st.lists(_rows, min_size=1, max_size=8), st.none() | st.integers(0, 2**40))
def test_rows_with_nulls_and_booleans_have_the_documented_bytes_and_round_trip(
    rows: list[tuple[Any, ...]], expiry: int | None
) -> None:
    codec = ValueCodec(SCHEMA, "v")
    fmt = _format()
    for row in rows:
        assert codec.encode(row) == reference(row)
        assert codec.decode(reference(row)) == row
        raw = fmt.encode(row, expiry)
        if expiry is None:
            assert raw == HEAD + reference(row)
        assert fmt.decode(raw) == fmt.decode_any(raw) == row
    lists = ListCodec(SCHEMA, "v")
    assert lists.decode(lists.encode(rows)) == rows


@pytest.mark.parametrize("value", [True, False, None])
def test_a_bare_boolean_has_the_documented_bytes(value: bool | None) -> None:
    schema = parse_ddl("v boolean").fields[0].type
    fmt = ValueFormat("v", False)
    fmt.use(7, schema, {7: schema})
    expected = HEAD + reference((value,), "?")
    assert fmt.encode(value) == expected == fmt.encode_any(value)
    assert fmt.decode(expected) is value
    assert ValueCodec(schema, "v").encode(value) == expected[len(HEAD) :]


def test_booleans_accept_numpy_and_refuse_other_types_naming_the_field() -> None:
    codec, fmt = ValueCodec(SCHEMA, "v"), _format()
    assert codec.encode((1, 2.0, np.bool_(True), 3, False)) == reference((1, 2.0, True, 3, False))
    assert fmt.encode((1, None, np.bool_(False), None, True)) == HEAD + reference((1, None, False, None, True))
    for row in ((1, 2.0, 1, 3, False), (1, None, None, 3, "yes")):
        for encode in (codec.encode, fmt.encode):
            with pytest.raises(SchemaError, match=r"field '(ok|flag)' \(boolean\) cannot hold"):
                encode(row)
    for encode in (codec.encode, fmt.encode):
        with pytest.raises(SchemaError, match="field 'n' is not nullable"):
            encode((None, 1.0, True, 2, False))


def test_every_null_pattern_past_the_cache_bound_keeps_the_format() -> None:
    width = 9  # 512 patterns, more than the cache keeps
    assert 2**width > MAX_NULL_PATTERNS
    schema = parse_ddl(", ".join(f"f{i} {'boolean' if i % 3 == 0 else 'long'}" for i in range(width)))
    slots = "".join("?" if i % 3 == 0 else "q" for i in range(width))
    fmt = ValueFormat("v", False)
    fmt.use(7, schema, {7: schema})
    full = tuple(i % 2 == 0 if i % 3 == 0 else i * 1000 for i in range(width))
    for nulls in itertools.product((False, True), repeat=width):
        row = tuple(None if null else v for null, v in zip(nulls, full, strict=True))
        raw = fmt.encode(row)
        assert raw == HEAD + reference(row, slots)
        assert fmt.decode(raw) == row


_keys = st.tuples(st.none() | st.booleans(), st.none() | st.integers(-(2**63), 2**63 - 1), st.none() | st.booleans())


def _order(key: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...]:
    return tuple((v is not None, v) for v in key)


@settings(max_examples=150, deadline=None)
@given(st.lists(_keys, min_size=2, max_size=12))
def test_keys_with_nulls_and_booleans_sort_like_values_and_round_trip(keys: list[tuple[Any, ...]]) -> None:
    codec = KeyCodec(parse_ddl("a boolean, n long, b boolean"), "key")
    assert [_order(k) for k in sorted(keys, key=codec.encode)] == sorted(_order(k) for k in keys)
    for k in keys:
        assert codec.decode(codec.encode(k)) == k
