"""Where the key group sits in each column family of typed state, for rescale (store/rescale.py).

User state variables and ``__timers`` lead with the key group; ``__ttl`` and ``__timer_index`` lead
with an expiry time and carry the grouping key after it; ``__meta`` holds per-partition metadata
(schemas, the key-group count: the same in every partition, so a conflict is refused) and the row
count, which is recounted for each new partition.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from statekeeper.store.key_group_rules import CfRule
from statekeeper.store.key_groups import group_at
from statekeeper.store.rescale_plan import RescaleError
from statekeeper.store.spark.schemas import META_CF, read_max_key_groups
from statekeeper.store.spark.state import INTERNAL_PREFIX, ROWS_TOTAL, TIMER_INDEX_CF, TTL_CF, timer_entry, ttl_entry
from statekeeper.store.state_store import StateStore

_I64 = struct.Struct(">q")


class TypedStateKeys:
    """`KeyGroupRules` for the Spark integration's typed state (docs/formats.md, "Stored keys")."""

    def rule(self, cf: str) -> CfRule:
        if cf == META_CF:
            return CfRule.SHARED
        if cf in (TTL_CF, TIMER_INDEX_CF):
            return CfRule.LOCATED
        return CfRule.LEADING

    def locate(self, cf: str, key: bytes) -> int:
        return group_at(timer_entry(key)[0] if cf == TIMER_INDEX_CF else ttl_entry(key)[2])

    def merge_shared(self, cf: str, key: bytes, kept: bytes | None, new: bytes, source: str) -> bytes | None:
        if key == ROWS_TOTAL:
            return None  # recounted by finish()
        if kept is not None and kept != new:
            raise RescaleError(
                f"partitions disagree on {cf} key {key!r} (from {source}): typed state metadata must be equal in "
                "every partition to merge them"
            )
        return None if kept is not None else new

    def counted(self, cf: str) -> bool:
        return not cf.startswith(INTERNAL_PREFIX) and cf != "default"

    def finish(self, cfs: Sequence[str], counts: Mapping[str, int]) -> list[tuple[str, bytes, bytes]]:
        rows = sum(counts.values())
        return [(META_CF, ROWS_TOTAL, _I64.pack(rows))] if rows or META_CF in cfs else []

    def max_key_groups(self, store: StateStore) -> int | None:
        if META_CF not in store.column_families():
            return None
        return read_max_key_groups(store.column_family(META_CF))


__all__ = ["TypedStateKeys"]
