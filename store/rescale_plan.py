"""What a rescale or rollback copies and the layout it commits (`RescalePlan`), and what one built partition
reports (`PartitionBuild`): the types the builders (store/rescale.py, store/rescale_relay.py) and the Spark
integration share."""

from __future__ import annotations

from dataclasses import dataclass

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import ConfigurationError, LineageError, StatekeeperError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.key_group_rules import GroupLedKeys, KeyGroupRules
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.state_store import StateStore, StoreConfig


class RescaleError(StatekeeperError):
    """A rescale or rollback cannot be done as asked; nothing was committed."""


MAX_SHARED_BYTES = 64 << 20
"""Keys and values of shared records (`CfRule.SHARED`: metadata every partition holds, typed state's schemas, a
few KB) a rescale holds in memory for one source partition or one new partition. A checkpoint claiming more is
refused, naming where, before it can exhaust the process's memory."""


class SharedRecords:
    """The shared records (`CfRule.SHARED`) a rescale holds: (column family, key) -> value, None where the source
    deleted it; at most `MAX_SHARED_BYTES`."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, bytes], bytes | None] = {}
        self.nbytes = 0

    def get(self, cf: str, key: bytes) -> bytes | None:
        return self.records.get((cf, key))

    def put(self, cf: str, key: bytes, value: bytes | None, source: str) -> None:
        """Hold `value` for `key` of `cf`; `source` (a file, a partition) is named if that is too much."""
        at = (cf, key)
        held = self.records.get(at)
        grown = len(value or b"") - len(held or b"") + (0 if at in self.records else len(cf) + len(key))
        if self.nbytes + grown > MAX_SHARED_BYTES:
            raise RescaleError(
                f"{source}: the shared records of column family {cf!r} (metadata every partition holds) exceed "
                f"{MAX_SHARED_BYTES} bytes: refused as corrupt"
            )
        self.records[at] = value
        self.nbytes += grown

    def merge(self, rules: KeyGroupRules, cf: str, key: bytes, value: bytes, source: str) -> bytes | None:
        """Merge `source`'s `value` for `key` into what is held (`KeyGroupRules.merge_shared`); the value now held
        if it changed, else None."""
        merged = rules.merge_shared(cf, key, self.get(cf, key), value, source)
        if merged is not None:
            self.put(cf, key, merged, source)
        return merged


@dataclass(frozen=True)
class RescalePlan:
    """Which committed state a rescale or rollback copies, and the layout it commits."""

    operator: str
    kind: str
    """``rescale`` or ``rollback``."""
    source_version: int
    source_ids: tuple[str, ...]
    source_layout: KeyGroupLayout | None
    """None: a legacy layout (partitions were routed by hash, so each may hold keys of every group)."""
    target_layout: KeyGroupLayout | None
    batch_id: int
    """The batch the copied version follows; the new version repeats it."""
    head_version: int
    """The newest committed version; the new one is ``head_version + 1``."""

    @property
    def new_version(self) -> int:
        return self.head_version + 1

    @property
    def partitions(self) -> int:
        """Partitions of the new version."""
        if self.kind == "rollback" or self.target_layout is None:
            return len(self.source_ids)
        return self.target_layout.partitions

    def kept_in_place(self) -> dict[int, tuple[int, int]]:
        """New partition -> the key groups ``[lo, hi)`` it keeps from the old partition of the same number.

        Such a partition is not rewritten: it extends its old lineage with the groups it gains (puts) and
        loses (deletes). A key group *moves* when its owning partition number changes; only moved groups
        are written. Rollbacks and legacy layouts keep nothing in place, nor does a relay
        (store/rescale_relay.py), which writes every new partition anew.
        """
        old, new = self.source_layout, self.target_layout
        if self.kind != "rescale" or old is None or new is None:
            return {}
        kept = {}
        for p in range(min(old.partitions, new.partitions)):
            (a, b), (c, d) = old.groups_of(p), new.groups_of(p)
            if max(a, c) < min(b, d):
                kept[p] = (max(a, c), min(b, d))
        return kept

    def moved_groups(self) -> int:
        if self.target_layout is None:
            return 0
        if self.source_layout is None:
            return self.target_layout.max_key_groups
        return self.target_layout.moved_groups(self.source_layout)

    def sources_of(self, p: int) -> list[tuple[int, int, int]]:
        """[(old partition, lo, hi)]: the key groups ``[lo, hi)`` new partition `p` takes from each old one
        (a rollback: all of its own; a legacy layout: its groups, from every old partition)."""
        target = self.target_layout
        if self.kind == "rollback" or target is None:
            return [(p, 0, -1)]
        lo, hi = target.groups_of(p)
        if self.source_layout is None:
            return [(q, lo, hi) for q in range(len(self.source_ids))]
        return target.overlaps(p, self.source_layout)

    def describe(self) -> str:
        src = f"{len(self.source_ids)} partitions" + ("" if self.source_layout else " (legacy layout)")
        dst = f"{self.target_layout.partitions} partitions" if self.target_layout else f"{len(self.source_ids)}"
        return (
            f"{self.kind} {self.operator}: version {self.source_version} ({src}) -> version {self.new_version} "
            f"({dst}), {self.moved_groups()} key groups change owner"
        )


@dataclass(frozen=True)
class PartitionBuild:
    """One new partition written: its changelog is published, the commit record does not name it yet."""

    partition: int
    checkpoint_id: str
    in_place: bool
    records: int
    deleted: int
    bytes_read: int
    bytes_written: int
    """Its changelog."""
    seconds: float
    relayed: bool = False
    """Written from its old partitions' changelog records (store/rescale_relay.py), none of them loaded."""


