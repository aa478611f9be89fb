"""The per-batch commit record: which checkpoint id won for every partition of every operator.

Written once by whoever commits the batch (the Spark driver), exclusively, after every partition's
state is durable; it is what makes a version committed (DESIGN invariant 3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from statekeeper.store.errors import ConfigurationError, CorruptFileError
from statekeeper.store.formats.framing import decode_whole_frame, encode_frame, require
from statekeeper.store.key_groups import KeyGroupLayout

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
        operators = require(payload, "operators", dict, name)
        ids: dict[str, tuple[str, ...]] = {}
        for op, lst in operators.items():
            if not isinstance(lst, list) or not all(isinstance(x, str) for x in lst):
                raise CorruptFileError(f"operator {op!r} has a malformed checkpoint id list", name)
            ids[op] = tuple(lst)
        created = payload.get("created_at", 0.0)
        batch = payload.get("batch_id", version - 1)
        if not isinstance(batch, int) or batch < -1:
            raise CorruptFileError(f"malformed batch_id {batch!r}", name)
        layouts: dict[str, KeyGroupLayout] = {}
        raw_layouts = payload.get("layouts", {})
        change = payload.get("change", {})
        in_place = payload.get("in_place", {})
        copied = payload.get("copied_from", {})
        if not all(isinstance(x, dict) for x in (raw_layouts, change, in_place, copied)):
            raise CorruptFileError("malformed layouts, change, in_place or copied_from", name)
        for op, source in copied.items():
            if not isinstance(source, int) or isinstance(source, bool) or not 0 <= source < version:
                raise CorruptFileError(
                    f"operator {op!r}: copied_from {source!r} is not a version below {version}", name
                )
        try:
            for op, lay in raw_layouts.items():
                layouts[op] = KeyGroupLayout(int(lay["partitions"]), int(lay["max_key_groups"]))
            return cls(
                version,
                ids,
                float(created) if isinstance(created, int | float) else 0.0,
                layouts,
                None if batch == version - 1 else batch,
                {str(k): str(v) for k, v in change.items()},
                {str(k): tuple(int(p) for p in v) for k, v in in_place.items()},
                {str(k): v for k, v in copied.items()},
            )
        except (KeyError, TypeError, ValueError, ConfigurationError) as e:
            raise CorruptFileError(f"malformed layouts, change or in_place: {e}", name) from None
