"""Load replays only committed lineage (DESIGN invariant 13).

A changelog's header names the lineage it extends, but the commit records are the truth: a committed
changelog whose header names a losing attempt, another partition's attempt or another version's for an
earlier version must never make a load return that attempt's data. The load either repairs from the
committed path (logged, counted like a snapshot repair) or raises `LineageError` naming the file.

The histories are written with the product's own changelog writer (valid framing and checksums), so
only the ids are hostile; a hypothesis generator draws the lineage headers and a dict model says what
each committed version holds.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.errors import LineageError, StatekeeperError
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.formats.changelog import ChangelogHeader, ChangelogWriter, Lineage
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.layout import StoreId, commit_path

OP = "agg"
STORE = StoreId(OP, 0)
Model = dict[bytes, bytes]


@dataclass
class Checkpoint:
    """A root written changelog by changelog: two partitions, a losing attempt per version of partition 0."""

    fm: CheckpointFileManager
    work: str
    committed: dict[int, dict[int, str]] = field(default_factory=dict)  # version -> partition -> id
    losers: dict[int, str] = field(default_factory=dict)  # version -> losing id of partition 0
    model: dict[int, Model] = field(default_factory=lambda: {0: {}})  # committed state of partition 0

    def write(self, partition: int, version: int, lineage: Lineage, data: Model) -> str:
        cid = uuid.uuid4().hex
        local = os.path.join(self.work, f"{partition}-{version}-{cid}.changelog")
        w = ChangelogWriter(local, ChangelogHeader(OP, partition, version, cid, lineage))
        w.append_block("default", list(data), list(data.values()))
        w.finish()
        self.fm.put_file(local, StoreId(OP, partition).changelog(version, cid))
        os.unlink(local)
        return cid

    def committed_lineage(self, partition: int, version: int) -> Lineage:
        return tuple((u, self.committed[u][partition]) for u in range(version - 1, 0, -1))

    def honest(self, versions: int) -> None:
        """Versions 1..`versions`: every changelog's header names the committed ancestors."""
        for v in range(1, versions + 1):
            data = {b"k": b"committed-%d" % v, b"v%d" % v: b"c"}
            ids = {p: self.write(p, v, self.committed_lineage(p, v), data) for p in (0, 1)}
            self.losers[v] = self.write(0, v, self.committed_lineage(0, v), {b"k": b"LOST-%d" % v, b"lost": b"x"})
            self.commit(v, ids, data)

    def commit(self, version: int, ids: dict[int, str], data: Model) -> None:
        CommitLog(self.fm).commit(version, {OP: [ids[0], ids[1]]})
        self.committed[version] = ids
        self.model[version] = {**self.model[version - 1], **data}

    def hostile(self, version: int, lineage: Lineage) -> str:
        """Commit `version` with a changelog of partition 0 whose header names `lineage`; returns its path."""
        data = {b"top": b"%d" % version}
        ids = {
            0: self.write(0, version, lineage, data),
            1: self.write(1, version, self.committed_lineage(1, version), {}),
        }
        self.commit(version, ids, data)
        return STORE.changelog(version, ids[0])


def _load(fm: CheckpointFileManager, version: int, local: str) -> tuple[Model, StateStore]:
    store = StateStore(fm, OP, 0, config=StoreConfig(local_dir=local))
    store.load(version)
    got = dict(store.items())
    store.abort()
    return got, store


@pytest.fixture
def checkpoint(checkpoint_root: str) -> Iterator[Checkpoint]:
    work = tempfile.mkdtemp(prefix="sk-lineage-")
    yield Checkpoint(open_file_manager(f"{checkpoint_root}/{uuid.uuid4().hex[:8]}"), work)
    shutil.rmtree(work, ignore_errors=True)