def _record(log_: CommitLog, version: int, operator: str) -> CommitRecord:
    record = log_.get(version)
    if record is None or operator not in record.checkpoint_ids:
        raise LineageError(f"version {version} of operator {operator!r} is not committed in {log_._fm.root_uri}")
    return record


def plan_rescale(
    fm: CheckpointFileManager,
    operator: str,
    partitions: int,
    *,
    max_key_groups: int | None = None,
    rules: KeyGroupRules | None = None,
    config: StoreConfig | None = None,
) -> RescalePlan:
    """Plan re-laying out the newest committed version of `operator` over `partitions` partitions."""
    commits = CommitLog(fm)
    head = commits.latest()
    if head == 0:
        raise RescaleError(f"operator {operator!r} in {fm.root_uri} has no committed version to rescale")
    record = _record(commits, head, operator)
    old = record.layouts.get(operator)
    groups = old.max_key_groups if old is not None else max_key_groups
    if old is not None and max_key_groups is not None and max_key_groups != old.max_key_groups:
        raise ConfigurationError(
            f"operator {operator!r} has {old.max_key_groups} key groups (fixed at its first batch), "
            f"not {max_key_groups}"
        )
    if groups is None:
        with StateStore(fm, operator, 0, config=config) as probe:
            probe.load(head, record.checkpoint_ids[operator][0])
            groups = (rules or GroupLedKeys()).max_key_groups(probe)
        probe.close()
    if groups is None:
        raise ConfigurationError(
            f"operator {operator!r} in {fm.root_uri} records no key-group count: pass max_key_groups"
        )
    target = KeyGroupLayout(partitions, groups)
    return RescalePlan(operator, "rescale", head, record.checkpoint_ids[operator], old, target, record.batch, head)


def plan_rollback(fm: CheckpointFileManager, operator: str, to_version: int) -> RescalePlan:
    """Plan making retained committed `to_version` of `operator` the head again, as a new version."""
    commits = CommitLog(fm)
    head = commits.latest()
    if not 1 <= to_version < head:
        raise ConfigurationError(
            f"--to-version {to_version} must be a committed version below the head ({head}) of {fm.root_uri}"
        )
    record = _record(commits, to_version, operator)
    layout = record.layouts.get(operator)
    ids = record.checkpoint_ids[operator]
    return RescalePlan(operator, "rollback", to_version, ids, layout, layout, record.batch, head)


__all__ = [
    "MAX_SHARED_BYTES",
    "PartitionBuild",
    "RescaleError",
    "RescalePlan",
    "SharedRecords",
    "plan_rescale",
    "plan_rollback",
]
