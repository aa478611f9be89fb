"""The head's history of batches: which committed version holds the state after a batch, and which
versions hold the logical changes of a range of batches, by layout segment.

Batch ``b`` usually commits version ``b + 1``, but a rescale or a rollback commits a version without
running a batch (it repeats the batch id of the version it copies, ``CommitRecord.batch_id``), and a
rollback abandons the versions between its source and itself. The head's history is the chain of
committed versions walked back from the head: a version's predecessor is the one below it, except for a
rollback, whose predecessor is the version it copied (``CommitRecord.copied_from``; in records written
before that field, the newest older version carrying the repeated batch id). Versions of a rolled-back
branch are not ancestors of the head, so they are not in its history.

- :meth:`BatchHistory.version_of` maps a batch id to the *latest* version in the history carrying it
  (after a rescale of batch ``b``'s state, the rescale version: the state after ``b`` as the query now
  sees it).
- :meth:`BatchHistory.changes` gives the versions whose changelogs are the logical changes of batches
  ``first..last``, cut into :class:`Segment` s at every rescale or rollback version. Those versions only
  copy state (their changelogs are full-state, or trims of partitions kept in place), so they are not
  changes; they start a segment whose versions are written by the partitions of the new layout.

Commit records are read lazily, newest first: a read of the head costs one record, a range of N
batches about N records (plus a rolled-back branch only when an old rollback record does not name its
source). The records a range needs when nothing was rescaled or rolled back inside it (the contiguous
versions below the head or the range's end) are read in parallel first (`PREFETCH_WORKERS`) and held by
the history itself (the :class:`CommitLog` keeps only a few): on S3 a long range costs a few round trips,
not one per batch.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from statekeeper.store.commit_log import CommitLog
from statekeeper.store.errors import ConfigurationError, LineageError, StatekeeperError
from statekeeper.store.formats.commit import CommitRecord

PREFETCH_WORKERS = 8
"""Commit records read at once when a walk knows which versions it will need."""
PREFETCH_WINDOW = 1024
"""Commit records read ahead before checking that they all exist (`BatchHistory._prefetch`)."""


@dataclass(frozen=True)
class ChangeRef:
    """The changelog of one partition holding the changes of one batch."""

    version: int
    checkpoint_id: str
    batch_id: int


@dataclass(frozen=True)
class Segment:
    """Consecutive logical changes of an operator written under one layout (oldest first)."""

    records: tuple[CommitRecord, ...]
    operator: str
    before: CommitRecord | None = None
    """The committed record of the version before the first, when the history holds it."""

    @property
    def partitions(self) -> int:
        return len(self.records[0].checkpoint_ids[self.operator])

    def parent(self, partition: int) -> str | None:
        """The checkpoint id the first changelog of partition `partition` extends, when known."""
        before = self.before
        if before is None or before.version != self.records[0].version - 1:
            return None
        ids = before.checkpoint_ids.get(self.operator)
        return ids[partition] if ids is not None and len(ids) == self.partitions else None

    def refs(self, partition: int) -> list[ChangeRef]:
        """The changelogs partition `partition` wrote in this segment, oldest first."""
        return [ChangeRef(r.version, r.checkpoint_ids[self.operator][partition], r.batch) for r in self.records]


class BatchHistory:
    """The history of `operator` from the committed `head` (default: the newest committed version)."""

    def __init__(self, commit_log: CommitLog, operator: str, root: str, head: int | None = None) -> None:
        self.log = commit_log
        self.operator = operator
        self.root = root
        self.head = commit_log.latest() if head is None else head
        self._path: list[CommitRecord] = []
        """The history read so far, newest first."""
        self._complete = self.head <= 0
        """Whether `_path` reaches the start of the history (version 1, or the operator's first version)."""
        self._expired: int | None = None
        """The version the walk needed and found missing (expired), if any."""
        self._fetched: dict[int, CommitRecord] = {}
        """Records read ahead of the walk (`_prefetch`)."""

    @property
    def head_record(self) -> CommitRecord:
        if not self._path and not self._extend():
            raise LineageError(f"no committed version of operator {self.operator!r} in {self.root}")
        return self._path[0]

    def _record(self, version: int) -> CommitRecord | None:
        record = self._fetched.get(version)
        if record is None:
            record = self.log.get(version)
        if record is None or self.operator not in record.checkpoint_ids:
            return None
        return record

    def _prefetch(self, versions: range) -> None:
        """Read the commit records of `versions` ahead of the walk, in parallel (errors and missing records
        are left for the walk, which reads a record again if it needs it).

        Newest first, in windows doubling up to `PREFETCH_WINDOW`, up to the first window missing a record: the
        walk stops at a missing one too. The range is a guess from the head record's claims, and a head of
        version 10**12 above records 1-3 made it read (and hold a future for) every version between."""

        def get(version: int) -> None:
            with contextlib.suppress(StatekeeperError):
                if (record := self.log.get(version)) is not None:
                    self._fetched[version] = record

        end, window = versions.stop, PREFETCH_WORKERS
        while len(chunk := range(max(versions.start, end - window), end)) > 1:
            with ThreadPoolExecutor(min(PREFETCH_WORKERS, len(chunk)), "statekeeper-history") as pool:
                list(pool.map(get, chunk))
            if any(v not in self._fetched for v in chunk):
                return
            end, window = chunk.start, min(2 * window, PREFETCH_WINDOW)

    def _predecessor(self, record: CommitRecord) -> int:
        """The version before `record` in the history (0: none)."""
        if record.change.get(self.operator) != "rollback":
            return record.version - 1
        source = record.copied_from.get(self.operator)
        if source is not None:
            return source
        for v in range(record.version - 1, 0, -1):  # a record written before `copied_from` existed
            older = self._record(v)
            if older is None or older.batch == record.batch:
                return v
        return 0

    def _extend(self) -> bool:
        """Read one more (older) version of the history; False when there is none."""
        if self._complete:
            return False
        version = self.head if not self._path else self._predecessor(self._path[-1])
        record = self._record(version) if version > 0 else None
        if record is None:
            self._complete = True
            if version > 0 and self.log.get(version) is None:
                self._expired = version
            if not self._path and version == self.head:
                found = self.log.get(version)
                has = "nothing" if found is None else f"operators {sorted(found.checkpoint_ids)}"
                raise ConfigurationError(
                    f"operator {self.operator!r} is not in the commit of version {version} in {self.root} "
                    f"(it has {has})"
                )
            return False
        self._path.append(record)
        return True

    def _gone(self, batch: int) -> LineageError:
        oldest = self._path[-1] if self._path else None
        why = "the operator has no state before it"
        if self._expired is not None:
            why = f"version {self._expired} has expired"
        if oldest is not None:
            why += f"; the oldest retained version of its history is {oldest.version} (batch {oldest.batch})"
        return LineageError(
            f"batch {batch} of operator {self.operator!r} is not in the committed history of {self.root}: {why}"
        )

    def _check_batch(self, batch: int) -> None:
        if batch < 0:
            raise ConfigurationError(f"batch id {batch} of the state reader must be >= 0 ({self.root})")
        head = self.head_record
        if batch > head.batch:
            raise ConfigurationError(
                f"batch {batch} of operator {self.operator!r} is not committed in {self.root} (the latest "
                f"committed batch is {head.batch}, version {head.version})"
            )

    def version_of(self, batch: int) -> int:
        """The latest version of the history carrying `batch` (the state after that batch)."""
        self._check_batch(batch)
        head = self._path[0]
        if len(self._path) == 1:  # without a rescale or rollback since, batch b is version head - (head batch - b)
            self._prefetch(range(max(1, head.version - (head.batch - batch)), head.version))
        i = 0
        while True:
            if i == len(self._path) and not self._extend():
                raise self._gone(batch)
            record = self._path[i]
            if record.batch == batch:
                return record.version
            if record.batch < batch:
                raise LineageError(
                    f"batch {batch} of operator {self.operator!r} is missing from the history of {self.root}: "
                    f"version {record.version} follows batch {record.batch}"
                )
            i += 1

    def changes(self, first: int, last: int) -> list[Segment]:
        """The versions holding the changes of batches `first`..`last`, by layout segment, oldest first."""
        self._check_batch(first)
        if last < first:
            raise ConfigurationError(
                f"changeEndBatchId {last} is before changeStartBatchId {first} "
                f"(operator {self.operator!r} in {self.root})"
            )
        try:
            end = self.version_of(last)
            self._prefetch(range(max(1, end - (last - first) - 1), end))
        except LineageError:
            if self._expired is None:
                raise
            raise self._gone(first) from None  # the range's first batch is gone too: name it
        while self._path[-1].batch >= first and self._extend():
            pass
        oldest = self._path[-1]
        reached = oldest.batch < first or (self._complete and self._expired is None)
        if not reached and (oldest.batch > first or self.operator in oldest.change):
            raise self._gone(first)
        segments: list[Segment] = []
        run: list[CommitRecord] = []
        before: CommitRecord | None = None  # the record before the run
        for record in reversed(self._path):  # oldest first
            if record.version > end:
                break
            if record.batch < first or self.operator in record.change:  # a rescale or rollback copies state
                if run:
                    segments.append(Segment(tuple(run), self.operator, before))
                run, before = [], record
                continue
            run.append(record)
        if run:
            segments.append(Segment(tuple(run), self.operator, before))
        return segments


__all__ = ["BatchHistory", "ChangeRef", "Segment"]
