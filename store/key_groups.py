"""Key groups: which partition of an operator owns which keys, as contiguous ranges.

Stored keys lead with their key group (``u16`` BE, docs/formats.md), so the keys of a range of
groups are one contiguous byte range of a column family. A layout gives partition ``p`` of ``n`` the
groups ``[p * G // n, (p + 1) * G // n)`` of ``G`` (the operator's max key groups, fixed at its first
batch), so a rescale moves byte ranges between stores, never individual records chosen by hash.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from statekeeper.store.errors import ConfigurationError

KEY_GROUP_LIMIT = 65536
"""Key groups are stored as ``u16``."""

_GROUP = struct.Struct(">H")


@dataclass(frozen=True, slots=True)
class KeyGroupLayout:
    """``partitions`` partitions owning contiguous ranges of ``max_key_groups`` key groups."""

    partitions: int
    max_key_groups: int

    def __post_init__(self) -> None:
        if not isinstance(self.max_key_groups, int) or not 1 <= self.max_key_groups <= KEY_GROUP_LIMIT:
            raise ConfigurationError(
                f"max_key_groups must be an integer in [1, {KEY_GROUP_LIMIT}], got {self.max_key_groups!r}"
            )
        if not isinstance(self.partitions, int) or not 1 <= self.partitions <= self.max_key_groups:
            raise ConfigurationError(
                f"partitions must be an integer in [1, max_key_groups={self.max_key_groups}], got {self.partitions!r}"
            )

    def groups_of(self, partition: int) -> tuple[int, int]:
        """The key groups ``[lo, hi)`` partition ``partition`` owns."""
        if not 0 <= partition < self.partitions:
            raise ConfigurationError(f"partition {partition} is outside a layout of {self.partitions} partitions")
        g, n = self.max_key_groups, self.partitions
        return partition * g // n, (partition + 1) * g // n

    def owner(self, group: int) -> int:
        """The partition that owns key group ``group``."""
        if not 0 <= group < self.max_key_groups:
            raise ConfigurationError(f"key group {group} is outside [0, {self.max_key_groups})")
        return ((group + 1) * self.partitions - 1) // self.max_key_groups

    def overlaps(self, partition: int, other: KeyGroupLayout) -> list[tuple[int, int, int]]:
        """``(other partition, lo, hi)`` for each partition of ``other`` sharing groups with ``partition``."""
        if other.max_key_groups != self.max_key_groups:
            raise ConfigurationError(
                f"layouts with {self.max_key_groups} and {other.max_key_groups} key groups cannot be compared"
            )
        lo, hi = self.groups_of(partition)
        found = []
        for q in range(other.owner(lo), other.owner(hi - 1) + 1) if hi > lo else ():
            qlo, qhi = other.groups_of(q)
            a, b = max(lo, qlo), min(hi, qhi)
            if a < b:
                found.append((q, a, b))
        return found

    def moved_groups(self, other: KeyGroupLayout) -> int:
        """How many key groups change owner between ``other`` and this layout (by partition number)."""
        return sum(1 for g in range(self.max_key_groups) if self.owner(g) != other.owner(g))

    def to_json(self) -> dict[str, int]:
        return {"partitions": self.partitions, "max_key_groups": self.max_key_groups}


def group_prefix(group: int) -> bytes:
    """The two bytes a stored key of key group ``group`` starts with."""
    return _GROUP.pack(group)


def group_byte_range(lo: int, hi: int) -> tuple[bytes, bytes | None]:
    """The byte range ``[start, end)`` of stored keys (led by their group) in groups ``[lo, hi)``."""
    return _GROUP.pack(lo), (_GROUP.pack(hi) if hi < KEY_GROUP_LIMIT else None)


def group_at(key: bytes, offset: int = 0) -> int:
    """The key group written at ``offset`` of a stored key."""
    return int(_GROUP.unpack_from(key, offset)[0])


__all__ = ["KEY_GROUP_LIMIT", "KeyGroupLayout", "group_at", "group_byte_range", "group_prefix"]
