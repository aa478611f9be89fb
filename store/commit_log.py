"""Reading and writing the per-batch commit records of a checkpoint root.

The driver calls :meth:`CommitLog.commit` once every partition's state is durable; the record is
created exclusively, so a retried or zombie driver can never replace the outcome of a batch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence

from statekeeper.store.errors import CheckpointFileExistsError, ConfigurationError, LineageError
from statekeeper.store.files.base import CheckpointFileManager
from statekeeper.store.files.paths import validate_component
from statekeeper.store.files.read_ahead import ReadAhead
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.layout import (
    COMMITS_DIR,
    commit_path,
    parse_commit_name,
    validate_checkpoint_id,
    validate_version,
)

RECORDS_CACHED = 64
"""Commit records a `CommitLog` keeps parsed, the most recently used: a driver reads the previous version's,
a load the few its lineage walk names. A bounded number, not every version: a query runs for months (a
record names every partition's checkpoint id, and every state store keeps a log of its own)."""


class CommitLog:
    def __init__(self, fm: CheckpointFileManager) -> None:
        self._fm = fm
        self._cache: OrderedDict[int, CommitRecord] = OrderedDict()
        self._lock = threading.Lock()

    def _name(self, version: int) -> str:
        return f"{self._fm.root_uri}/{commit_path(version)}"

    def commit(
        self,
        version: int,
        checkpoint_ids: Mapping[str, Sequence[str]],
        *,
        layouts: Mapping[str, KeyGroupLayout] | None = None,
        batch_id: int | None = None,
        change: Mapping[str, str] | None = None,
        in_place: Mapping[str, Sequence[int]] | None = None,
        copied_from: Mapping[str, int] | None = None,
    ) -> CommitRecord:
        """Publish version `version`: the winning checkpoint id of every partition of every operator.

        Idempotent for the same outcome (a driver retrying after a crash); a different outcome for
        an already committed version raises and leaves the existing record untouched. An operator
        keeps the partition count and layout of the previous version (carried forward when `layouts`
        does not name it) unless this commit is a rescale (`change` says ``rescale`` for it), which
        names its new layout. `batch_id` defaults to the previous record's batch + 1. `in_place` names the
        partitions of a `change` whose changelogs extend their lineage (the others are full-state);
        `copied_from` the version a `change` copied (a rollback's source, for the batch history).
        """
        validate_version(version)
        if version < 1:
            raise ConfigurationError("version 0 is the empty state and is never committed")
        ids: dict[str, tuple[str, ...]] = {}
        for op, lst in checkpoint_ids.items():
            validate_component(op, "operator name")
            ids[op] = tuple(validate_checkpoint_id(i) for i in lst)
            if not ids[op]:
                raise ConfigurationError(f"operator {op!r} has no partitions in the commit of version {version}")
        lays = dict(layouts or {})
        changes = dict(change or {})
        batch = batch_id
        if version > 1:
            prev = self.get(version - 1)
            if prev is None:
                raise LineageError(f"cannot commit version {version}: version {version - 1} is not committed")
            if batch is None and prev.batch != version - 2:
                batch = prev.batch + 1
            for op, lst in ids.items():
                before = prev.checkpoint_ids.get(op)
                if op not in lays and op in prev.layouts and prev.layouts[op].partitions == len(lst):
                    lays[op] = prev.layouts[op]
                if before is not None and len(before) != len(lst) and changes.get(op) not in ("rescale", "rollback"):
                    raise ConfigurationError(
                        f"operator {op!r} has {len(before)} partitions (changed only by a rescale); "
                        f"the commit of version {version} names {len(lst)}"
                    )
        if batch == version - 1:
            batch = None
        kept = {op: tuple(sorted(ps)) for op, ps in (in_place or {}).items() if ps}
        copied = dict(copied_from or {})
        record = CommitRecord(
            version, ids, layouts=lays, batch_id=batch, change=changes, in_place=kept, copied_from=copied
        )
        try:
            with self._fm.create(commit_path(version), exclusive=True) as out:
                out.write(record.to_bytes())
        except CheckpointFileExistsError:
            existing = self.get(version, use_cache=False)
            if existing is not None and existing.same_outcome(record):
                return existing
            raise
        self._remember(record)
        return record

    def get(self, version: int, *, use_cache: bool = True) -> CommitRecord | None:
        if use_cache:
            with self._lock:
                cached = self._cache.get(version)
                if cached is not None:
                    self._cache.move_to_end(version)
                    return cached
        path = commit_path(version)
        try:
            data = self._fm.read_bytes(path)
        except FileNotFoundError:
            return None
        return self._parsed(version, data)

    def records(self, versions: Iterable[int]) -> dict[int, CommitRecord]:
        """The records of `versions` that exist (a missing one is left out), those not cached fetched with the
        read-ahead: a load checks the lineage of a chain of N versions in about N / `READ_AHEAD` round trips."""
        out: dict[int, CommitRecord] = {}
        todo: list[int] = []
        with self._lock:
            for v in dict.fromkeys(versions):
                cached = self._cache.get(v)
                if cached is None:
                    todo.append(v)
                else:
                    out[v] = cached
        if len(todo) > 1:
            fetched = 0
            try:
                with ReadAhead(self._fm, [commit_path(v) for v in todo], None) as files:
                    for v, f in zip(todo, files, strict=True):
                        with f:
                            data = f.read()
                        out[v] = self._parsed(v, data)
                        fetched += 1
            except FileNotFoundError:
                pass  # the rest one by one below: a missing record is left out
            todo = todo[fetched:]
        for v in todo:
            record = self.get(v)
            if record is not None:
                out[v] = record
        return out

    def _parsed(self, version: int, data: bytes) -> CommitRecord:
        record = CommitRecord.from_bytes(data, self._name(version))
        if record.version != version:
            raise LineageError(f"commit record claims version {record.version}: {self._name(version)}")
        self._remember(record)
        return record

    def _remember(self, record: CommitRecord) -> None:
        """Cache `record` (records never change once written), dropping the least recently used beyond
        `RECORDS_CACHED`."""
        with self._lock:
            self._cache[record.version] = record
            self._cache.move_to_end(record.version)
            if len(self._cache) > RECORDS_CACHED:
                self._cache.popitem(last=False)

    def committed_id(self, version: int, operator: str, partition: int) -> str:
        record = self.get(version)
        if record is None:
            raise LineageError(f"version {version} is not committed in {self._fm.root_uri}")
        ckpt = record.checkpoint_id(operator, partition)
        if ckpt is None:
            raise LineageError(
                f"the commit of version {version} in {self._fm.root_uri} has no partition {partition} "
                f"of operator {operator!r}"
            )
        return ckpt

    def versions(self, *, start_after: int | None = None) -> Iterator[int]:
        """Committed versions in ascending order (a paginated listing, resumable with `start_after`)."""
        after = commit_path(start_after) if start_after is not None else None
        for info in self._fm.list(f"{COMMITS_DIR}/", start_after=after):
            v = parse_commit_name(info.path)
            if v is not None:
                yield v

    def latest(self) -> int:
        """The newest committed version (0 when nothing is committed)."""
        latest = 0
        for v in self.versions():
            latest = v
        return latest
