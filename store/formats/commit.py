"""The per-batch commit record: which checkpoint id won for every partition of every operator.

Written once by whoever commits the batch (the Spark driver), exclusively, after every partition's
state is durable; it is what makes a version committed (DESIGN invariant 3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from store.errors import CorruptFileError
from store.formats.framing import decode_whole_frame, encode_frame, require

MAGIC = b"SKCR"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CommitRecord:
    """Version `version` (the state after batch `version - 1`) of each operator."""

    version: int
    checkpoint_ids: dict[str, tuple[str, ...]]  # operator -> id per partition
    created_at: float = field(default_factory=time.time)

    def checkpoint_id(self, operator: str, partition: int) -> str | None:
        ids = self.checkpoint_ids.get(operator)
        if ids is None or not 0 <= partition < len(ids):
            return None
        return ids[partition]

    def to_bytes(self) -> bytes:
        payload: dict[str, Any] = {
            "version": self.version,
            "batch_id": self.version - 1,
            "created_at": self.created_at,
            "operators": {op: list(ids) for op, ids in sorted(self.checkpoint_ids.items())},
        }
        return encode_frame(MAGIC, FORMAT_VERSION, payload)

    def same_outcome(self, other: CommitRecord) -> bool:
        return self.version == other.version and self.checkpoint_ids == other.checkpoint_ids

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
        return cls(version, ids, float(created) if isinstance(created, int | float) else 0.0)
