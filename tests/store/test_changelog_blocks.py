"""A changelog block decodes to exactly the records encoded, on every path of the decoder: fixed-width
keys or values (split by one `struct` call), variable widths (sliced), deletes, empty values; and a
payload whose sizes do not add up is refused, naming the file."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.store.errors import CorruptFileError
from statekeeper.store.formats.changelog import decode_block_payload, encode_block_parts


@st.composite
def records(draw: st.DrawFn) -> tuple[list[bytes], list[bytes | None]]:
    n = draw(st.integers(1, 40))
    key_width = draw(st.one_of(st.none(), st.integers(0, 20)))  # None: variable-width keys
    value_width = draw(st.one_of(st.none(), st.integers(0, 20)))
    keys = [
        draw(st.binary(min_size=w, max_size=w) if (w := key_width) is not None else st.binary(max_size=20))
        for _ in range(n)
    ]
    value = st.binary(min_size=value_width, max_size=value_width) if value_width is not None else st.binary(max_size=20)
    deletes = draw(st.booleans())
    values = [draw(st.one_of(st.none(), value) if deletes else value) for _ in range(n)]
    return keys, values


@given(records())
def test_a_block_decodes_to_what_was_encoded(block: tuple[list[bytes], list[bytes | None]]) -> None:
    keys, values = block
    raw = b"".join(encode_block_parts(keys, values))
    assert decode_block_payload(raw, len(keys), "x.changelog") == (keys, values)


@given(records(), st.integers(-8, 8).filter(lambda d: d != 0))
def test_a_block_whose_sizes_do_not_add_up_is_refused(
    block: tuple[list[bytes], list[bytes | None]], delta: int
) -> None:
    keys, values = block
    raw = b"".join(encode_block_parts(keys, values))
    bad = raw[:delta] if delta < 0 else raw + bytes(delta)
    with pytest.raises(CorruptFileError, match=r"x\.changelog"):
        decode_block_payload(bad, len(keys), "x.changelog")


@pytest.mark.parametrize("width", [0, 1, 13])
@pytest.mark.parametrize("n", [255, 256, 257, 1000])
def test_a_long_fixed_width_block_decodes_to_what_was_encoded(width: int, n: int) -> None:
    keys = [i.to_bytes(4, "big") for i in range(n)]
    values: list[bytes | None] = [bytes([i % 251]) * width for i in range(n)]
    raw = b"".join(encode_block_parts(keys, values))
    assert decode_block_payload(raw, n, "x.changelog") == (keys, values)


@given(st.integers(250, 600), st.integers(0, 24), st.integers(-8, 8).filter(lambda d: d != 0))
def test_a_long_fixed_width_block_whose_sizes_do_not_add_up_is_refused(n: int, width: int, delta: int) -> None:
    """Runs of fixed-width pieces (cut `_RUN` at a time) refuse a payload cut short or padded, naming the file."""
    keys = [i.to_bytes(4, "big") for i in range(n)]
    raw = b"".join(encode_block_parts(keys, [b"v" * width] * n))
    bad = raw[:delta] if delta < 0 else raw + bytes(delta)
    with pytest.raises(CorruptFileError, match=r"x\.changelog"):
        decode_block_payload(bad, n, "x.changelog")


@given(st.integers(250, 600), st.integers(5, 2**31 - 1))  # each key is 4 bytes: 4 would be valid
def test_a_block_claiming_wider_pieces_than_it_holds_is_refused(n: int, width: int) -> None:
    """Valid-looking lengths (every key the same, huge, width) over a payload too small for them."""
    header = encode_block_parts([b"k" * 4] * n, [b""] * n)
    raw = struct.pack(f"<{n}I", *[width] * n) + header[1] + b"k" * 4 * n
    with pytest.raises(CorruptFileError, match=r"x\.changelog"):
        decode_block_payload(raw, n, "x.changelog")


def test_decoding_blocks_keeps_no_memory_once_they_are_dropped() -> None:
    """A replaying process (a Spark worker catching up a partition another worker committed) decodes block
    after block of distinct record counts: nothing of a block may stay behind once its records are dropped
    (the `struct` module's format cache kept ~36 bytes per record of the last 100 blocks)."""
    import gc
    import tracemalloc

    def decode(n: int) -> None:
        keys = [i.to_bytes(12, "big") for i in range(n)]
        raw = b"".join(encode_block_parts(keys, [b"v" * 16] * n))
        assert len(decode_block_payload(raw, n, "x.changelog")[0]) == n

    decode(10)  # first-call allocations
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(20_000, 20_040):
            decode(n)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1 << 20, f"decoding 40 blocks of ~20,000 records left {kept:,} bytes allocated"
