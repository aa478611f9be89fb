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
    StatekeeperError,
)
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.layout import StoreId, batch_path
from statekeeper.store.spark.metrics import PartitionMetrics


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
        try:
            data: dict[str, Any] = json.loads(self.fm.read_bytes(path))
        except (FileNotFoundError, CheckpointFileNotFoundError):
            return None
        except ValueError as e:
            raise ConfigurationError(f"unreadable batch file {self.fm.root_uri}/{path}: {e}") from e
        return data

    def intent_partitions(self, batch_id: int) -> int | None:
        """The partition count the batch's first attempt ran with (None before its first attempt)."""
        data = self._batch_file(batch_id)
        return int(data["num_partitions"]) if data else None

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


__all__ = ["BatchRecords", "UploadTimeoutError"]
