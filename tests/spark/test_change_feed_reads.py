"""The change feed reads the lineage the load already has, not one commit record per version.

Reads are counted through a file manager that wraps the real one (every other part is real: RocksDB,
the changelogs a real processor committed through the partition task code).
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from statekeeper.store import CommitLog, StateStore, StoreConfig, open_file_manager
from statekeeper.store.errors import CorruptFileError, LineageError
from statekeeper.store.files import LocalFileManager
from statekeeper.store.files.base import CheckpointFileManager, FileInfo
from statekeeper.store.formats.changelog import ChangelogHeader
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.layout import CHANGELOG_DIR, COMMITS_DIR, SNAPSHOT_DIR, StoreId
from statekeeper.store.load_plan import committed_range
from statekeeper.store.spark.reader import change_feed
from statekeeper.store.spark.state_view import StateView, TypedSchemas
from statekeeper.store.spark.testing import OPERATOR, TwsTester
from testkit.hostile import reframed_changelog
from testkit.processors import TypedAll
from tests.maintenance.helpers import clobber

BATCHES = 12


class CountingFileManager:
    """Delegates to a real file manager and counts reads by kind of file (commit / changelog / ...)."""

    def __init__(self, inner: CheckpointFileManager) -> None:
        self.inner = inner
        self.reads: Counter[str] = Counter()

    def _count(self, op: str, path: str) -> None:
        kind = next((d for d in (COMMITS_DIR, CHANGELOG_DIR, SNAPSHOT_DIR) if f"{d}/" in f"/{path}"), "other")
        self.reads[f"{op} {kind}"] += 1

    def open(self, path: str) -> BinaryIO:
        self._count("read", path)
        return self.inner.open(path)

    def read_bytes(self, path: str) -> bytes:
        self._count("read", path)
        return self.inner.read_bytes(path)

    def download(self, path: str, local_path: str) -> int:
        self._count("read", path)
        return self.inner.download(path, local_path)

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[FileInfo]:
        self._count("list", prefix)
        return self.inner.list(prefix, start_after=start_after)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def tester(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwsTester]:
    with TwsTester(TypedAll(), key="user", output_schema="user string, count long, total long") as t:
        for b in range(BATCHES):
            t.run([{"user": f"u{(b * 3 + i) % 5}", "value": b * 10 + i} for i in range(4)])
        yield t


def _feed(tester: TwsTester, work: Path, first_batch: int) -> tuple[list[Any], Counter[str]]:
    fm = CountingFileManager(open_file_manager(tester.root))
    store = StateStore(fm, OPERATOR, 0, config=StoreConfig(local_dir=str(work)))
    try:
        store.load(BATCHES)
        changes = list(change_feed(StateView(store), "totals", first_batch))
    finally:
        store.close()
    return changes, fm.reads


def test_the_change_feed_costs_one_commit_record_however_many_versions(tester: TwsTester, tmp_path: Path) -> None:
    changes, reads = _feed(tester, tmp_path / "all", 0)
    # the load checks every changelog it replays against its version's commit record (invariant 13); the feed
    # reads none more
    assert reads["read commits"] == BATCHES
    assert reads["list snapshots"] == 1 and reads["list commits"] == 0
    # each changelog is read by the load's replay and once by the feed; the end one's header by the plan
    assert reads["read changelogs"] == 2 * BATCHES + 1
    assert [c.batch_id for c in changes] == sorted(c.batch_id for c in changes)
    assert {c.batch_id for c in changes} == set(range(BATCHES))

    before = CountingFileManager(open_file_manager(tester.root))
    log = CommitLog(before)
    for v in range(1, BATCHES + 1):
        log.committed_id(v, OPERATOR, 0)
    assert before.reads["read commits"] == BATCHES, "the old route: one commit record per version"

    # the feed over a suffix is the matching suffix of the whole feed, with the committed ids
    tail, tail_reads = _feed(tester, tmp_path / "tail", 7)
    assert tail == [c for c in changes if c.batch_id >= 7]
    assert tail_reads["read commits"] == BATCHES  # the load's checks, as above: the feed reads none


def test_committed_range_follows_capped_lineages_and_matches_the_commit_log(tmp_path: Path) -> None:
    root = tmp_path.as_uri()
    fm = open_file_manager(root)
    log = CommitLog(fm)
    store = StateStore(fm, "op", 0, config=StoreConfig(max_lineage=3, local_dir=str(tmp_path / "w")))
    try:
        for v in range(10):
            store.load(v, log.committed_id(v, "op", 0) if v else None)
            store.put(b"k", str(v).encode())
            result = store.commit()
            log.commit(v + 1, {"op": [result.checkpoint_id]})
        reader = StateStore(fm, "op", 0, config=StoreConfig(local_dir=str(tmp_path / "r")))
        try:
            reader.load(10)
            assert reader.last_plan is not None
            want = tuple((v, log.committed_id(v, "op", 0)) for v in range(1, 11))
            for first in (1, 4, 10):
                assert committed_range(reader.plan_source, reader.last_plan, first) == want[first - 1 :]
            with pytest.raises(LineageError, match="starts below 1"):
                committed_range(reader.plan_source, reader.last_plan, 0)
        finally:
            reader.close()
    finally:
        store.close()


def test_a_changelog_numbering_a_schema_differently_is_refused(tester: TwsTester, tmp_path: Path) -> None:
    """The reader's feed decodes every partition with the end version's schemas: a changelog that records
    another schema under one of their ids (a partition numbering its schemas differently) is refused."""
    fm = open_file_manager(tester.root)
    store = StateStore(fm, OPERATOR, 0, config=StoreConfig(local_dir=str(tmp_path)))
    try:
        store.load(BATCHES)
        view = StateView(store)
        first = [(1, CommitLog(fm).committed_id(1, OPERATOR, 0), 0)]
        assert list(TypedSchemas(view.key_schema, view.records, "").changes_of(fm, store.store_id, "totals", first))
        other = view.records["values"].schemas
        records = {**view.records, "totals": replace(view.records["totals"], schemas=dict(other))}
        with pytest.raises(CorruptStateError, match="records schema 1 of state variable 'totals' unlike"):
            list(TypedSchemas(view.key_schema, records, "").changes_of(fm, store.store_id, "totals", first))
    finally:
        store.close()


@pytest.mark.parametrize(
    "hostile", ["another version's changelog", "built on a losing attempt", "the range's first, on a losing attempt"]
)
def test_a_well_framed_changelog_that_is_not_the_committed_attempts_is_refused_naming_it(
    tester: TwsTester, tmp_path: Path, hostile: str
) -> None:
    """The reader's feed decodes the changelogs the commit records name, without a load: a file at a committed
    name whose header, every checksum right, names another version, or which extends an attempt that lost its
    version (also as the first of the range read: it is checked against the committed record before the range),
    holds the wrong changes and is refused naming it (not read as that batch's changes)."""
    src = Path(LocalFileManager(tester.root).root_path)
    shutil.copytree(src, tmp_path / "root")
    root = (tmp_path / "root").as_uri()
    fm = open_file_manager(root)
    log, store_id = CommitLog(fm), StoreId(OPERATOR, 0)
    refs = [(v, log.committed_id(v, OPERATOR, 0), v - 1) for v in range(1, BATCHES + 1)]
    path = store_id.changelog(*refs[4][:2])
    if hostile == "another version's changelog":
        clobber(root, path, fm.read_bytes(store_id.changelog(*refs[2][:2])))
        error: type[Exception] = CorruptFileError
    else:
        header = ChangelogHeader(OPERATOR, 0, 5, refs[4][1], ((4, "f" * 32),))
        clobber(root, path, reframed_changelog(header, fm.read_bytes(path)))
        error = LineageError
    store = StateStore(fm, OPERATOR, 0, config=StoreConfig(local_dir=str(tmp_path / "work")))
    try:
        store.load(3)  # below the planted file: the schemas, as the reader's driver reads them
        view = StateView(store)
        schemas = TypedSchemas(view.key_schema, view.records, "")
        if hostile == "the range's first, on a losing attempt":
            feed = schemas.changes_of(fm, store_id, "totals", refs[4:], parent=refs[3][1])
        else:
            feed = schemas.changes_of(fm, store_id, "totals", refs)
        with pytest.raises(error, match=re.escape(path)):
            list(feed)
    finally:
        store.close()
