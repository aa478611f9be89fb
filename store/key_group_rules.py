"""How a rescale finds the key group of each stored key, per column family (store/rescale.py).

A store whose every key leads with its key group (`GroupLedKeys`, the plain store convention) is
copied by byte ranges; the Spark integration's typed state has its own rules
(store/spark/rescale_rules.py) for the indexes that hold the group inside the key and for the metadata
every partition shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Protocol

from statekeeper.store.state_store import StateStore


class CfRule(Enum):
    """How the keys of one column family are assigned to key groups."""

    LEADING = "leading"
    """Every key starts with its key group: a range of groups is a byte range (a range scan)."""
    LOCATED = "located"
    """The key group is inside the key (`KeyGroupRules.locate`): every key is read and routed."""
    SHARED = "shared"
    """Per-partition metadata: copied to every new partition (`KeyGroupRules.merge_shared`)."""


class KeyGroupRules(Protocol):
    """What a rescale needs to know about the keys of a store (the Spark integration has its own)."""

    def rule(self, cf: str) -> CfRule: ...

    def locate(self, cf: str, key: bytes) -> int:
        """The key group of `key` in a `LOCATED` column family."""
        ...

    def merge_shared(self, cf: str, key: bytes, kept: bytes | None, new: bytes, source: str) -> bytes | None:
        """The value a `SHARED` key gets when `new` comes from `source` and `kept` was copied before
        (None: do not copy it); raise `RescaleError` when they conflict."""
        ...

    def counted(self, cf: str) -> bool:
        """Whether `finish` needs the live record count of column family `cf`."""
        ...

    def finish(self, cfs: Sequence[str], counts: Mapping[str, int]) -> list[tuple[str, bytes, bytes]]:
        """Records (cf, key, value) to add to a new partition once every range is copied (e.g. its row
        count): `cfs` are its column families, `counts` the live records of each of them that is `counted`."""
        ...

    def max_key_groups(self, store: StateStore) -> int | None:
        """The key-group count recorded in a loaded store, if it records one."""
        ...


class GroupLedKeys:
    """Rules for stores whose every key leads with its key group (the plain store convention)."""

    def rule(self, cf: str) -> CfRule:
        return CfRule.LEADING

    def locate(self, cf: str, key: bytes) -> int:  # pragma: no cover - LEADING only
        raise NotImplementedError

    def merge_shared(self, cf: str, key: bytes, kept: bytes | None, new: bytes, source: str) -> bytes | None:
        return new  # pragma: no cover - LEADING only

    def counted(self, cf: str) -> bool:
        return False

    def finish(self, cfs: Sequence[str], counts: Mapping[str, int]) -> list[tuple[str, bytes, bytes]]:
        return []

    def max_key_groups(self, store: StateStore) -> int | None:
        return None


__all__ = ["CfRule", "GroupLedKeys", "KeyGroupRules"]