def test_a_lineage_naming_a_losing_attempt_is_repaired_from_the_commit_records(
    checkpoint: Checkpoint, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint.honest(3)
    hostile = checkpoint.hostile(4, ((3, checkpoint.losers[3]), *checkpoint.committed_lineage(0, 3)))
    with caplog.at_level(logging.WARNING):
        got, store = _load(checkpoint.fm, 4, str(tmp_path / "a"))
    try:
        assert got == checkpoint.model[4], "the losing attempt's data was loaded"
        assert store.last_plan is not None and (3, checkpoint.losers[3]) not in store.last_plan.replay
        assert store.last_load is not None and store.last_load.repaired_snapshots == 1
        assert store.last_plan.repairs == 1
        # The next commit extends the committed lineage, not the hostile one.
        store.load(4)
        store.put(b"next", b"1")
        header_lineage = store._changelog().header.lineage
        assert header_lineage[:2] == ((4, checkpoint.committed[4][0]), (3, checkpoint.committed[3][0]))
        store.abort()
    finally:
        store.close()
    assert any(hostile.rpartition("/")[2] in r.getMessage() for r in caplog.records), caplog.text


def test_a_capped_lineage_leading_to_a_losing_attempt_is_repaired(checkpoint: Checkpoint, tmp_path: Path) -> None:
    """The walk reads one more header when the lineage is capped: that header is checked too."""
    checkpoint.honest(3)
    checkpoint.hostile(4, ((3, checkpoint.losers[3]),))
    got, store = _load(checkpoint.fm, 4, str(tmp_path / "a"))
    store.close()
    assert got == checkpoint.model[4]


def test_a_lineage_claiming_a_full_state_changelog_is_checked_against_the_commit_record(
    checkpoint: Checkpoint, tmp_path: Path
) -> None:
    """An empty lineage means a rescale's full-state changelog only where the commit record says so."""
    checkpoint.honest(3)
    checkpoint.hostile(4, ())
    got, store = _load(checkpoint.fm, 4, str(tmp_path / "a"))
    store.close()
    assert got == checkpoint.model[4]


def test_without_a_committed_path_the_load_names_the_file(checkpoint: Checkpoint, tmp_path: Path) -> None:
    checkpoint.honest(3)
    hostile = checkpoint.hostile(4, ((3, checkpoint.losers[3]), *checkpoint.committed_lineage(0, 3)))
    checkpoint.fm.delete_many([STORE.changelog(3, checkpoint.committed[3][0])])  # the committed path is gone
    with pytest.raises(LineageError, match=hostile.rpartition("/")[2]):
        _load(checkpoint.fm, 4, str(tmp_path / "a"))[1].close()


def test_a_warm_store_catching_up_checks_the_lineage_it_replays(checkpoint: Checkpoint, tmp_path: Path) -> None:
    checkpoint.honest(2)
    store = StateStore(checkpoint.fm, OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w")))
    try:
        store.load(1)
        store.abort()
        checkpoint.hostile(3, ((2, checkpoint.losers[2]), *checkpoint.committed_lineage(0, 2)))
        store.load(3)
        assert dict(store.items()) == checkpoint.model[3]
        store.abort()
    finally:
        store.close()


# -- a model over generated lineage headers --------------------------------------------------------------

ENTRY_KINDS = ("committed", "loser", "other partition", "other version")


@st.composite
def hostile_lineages(draw: st.DrawFn) -> tuple[int, list[str], int]:
    """(versions before the hostile one, the kind of each lineage entry newest first, entries kept)."""
    versions = draw(st.integers(1, 4))
    kinds = draw(st.lists(st.sampled_from(ENTRY_KINDS), min_size=versions, max_size=versions))
    kept = draw(st.integers(0, versions))
    return versions, kinds, kept


def _entry(cp: Checkpoint, u: int, kind: str) -> tuple[int, str]:
    if kind == "loser":
        return (u, cp.losers[u])
    if kind == "other partition":
        return (u, cp.committed[u][1])
    if kind == "other version":
        return (u, cp.committed[u - 1][0] if u > 1 else cp.losers[u])
    return (u, cp.committed[u][0])


@given(hostile_lineages())
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_generated_lineage_headers_never_load_uncommitted_data(
    tmp_path: Path, case: tuple[int, list[str], int]
) -> None:
    versions, kinds, kept = case
    root = tmp_path / f"root-{time.monotonic_ns()}"
    work = tempfile.mkdtemp(prefix="sk-lineage-")
    cp = Checkpoint(open_file_manager(root.as_uri()), work)
    try:
        cp.honest(versions)
        lineage = tuple(_entry(cp, versions - i, kind) for i, kind in enumerate(kinds))[:kept]
        hostile = cp.hostile(versions + 1, lineage)
        try:
            got, store = _load(cp.fm, versions + 1, str(root / "load"))
        except LineageError as e:
            assert hostile.rpartition("/")[2] in str(e), str(e)
            return
        store.close()
        assert got == cp.model[versions + 1], (kinds, kept)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


@given(
    warm=st.integers(1, 3),
    entries=st.lists(st.integers(1, 3), max_size=5),
)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_warm_catch_up_replays_only_the_versions_below_one_by_one(
    tmp_path: Path, warm: int, entries: list[int]
) -> None:
    """A header of version 4 naming committed attempts of other versions (repeated, out of order, skipping one):
    a store warm at `warm` replayed them as named, silently skipping or repeating a version's updates."""
    root = tmp_path / f"root-{time.monotonic_ns()}"
    work = tempfile.mkdtemp(prefix="sk-lineage-")
    cp = Checkpoint(open_file_manager(root.as_uri()), work)
    store = StateStore(cp.fm, OP, 0, config=StoreConfig(local_dir=str(root / "load")))
    try:
        cp.honest(3)
        store.load(warm)
        store.abort()
        hostile = cp.hostile(4, tuple((u, cp.committed[u][0]) for u in entries))
        try:
            store.load(4)
        except LineageError as e:
            assert hostile.rpartition("/")[2] in str(e), str(e)
            return
        assert dict(store.items()) == cp.model[4], entries
        store.abort()
    finally:
        store.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def test_a_commit_record_declaring_a_full_state_changelog_its_header_denies_is_never_replayed_from_empty(
    tmp_path: Path,
) -> None:
    """Version 2's record claims a rescale, its changelog's header extends version 1, and version 3's header names
    an attempt no record does: the repair along the commit records replayed version 2's changes from the empty
    state, silently losing version 1's."""
    root = tmp_path / "root"
    cp = Checkpoint(open_file_manager(root.as_uri()), str(tmp_path / "work"))
    os.makedirs(cp.work)
    cp.honest(2)
    record = root / commit_path(2)
    claimed = replace(CommitRecord.from_bytes(record.read_bytes(), str(record)), change={OP: "rescale"})
    record.write_bytes(claimed.to_bytes())
    hostile = cp.hostile(3, ((2, uuid.uuid4().hex),))
    try:
        got, store = _load(cp.fm, 3, str(tmp_path / "load"))
    except StatekeeperError as e:
        assert STORE.changelog(2, cp.committed[2][0]) in str(e) or hostile in str(e), str(e)
        return
    store.close()
    assert got == cp.model[3]
