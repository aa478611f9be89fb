"""Batch id -> version resolution and change segments over real commit records, against a model.

A random run of batches, rescales and rollbacks (to any committed version, a rolled-back branch's
included) commits real records through `CommitLog` on a local root; expiry deletes the oldest records.
The model keeps each version's history (the versions whose state it builds on); `BatchHistory` must
agree for every batch and range, or refuse with an error naming the batch when a needed version expired.
"""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.store.batch_history import BatchHistory
from statekeeper.store.commit_log import RECORDS_CACHED, CommitLog
from statekeeper.store.errors import ConfigurationError, LineageError
from statekeeper.store.files import open_file_manager
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.layout import commit_path

OP = "op"


def _ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


@dataclass
class Model:
    """What each committed version is: its batch, whether it only copies state, and its history."""

    batch: dict[int, int] = field(default_factory=dict)
    copy: set[int] = field(default_factory=set)
    history: dict[int, list[int]] = field(default_factory=dict)
    """Version -> the versions of its history, oldest first, itself last."""

    @property
    def head(self) -> int:
        return max(self.batch, default=0)


def _run(root: Path, steps: list[tuple[str, int]], *, record_source: bool = True) -> Model:
    log = CommitLog(open_file_manager(root.as_uri()))
    model = Model()
    parts = 2
    for kind, arg in steps:
        head = model.head
        v = head + 1
        if kind == "batch" or head == 0:
            log.commit(v, {OP: _ids(parts)}, layouts={OP: KeyGroupLayout(parts, 64)})
            model.batch[v] = model.batch.get(head, -1) + 1
            model.history[v] = [*model.history.get(head, []), v]
            continue
        if kind == "rescale":
            parts = 1 + arg % 4
            source = head
        else:
            source = 1 + arg % head
            record = log.get(source)
            assert record is not None
            parts = len(record.checkpoint_ids[OP])
        log.commit(
            v,
            {OP: _ids(parts)},
            layouts={OP: KeyGroupLayout(parts, 64)},
            batch_id=model.batch[source],
            change={OP: kind},
            copied_from={OP: source} if record_source else None,
        )
        model.batch[v] = model.batch[source]
        model.copy.add(v)
        model.history[v] = [*model.history[source], v]
    return model


steps_strategy = st.lists(
    st.tuples(st.sampled_from(["batch", "batch", "batch", "rescale", "rollback"]), st.integers(0, 50)),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps=steps_strategy, expire=st.integers(0, 6), data=st.data())
def test_batch_history_matches_the_model(steps: list[tuple[str, int]], expire: int, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = _run(root, steps)
        floor = min(expire, model.head - 1)
        for v in range(1, floor + 1):  # expiry: commit records below the floor are gone
            (root / commit_path(v)).unlink()
        history = model.history[model.head]
        log = CommitLog(open_file_manager(root.as_uri()))
        last_batch = model.batch[model.head]

        def latest(b: int) -> int:
            return max(v for v in history if model.batch[v] == b)

        for b in range(last_batch + 1):
            h = BatchHistory(log, OP, root.as_uri())
            if latest(b) <= floor:
                with pytest.raises(LineageError, match=f"batch {b} of operator"):
                    h.version_of(b)
            else:
                assert h.version_of(b) == latest(b)
        with pytest.raises(ConfigurationError, match=f"batch {last_batch + 1} .* not committed"):
            BatchHistory(log, OP, root.as_uri()).version_of(last_batch + 1)

        first = data.draw(st.integers(0, last_batch))
        last = data.draw(st.integers(first, last_batch))
        h = BatchHistory(log, OP, root.as_uri())
        wanted = [v for v in history if first <= model.batch[v] and v <= latest(last)]
        if wanted[0] <= floor:
            with pytest.raises(LineageError, match=f"batch {first} of operator"):
                h.changes(first, last)
            return
        segments = h.changes(first, last)
        got = [[r.version for r in s.records] for s in segments]
        want: list[list[int]] = [[]]
        for v in wanted:
            if v in model.copy:
                want.append([])
            else:
                want[-1].append(v)
        assert got == [s for s in want if s]
        for s in segments:
            for p in range(s.partitions):
                assert [(r.version, r.batch_id) for r in s.refs(p)] == [
                    (v.version, model.batch[v.version]) for v in s.records
                ]
                # the first changelog's parent: the committed id of the version before, when the chain holds it
                before = s.records[0].version - 1
                if before in history and before > floor:
                    record = log.get(before)
                    assert record is not None and s.parent(p) == record.checkpoint_ids[OP][p]


def test_a_rollback_record_without_its_source_falls_back_to_the_newest_version_of_its_batch(tmp_path: Path) -> None:
    model = _run(tmp_path, [("batch", 0)] * 5 + [("rollback", 2)] + [("batch", 0)] * 2, record_source=False)
    log = CommitLog(open_file_manager(tmp_path.as_uri()))
    h = BatchHistory(log, OP, tmp_path.as_uri())
    assert model.history[8] == [1, 2, 3, 6, 7, 8]
    assert [h.version_of(b) for b in range(5)] == [1, 2, 6, 7, 8]
    assert [[r.version for r in s.records] for s in h.changes(0, 4)] == [[1, 2, 3], [7, 8]]
    assert [r.batch for s in h.changes(0, 4) for r in s.records] == [0, 1, 2, 3, 4]


class _CountingCommits:
    """A real file manager that counts the commit records read."""

    def __init__(self, root: Path) -> None:
        self.inner = open_file_manager(root.as_uri())
        self.reads = 0

    def read_bytes(self, path: str) -> bytes:
        self.reads += path.startswith(commit_path(1).split("/")[0])
        return self.inner.read_bytes(path)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_read_costs_the_records_of_its_range_not_the_whole_log(tmp_path: Path) -> None:
    _run(tmp_path, [("batch", 0)] * 40 + [("rescale", 1)] + [("batch", 0)] * 9)  # head: version 50, batch 48
    fm = _CountingCommits(tmp_path)
    h = BatchHistory(CommitLog(fm), OP, tmp_path.as_uri())  # type: ignore[arg-type]
    assert h.version_of(48) == 50 and fm.reads == 1  # the latest batch: the head's record only
    segments = h.changes(38, 48)  # batches 38..48: versions 39..50, the rescale (41) cut out
    assert [[r.version for r in s.records] for s in segments] == [[39, 40], list(range(42, 51))]
    assert fm.reads == 13  # versions 38..50: the range and the one below it


def test_a_range_longer_than_the_logs_cache_reads_each_record_once(tmp_path: Path) -> None:
    """The commit log keeps only the most recent records (`RECORDS_CACHED`); the records a long range
    reads ahead stay with the history until its walk takes them."""
    batches = 2 * RECORDS_CACHED + 20
    _run(tmp_path, [("batch", 0)] * batches)
    fm = _CountingCommits(tmp_path)
    h = BatchHistory(CommitLog(fm), OP, tmp_path.as_uri())  # type: ignore[arg-type]
    segments = h.changes(0, batches - 1)
    assert [r.version for s in segments for r in s.records] == list(range(1, batches + 1))
    assert fm.reads <= batches + 1, fm.reads  # each record once (the head's twice at most)


def test_an_unknown_operator_is_refused_naming_the_ones_there(tmp_path: Path) -> None:
    _run(tmp_path, [("batch", 0)])
    h = BatchHistory(CommitLog(open_file_manager(tmp_path.as_uri())), "other", tmp_path.as_uri())
    with pytest.raises(ConfigurationError, match=r"operator 'other' is not in the commit of version 1 .*\['op'\]"):
        h.version_of(0)
