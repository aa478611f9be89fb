"""Where the key group sits in each column family of typed state, for rescale (store/rescale.py).

User state variables and ``__timers`` lead with the key group; ``__ttl`` and ``__timer_index`` lead
with an expiry time and carry the grouping key after it; ``__meta`` holds per-partition metadata
(schemas, the key-group count: the same in every partition, so a conflict is refused) and the row
count, which is recounted for each new partition.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from statekeeper.store.key_group_rules import CfRule
from statekeeper.store.key_groups import group_at
from statekeeper.store.rescale import RescaleError
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

    def finish(self, store: StateStore, poured: Mapping[str, int] | None) -> None:
        rows = 0
        for cf in store.column_families():
            if not cf.startswith(INTERNAL_PREFIX) and cf != "default":
                rows += poured.get(cf, 0) if poured is not None else store.column_family(cf).count()
        if rows or META_CF in store.column_families():
            store.put(ROWS_TOTAL, _I64.pack(rows), cf=META_CF)

    def max_key_groups(self, store: StateStore) -> int | None:
        if META_CF not in store.column_families():
            return None
        return read_max_key_groups(store.column_family(META_CF))


__all__ = ["TypedStateKeys"]
