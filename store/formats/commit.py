"""The per-batch commit record: which checkpoint id won for every partition of every operator.

Written once by whoever commits the batch (the Spark driver), exclusively, after every partition's
state is durable; it is what makes a version committed (DESIGN invariant 3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from statekeeper.store.errors import ConfigurationError, CorruptFileError
from statekeeper.store.formats.framing import created_at, decode_whole_frame, encode_frame, require
from statekeeper.store.formats.names import Shape, name_from_file, shown
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.layout import MAX_VERSION, PARTITIONS

MAGIC = b"SKCR"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CommitRecord:
    """Version `version` (the state after batch `version - 1`) of each operator."""

    version: int
    checkpoint_ids: dict[str, tuple[str, ...]]  # operator -> id per partition
    created_at: float = field(default_factory=time.time)
    layouts: dict[str, KeyGroupLayout] = field(default_factory=dict)
    """Operator -> its key-group layout at this version (absent: a legacy operator without one)."""
    batch_id: int | None = None
    """The streaming batch whose output this state follows; None means ``version - 1``. A rescale or a
    rollback commits a version without running a batch, so it repeats the batch id it re-lays out."""
    change: dict[str, str] = field(default_factory=dict)
    """Operator -> ``rescale`` or ``rollback`` when this version changed its layout or its head."""
    in_place: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Operator -> partitions whose changelog of a ``change`` version extends their own lineage (a
    rescale kept key groups in place); every other partition of such a version is a full-state changelog."""
    copied_from: dict[str, int] = field(default_factory=dict)
    """Operator -> the committed version a ``change`` version copied (a rollback's source; a rescale
    copies the version below it). Absent in records written before it was recorded."""

    def full_state(self, operator: str, partition: int) -> bool:
        """Whether the changelog of (`operator`, `partition`) at this version has an empty lineage."""
        return operator in self.change and partition not in self.in_place.get(operator, ())

    def __post_init__(self) -> None:
        for op, layout in self.layouts.items():
            ids = self.checkpoint_ids.get(op)
            if ids is None or len(ids) != layout.partitions:
                raise ConfigurationError(
                    f"the layout of operator {op!r} at version {self.version} has {layout.partitions} partitions, "
                    f"the record names {0 if ids is None else len(ids)}"
                )

    @property
    def batch(self) -> int:
        return self.version - 1 if self.batch_id is None else self.batch_id

    def checkpoint_id(self, operator: str, partition: int) -> str | None:
        ids = self.checkpoint_ids.get(operator)
        if ids is None or not 0 <= partition < len(ids):
            return None
        return ids[partition]

    def to_bytes(self) -> bytes:
        payload: dict[str, Any] = {
            "version": self.version,
            "batch_id": self.batch,
            "created_at": self.created_at,
            "operators": {op: list(ids) for op, ids in sorted(self.checkpoint_ids.items())},
        }
        if self.layouts:
            payload["layouts"] = {op: lay.to_json() for op, lay in sorted(self.layouts.items())}
        if self.change:
            payload["change"] = dict(sorted(self.change.items()))
        if self.in_place:
            payload["in_place"] = {op: list(ps) for op, ps in sorted(self.in_place.items())}
        if self.copied_from:
            payload["copied_from"] = dict(sorted(self.copied_from.items()))
        return encode_frame(MAGIC, FORMAT_VERSION, payload)

    def same_outcome(self, other: CommitRecord) -> bool:
        return (
            self.version == other.version
            and self.checkpoint_ids == other.checkpoint_ids
            and self.layouts == other.layouts
            and self.batch == other.batch
        )

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> CommitRecord:
        payload = decode_whole_frame(data, MAGIC, FORMAT_VERSION, name)
        version = require(payload, "version", int, name)
        if not 0 < version < MAX_VERSION:
            raise CorruptFileError(f"field 'version' holds {shown(version)}, not a version above 0", name)
        operators = require(payload, "operators", dict, name)
        ids: dict[str, tuple[str, ...]] = {}
        for op, lst in operators.items():
            name_from_file(op, Shape.OPERATOR, name, "'operators'")
            if not isinstance(lst, list) or not 0 < len(lst) <= PARTITIONS:  # each one a store: capped
                raise CorruptFileError(f"operator {op!r} has a malformed checkpoint id list", name)
            ids[op] = tuple(name_from_file(x, Shape.CHECKPOINT_ID, name, f"'operators'.{op}") for x in lst)
        created = created_at(payload, name)
        batch = payload.get("batch_id", version - 1)
        if type(batch) is not int or not -1 <= batch < MAX_VERSION:
            raise CorruptFileError(f"malformed batch_id {shown(batch)}", name)
        raw_layouts = payload.get("layouts", {})
        change = payload.get("change", {})
        in_place = payload.get("in_place", {})
        copied = payload.get("copied_from", {})
        if not all(isinstance(x, dict) for x in (raw_layouts, change, in_place, copied)):
            raise CorruptFileError("malformed layouts, change, in_place or copied_from", name)
        for field_name, per_op in (("layouts", raw_layouts), ("change", change), ("in_place", in_place)):
            for op in per_op:
                name_from_file(op, Shape.OPERATOR, name, repr(field_name))
        for op, source in copied.items():
            name_from_file(op, Shape.OPERATOR, name, "'copied_from'")
            if not isinstance(source, int) or isinstance(source, bool) or not 0 <= source < version:
                raise CorruptFileError(
                    f"operator {op!r}: copied_from {shown(source)} is not a version below {version}", name
                )
        for op, how in change.items():
            if how not in CHANGES:
                raise CorruptFileError(f"operator {op!r}: change {shown(how)} is not one of {CHANGES}", name)
        layouts: dict[str, KeyGroupLayout] = {}
        try:
            for op, lay in raw_layouts.items():
                layouts[op] = KeyGroupLayout(_small_int(lay["partitions"]), _small_int(lay["max_key_groups"]))
            kept = {k: tuple(_small_int(p) for p in v) for k, v in in_place.items() if isinstance(v, list)}
            if len(kept) != len(in_place):
                raise ValueError("an in_place entry is not a list")
            return cls(
                version,
                ids,
                created,
                layouts,
                None if batch == version - 1 else batch,
                dict(change),
                kept,
                dict(copied),
            )
        except (KeyError, TypeError, ValueError, OverflowError, ConfigurationError) as e:
            raise CorruptFileError(f"malformed layouts, change or in_place: {str(e)[:200]}", name) from None


CHANGES = ("rescale", "rollback")
"""What a commit record's `change` may say of an operator."""


def _small_int(value: object) -> int:
    """A partition number or count read from a record: an int within what a layout can hold."""
    if type(value) is not int or not 0 <= value <= 1 << 20:
        raise ValueError(f"{shown(value)} is not a partition number or count")
    return value
