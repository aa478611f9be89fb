"""What the driver reads and writes under the root for one batch, around the partition tasks.

Before a batch's first attempt, its batch file (``batch_path``: processing time and partition count)
is created exclusively, so a re-run sees the same time; before the tasks run, the checkpoint ids they
load come from the previous commit record; after them, async uploads are awaited until durable and the
commit record is written (DESIGN invariant 3: a batch is committed only when all of it is durable).
The batch loop (`statekeeper.store.spark.driver`) decides when; this module knows the files and
their failures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import (
    CheckpointFileExistsError,
    CheckpointFileNotFoundError,
    ConfigurationError,
    CorruptFileError,
    StatekeeperError,
)
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.formats.framing import parse_json
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.layout import StoreId, batch_path
from statekeeper.store.spark.metrics import PartitionMetrics

MAX_PARTITIONS = 10_000
"""The most partitions a query may run (the driver's `num_partitions` limit); a batch file claiming more is corrupt."""
MAX_RECORD_BYTES = 4096
"""A batch file or event-time record is a few dozen bytes; a longer one is refused unparsed (checkpoint
content is untrusted, DESIGN invariant 12)."""


def read_json_record(
    fm: CheckpointFileManager,
    path: str,
    what: str,
    batch_id: int,
    ints: tuple[str, ...],
    optional: tuple[str, ...] = (),
) -> dict[str, Any] | None:
    """The JSON object at `path` (None: no such file), the record of batch `batch_id` (its ``batch_id`` field
    says so: another batch's record under this name would give that batch's time), its `ints` fields present
    and integers (`optional` ones integers or null); anything else (too long, not JSON, too deep, wrong shape)
    is a `CorruptFileError` naming the file, never a raw decoding error (the driver's small records are
    checkpoint content too)."""
    try:
        data = fm.read_bytes(path)
    except (FileNotFoundError, CheckpointFileNotFoundError):
        return None
    uri = f"{fm.root_uri.rstrip('/')}/{path}"
    if len(data) > MAX_RECORD_BYTES:
        raise CorruptFileError(f"{what} has {len(data)} bytes, above the {MAX_RECORD_BYTES}-byte limit", uri)
    doc = parse_json(data, uri, what)
    if not isinstance(doc, dict):
        raise CorruptFileError(f"{what} is not a JSON object", uri)
    for key in ("batch_id", *ints, *optional):
        value = doc.get(key)
        if (value is None and key in optional) or (type(value) is int and -(1 << 63) <= value < 1 << 63):
            continue
        raise CorruptFileError(f"{what}: field {key!r} is missing or not a 64-bit integer", uri)
    if doc["batch_id"] != batch_id:
        raise CorruptFileError(f"{what} says batch {doc['batch_id']}, its name says batch {batch_id}", uri)
    return doc


class UploadTimeoutError(StatekeeperError):
    """Some partitions' changelogs did not become durable in the checkpoint location in time."""


@dataclass(frozen=True)
class BatchRecords:
    """The batch files, commit records and changelogs of one operator, as its driver sees them."""

    fm: CheckpointFileManager
    commit_log: CommitLog
    operator: str

    def _batch_file(self, batch_id: int) -> dict[str, Any] | None:
        # owned by the version the batch commits: maintenance expires it with that commit record
        path = batch_path(self.operator, batch_id)
        return read_json_record(self.fm, path, "batch file", batch_id, ("timestamp_ms", "num_partitions"))

    def intent_partitions(self, batch_id: int) -> int | None:
        """The partition count the batch's first attempt ran with (None before its first attempt)."""
        data = self._batch_file(batch_id)
        if data is None:
            return None
        n = int(data["num_partitions"])
        if not 1 <= n <= MAX_PARTITIONS:
            uri = f"{self.fm.root_uri.rstrip('/')}/{batch_path(self.operator, batch_id)}"
            raise CorruptFileError(f"batch file: num_partitions {n} is outside [1, {MAX_PARTITIONS}]", uri)
        return n

    def batch_timestamp(self, batch_id: int, n: int) -> int:
        """The batch's processing time, recorded before its first attempt and reused by re-runs."""
        data = self._batch_file(batch_id)
        if data is None:
            data = {"batch_id": batch_id, "timestamp_ms": int(time.time() * 1000), "num_partitions": n}
            try:
                with self.fm.create(batch_path(self.operator, batch_id), exclusive=True) as f:
                    f.write(json.dumps(data).encode())
            except CheckpointFileExistsError:
                data = self._batch_file(batch_id) or data
        return int(data["timestamp_ms"])

    def load_ids(self, version: int, n: int) -> tuple[str, ...]:
        """The committed checkpoint id of each of the `n` partitions at `version` (empty ids at version 0)."""
        if version == 0:
            return ("",) * n
        record = self.commit_log.get(version)
        if record is None:
            self.commit_log.committed_id(version, self.operator, 0)  # raises LineageError naming the missing version
        assert record is not None
        got = record.checkpoint_ids.get(self.operator, ())
        if len(got) != n:
            raise ConfigurationError(
                f"the commit of version {version} names {len(got)} partitions of {self.operator!r}, expected {n}"
            )
        return tuple(got)

    def await_uploads(self, version: int, metas: Sequence[PartitionMetrics], timeout_s: float) -> None:
        """Wait until every partition's changelog of `version` is durable, or raise :class:`UploadTimeoutError`."""
        missing = {
            StoreId(self.operator, m.partition).changelog(version, m.checkpoint_id or "")
            for m in metas
            if m.checkpoint_id
        }
        deadline = time.monotonic() + timeout_s
        delay = 0.002
        while missing:
            missing = {p for p in missing if not self.fm.exists(p)}
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise UploadTimeoutError(
                    f"{len(missing)} changelog(s) of version {version} are not durable in {self.fm.root_uri} after "
                    f"{timeout_s}s: {sorted(missing)[:4]}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def commit(self, version: int, ids: list[str], batch_id: int, layout: KeyGroupLayout | None) -> None:
        """Write the commit record of `version`; someone else's record there is a second query on the root."""
        layouts = {self.operator: layout} if layout is not None else {}
        try:
            self.commit_log.commit(version, {self.operator: ids}, layouts=layouts, batch_id=batch_id)
        except CheckpointFileExistsError as e:
            raise StatekeeperError(
                f"version {version} of {self.operator!r} in {self.fm.root_uri} was committed by someone else with "
                "other checkpoint ids: is a second query running on the same state root?"
            ) from e


__all__ = ["MAX_RECORD_BYTES", "BatchRecords", "UploadTimeoutError", "read_json_record"]
