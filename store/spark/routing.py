"""Routing rows to the partition that owns their key group, computed by Spark itself, and the values
that steer Spark's hash partitioning to each partition (`hash_routes`, Spark's Murmur3 in Python).

The executor stores each grouping key under key group ``crc32(encoded key) mod G`` (docs/formats.md,
"Keys"). For a partition to own a contiguous range of key groups, Spark must send a row to the
partition whose range holds that same group. This module writes the order-preserving key encoding
as a Spark SQL expression (binary, for the supported key types) so Spark computes
``pmod(crc32(encoded key), G)`` exactly as Python does, then the owner ``((g + 1) * n - 1) div G`` of
`statekeeper.store.key_groups.KeyGroupLayout`. Keys of other types (floating point, decimal, nested) cannot be
routed this way: such operators keep Spark's hash routing and cannot be rescaled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.key_groups import KeyGroupLayout

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType, StructType

_SIGN_FLIP = "shiftleft(cast(1 as bigint), 63)"
_INTEGRAL = ("ByteType", "ShortType", "IntegerType", "LongType")


def _field_bytes(column: str, dtype: DataType) -> str:
    """SQL text: one key field's encoding as binary (docs/formats.md, "Keys").

    Strings without a NUL (nearly all) are their UTF-8 bytes as they are; only the others take the
    regular expression that escapes each byte-aligned 00, a few times slower per row. (``contains`` finds the
    NUL in about half the time ``instr`` takes.)"""
    c = f"`{column.replace('`', '``')}`"
    kind = type(dtype).__name__
    escaped = f"unhex(regexp_replace(hex({c}), '\\\\G((?:[0-9A-F]{{2}})*?)00', '$100FF'))"
    if kind in _INTEGRAL:
        some = f"unhex(concat('01', lpad(hex(cast({c} as bigint) ^ {_SIGN_FLIP}), 16, '0')))"
    elif kind in ("StringType", "VarcharType", "CharType"):
        some = f"concat(x'01', if(contains({c}, char(0)), {escaped}, cast({c} as binary)), x'0000')"
    elif kind == "BinaryType":
        some = f"concat(x'01', {escaped}, x'0000')"
    elif kind == "BooleanType":
        some = f"if({c}, x'0101', x'0100')"
    elif kind == "DateType":
        some = f"unhex(concat('01', lpad(hex(cast(unix_date({c}) as bigint) + 2147483648), 8, '0')))"
    elif kind in ("TimestampType", "TimestampNTZType"):
        some = f"unhex(concat('01', lpad(hex(unix_micros({c}) ^ {_SIGN_FLIP}), 16, '0')))"
    else:
        raise ConfigurationError(
            f"grouping key column {column!r} has type {dtype.simpleString()}, which Spark cannot route by key group "
            "(supported: integral, string, binary, boolean, date, timestamp)"
        )
    return f"if({c} is null, x'00', {some})"


def _encoded_key_sql(schema: StructType, key_columns: tuple[str, ...]) -> str:
    fields = {f.name: f.dataType for f in schema.fields}
    return f"concat({', '.join(_field_bytes(k, fields[k]) for k in key_columns)})"


def key_group_sql(schema: StructType, key_columns: tuple[str, ...], max_key_groups: int) -> str:
    """SQL text of the key group of a row: ``pmod(crc32(encoded key), G)``."""
    return f"pmod(crc32({_encoded_key_sql(schema, key_columns)}), {int(max_key_groups)})"


def stored_key_column(schema: StructType, key_columns: tuple[str, ...], max_key_groups: int) -> Column:
    """Each row's stored grouping key (``key group u16 BE | encoded key``, as `StateContext.encode_gk` makes it),
    computed by Spark: a writer of many keys takes them without encoding each in Python."""
    from pyspark.sql import functions as sf

    group = key_group_sql(schema, key_columns, max_key_groups)
    return sf.expr(f"concat(unhex(lpad(hex({group}), 4, '0')), {_encoded_key_sql(schema, key_columns)})")


def routable(schema: StructType, key_columns: tuple[str, ...]) -> bool:
    """Whether Spark can compute the key group of these key columns."""
    try:
        key_group_sql(schema, key_columns, 1)
    except ConfigurationError:
        return False
    return True


def group_column(schema: StructType, key_columns: tuple[str, ...], max_key_groups: int) -> Column:
    """The key group (int) of each row: a task sorting its input by it first handles its keys in stored order."""
    from pyspark.sql import functions as sf

    return sf.expr(f"cast({key_group_sql(schema, key_columns, max_key_groups)} as int)")


def owner_column(schema: StructType, key_columns: tuple[str, ...], layout: KeyGroupLayout) -> Column:
    """The partition (int) that owns each row's key group under `layout`."""
    from pyspark.sql import functions as sf

    return sf.expr(owner_sql(key_group_sql(schema, key_columns, layout.max_key_groups), layout))


def owner_sql(group: str, layout: KeyGroupLayout) -> str:
    """SQL text of the partition (int) owning the key group that SQL text `group` computes, under `layout` (as
    `KeyGroupLayout.owner`; in 64 bits, where ``(g + 1) * n`` can pass 2**31)."""
    n, g = layout.partitions, layout.max_key_groups
    return f"cast(((cast({group} as bigint) + 1) * {n} - 1) div {g} as int)"


def partition_column(schema: StructType, key_columns: tuple[str, ...], n: int, layout: KeyGroupLayout | None) -> Column:
    """The state partition (int) of each row: its key group's owner under `layout`, or (None: operators whose keys
    cannot be routed by key group, and older ones) Spark's hash of the key mod `n`."""
    from pyspark.sql import functions as sf

    if layout is not None:
        return owner_column(schema, key_columns, layout)
    return sf.pmod(sf.hash(*[sf.col(k) for k in key_columns]), sf.lit(n)).cast("int")


_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def spark_int_hash(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an int column (Murmur3 x86_32, seed 42), which hash partitioning uses."""
    k1 = _rotl((value * 0xCC9E2D51) & _M32, 15) * 0x1B873593 & _M32
    h1 = _rotl((seed ^ k1) & _M32, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _M32
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def hash_routes(partitions: int) -> list[int]:
    """For each partition p, the smallest int whose Spark hash partitioning ``pmod(hash(v), n)`` is p:
    a row carrying it in the repartition column lands in partition p. Computed here, not by a Spark job."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < partitions:
        found.setdefault(spark_int_hash(value) % partitions, value)  # % of a positive n is pmod
        value += 1
    return [found[p] for p in range(partitions)]


__all__ = [
    "group_column",
    "hash_routes",
    "key_group_sql",
    "owner_column",
    "owner_sql",
    "partition_column",
    "routable",
    "spark_int_hash",
    "stored_key_column",
]
