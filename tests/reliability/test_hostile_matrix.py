"""Checkpoint content is untrusted (DESIGN invariant 12), as a matrix: each hostile class (`testkit.hostile`)
planted in the first of two stores of a root, on local disk and on S3 (moto), then every reader run on it in
turn (load, inspect, verify, verify --rebuild, catalog sync, clean-orphans, expire, snapshot), with a canary
directory beside the root. Each cell's outcome must be `EXPECTED`'s (refused or reported naming the file, or
repaired), and after every reader: nothing written outside the root and its work directory, the canary intact,
the reader done within a minute, RSS and temp disk bounded; at the end every retained version of the other
store, and every retained version of the bad one the file is not part of, loads exactly (nothing needed deleted).
The state data source's typed read and change feed run on a typed operator's root of their own, with the same
class planted the same way and the same bounds (`test_the_typed_readers_refuse_or_read_around_each_hostile_class`).

The default run covers every class on local disk and one on S3 (the oversized manifest: S3's whole-file
cap); the rest of S3 is `slow`. With STATEKEEPER_HOSTILE_RESULT=FILE the outcomes seen are written there as
JSON (bench/reliability.py turns them into docs/reliability.md's table).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from statekeeper.maintenance.build_processes import close_build_processes
from statekeeper.maintenance.cli import main
from statekeeper.maintenance.inventory import Inventory, clear_caches
from statekeeper.maintenance.replica_pool import close_replicas
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.errors import StatekeeperError
from statekeeper.store.files import LocalFileManager, open_file_manager
from statekeeper.store.files.base import CheckpointFileManager
from statekeeper.store.files.s3 import download
from statekeeper.store.formats import changelog as cl
from statekeeper.store.formats import snapshot as snap
from statekeeper.store.formats.framing import decode_whole_frame, encode_frame
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import StoreId
from statekeeper.store.spark.reader import StateDataSource
from statekeeper.store.spark.testing import OPERATOR, TwsTester
from testkit.hostile import CLASSES, EXPECTED, READERS, TYPED_READERS, framed, reframed_changelog, tree_contents
from testkit.processors import TypedAll
from tests.maintenance.helpers import History, clobber, small_settings, snapshotted_history

RESULT_ENV = "STATEKEEPER_HOSTILE_RESULT"
S3_DEFAULT = ("special or oversized file",)
"""The classes whose S3 variant runs by default (the rest under `slow`)."""
SMALL_CAP = 64 * 1024
RSS_BOUND_MIB = 512
TEMP_BOUND_BYTES = 64 << 20
COMMAND_SECONDS = 60.0
TYPED_BATCHES = 12
TYPED_OUTPUT = "user string, count long, total long"


def _cases() -> list[object]:
    out: list[object] = []
    for backend in ("local", "s3"):
        for cls in CLASSES:
            slow = backend == "s3" and cls not in S3_DEFAULT
            out.append(pytest.param(backend, cls, id=f"{backend}-{cls}", marks=[pytest.mark.slow] if slow else []))
    return out


def _size(top: Path) -> int:
    return sum(p.stat().st_size for p in top.rglob("*") if p.is_file() and not p.is_symlink()) if top.exists() else 0


def _newest(fm: CheckpointFileManager, store: StoreId, kind: str) -> str:
    files = Inventory.scan(fm, use_cache=False).files_of(store)
    entries = files.manifests if kind == "manifest" else files.changelogs
    return entries[max(entries)].path


def plant(root: str, store: StoreId, cls: str, outside: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make one file of `store` hostile (class `cls`); returns its path under the root."""
    fm = open_file_manager(root)
    if cls in ("lineage", "malformed frame"):
        path = _newest(fm, store, "changelog")
        data = fm.read_bytes(path)
        if cls == "malformed frame":
            deep = b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            clobber(root, path, framed(deep, cl.MAGIC, cl.FORMAT_VERSION))
        else:
            version = CommitLog(fm).latest()
            cid = CommitLog(fm).committed_id(version, store.operator, store.partition)
            header = cl.ChangelogHeader(store.operator, store.partition, version, cid, ((version - 1, "f" * 32),))
            clobber(root, path, reframed_changelog(header, data))
        return path
    path = _newest(fm, store, "manifest")
    m = SnapshotManifest.from_bytes(fm.read_bytes(path), path)
    if cls == "path names":
        first = dataclasses.replace(m.sst_files[0], local_name=f"{outside}/evil.sst")
        hostile = dataclasses.replace(
            m, sst_files=(first, *m.sst_files[1:]), db_files={**m.db_files, "../../../evil": b"x"}
        )
        clobber(root, path, hostile.to_bytes())
    elif cls == "unopenable snapshot":
        clobber(root, path, dataclasses.replace(m, db_files={**m.db_files, "CURRENT": b"MANIFEST-999999\n"}).to_bytes())
    elif isinstance(fm, LocalFileManager):
        clobber(root, path, None)
        os.mkfifo(Path(fm.root_path) / path)
    else:
        monkeypatch.setattr(download, "MAX_WHOLE_FILE", SMALL_CAP)
        payload = decode_whole_frame(m.to_bytes(), snap.MAGIC, snap.FORMAT_VERSION, path)
        padded = encode_frame(snap.MAGIC, snap.FORMAT_VERSION, {**payload, "padding": "x" * SMALL_CAP})
        assert SnapshotManifest.from_bytes(padded, path) == m, "a valid manifest but for its size"
        clobber(root, path, padded)
    return path


def _canary(tmp_path: Path) -> Path:
    """The directory beside the root a hostile file points out to, with a canary in it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("precious")
    return outside


@dataclasses.dataclass
class _Bounds:
    """What each reader must leave as it found it (everything under `top` but `skip`, the canary) and the time,
    temp disk (`work`) and RSS it may take."""

    top: Path
    skip: tuple[Path, ...]
    work: Path

    def __post_init__(self) -> None:
        self.outside = self.top / "outside"
        self.before = tree_contents(self.top, self.skip)
        self.rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def check(self, reader: str, t0: float) -> None:
        """After `reader`, started at `t0`."""
        assert time.monotonic() - t0 < COMMAND_SECONDS, f"{reader} took too long"
        assert tree_contents(self.top, self.skip) == self.before, f"{reader}: a file changed outside the root"
        assert (self.outside / "canary.txt").read_text() == "precious"
        assert _size(self.work) < TEMP_BOUND_BYTES, f"{reader}: {_size(self.work)} bytes of temp disk"

    def check_end(self) -> None:
        rss_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.rss_before) / 1024
        assert rss_mib < RSS_BOUND_MIB, f"peak RSS grew {rss_mib:.0f} MiB"
        assert not (self.outside / "evil.sst").exists()


def _load_outcome(h: History, path: str, work: Path) -> str:
    s = h.stores[0]
    probe = StateStore(h.fm, s.operator, s.partition, config=StoreConfig(local_dir=str(work / "load")))
    try:
        cid, state = h.committed[h.latest][s]
        try:
            probe.load(h.latest, cid)
        except StatekeeperError as e:
            return f"refused ({type(e).__name__})" + (", file named" if path in str(e) else "")
        got = {cf: dict(probe.items(cf=cf)) for cf in probe.column_families()}
        assert {cf: kv for cf, kv in got.items() if kv} == state, "a load returned other state"
        repaired = probe.last_load is not None and probe.last_load.repaired_snapshots > 0
        return "repaired" if repaired else "loaded"
    finally:
        probe.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("backend", "cls"), _cases())
def test_every_reader_refuses_or_repairs_each_hostile_class(
    request: pytest.FixtureRequest,
    settings: MaintenanceSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    backend: str,
    cls: str,
) -> None:
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    root = (tmp_path / "ckpt").as_uri() if backend == "local" else f"s3://{request.getfixturevalue('s3_bucket')}/ckpt"
    made: list[History] = []

    def make(**kw: object) -> History:
        made.append(History(f"{root}/{uuid.uuid4().hex[:10]}", **kw))  # type: ignore[arg-type]
        return made[-1]

    try:
        _run_matrix_row(
            snapshotted_history(make, settings), settings, tmp_path, monkeypatch, capsys, caplog, backend, cls
        )
    finally:
        for h in made:
            h.close()
        close_build_processes()
        close_replicas()
        clear_caches()


@pytest.fixture
def settings(tmp_path: Path) -> MaintenanceSettings:
    """Small numbers so a few batches exercise every rule; no grace period (as tests/maintenance's)."""
    return small_settings(str(tmp_path / "work"))


def _run_matrix_row(
    h: History,
    settings: MaintenanceSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    backend: str,
    cls: str,
) -> None:
    work = tmp_path / "work"
    path = plant(h.root, h.stores[0], cls, _canary(tmp_path), monkeypatch)
    bounds = _Bounds(tmp_path, (tmp_path / "ckpt", work, tmp_path / "home"), work)
    caplog.set_level(logging.WARNING)
    seen: dict[str, str] = {}
    for reader in (r for r in READERS if r not in TYPED_READERS):
        caplog.clear()
        t0 = time.monotonic()
        if reader == "load":
            seen[reader] = _load_outcome(h, path, work)
        else:
            args = [*reader.split(), h.root, "--json"]
            args += {
                "snapshot": ["--threshold", "1"],
                "expire": ["--retain", "3"],
                "clean-orphans": ["--grace", "0"],
            }.get(reader, [])
            args += ["--full"] if reader == "catalog sync" else ["--work-dir", str(work)]
            code = main(args)
            out = capsys.readouterr()
            named = path in out.out + out.err + caplog.text
            if reader == "verify" and backend == "s3" and cls == "special or oversized file":
                assert "limit of a file read whole" in out.out, out.out[-2000:]  # S3's cap refused it unread
            seen[reader] = f"exit {code}" + (", file named" if named else "")
        bounds.check(reader, t0)
    bounds.check_end()
    _record(backend, cls, seen)
    h.check_loadable(h.retained(settings), h.stores[1:])
    hit = {h.latest} if cls in ("lineage", "malformed frame") else set()  # the versions the bad file is part of
    h.check_loadable([v for v in h.retained(settings) if v not in hit], h.stores[:1])  # nothing needed deleted
    assert seen == {r: o for r, o in EXPECTED[backend][cls].items() if r not in TYPED_READERS}, seen


def _record(backend: str, cls: str, seen: dict[str, str]) -> None:
    out = os.environ.get(RESULT_ENV)
    if not out:
        return
    data = json.loads(Path(out).read_text()) if os.path.exists(out) else {}
    data.setdefault(backend, {}).setdefault(cls, {}).update(seen)
    Path(out).write_text(json.dumps(data, indent=1, sort_keys=True))


# -- the typed readers: the state data source's read and its change feed -------------------------------------


def _typed_root(tmp_path: Path, root: str, settings: MaintenanceSettings) -> None:
    """A typed operator (`testkit.processors.TypedAll`, one partition) written through the partition task code,
    snapshotted after batch 6 of 12, at `root` (local, or copied to S3 as finished publishes)."""
    with TwsTester(TypedAll(), key="user", output_schema=TYPED_OUTPUT, directory=tmp_path / "tws") as t:
        for b in range(TYPED_BATCHES):
            t.run([{"user": f"u{(b * 3 + i) % 5}", "value": b * 10 + i} for i in range(4)])
            if b == TYPED_BATCHES // 2:
                create_snapshots(t.fm, settings)
        written = Path(LocalFileManager(t.root).root_path)
    if root == t.root:
        return
    for f in sorted(written.rglob("*")):
        if f.is_file():
            clobber(root, f.relative_to(written).as_posix(), f.read_bytes())


def _typed_read(root: str, reader: str) -> list[tuple[object, ...]]:
    """Every row of `reader` (a `TYPED_READERS` name) through the data source Spark's tasks run (no Spark needed)."""
    options = {"root": root, "operator": OPERATOR, "stateVarName": "totals"}
    if reader == "change feed":
        options |= {"readChangeFeed": "true", "changeStartBatchId": "0"}
    source = StateDataSource(options)
    partitions = source.reader(source.schema())
    return sorted((tuple(r) for part in partitions.partitions() for r in partitions.read(part)), key=repr)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("backend", "cls"), _cases())
def test_the_typed_readers_refuse_or_read_around_each_hostile_class(
    request: pytest.FixtureRequest,
    settings: MaintenanceSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    backend: str,
    cls: str,
) -> None:
    """The state data source's typed read and its change feed (`readChangeFeed`) on a typed root with one hostile
    file: each reads exactly the rows an undamaged copy gives, or is refused naming the file; with the same bounds
    as the matrix above (nothing written outside, canary intact, under a minute, RSS and temp disk bounded)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))  # the reader's scratch stores, measured below
    root = (tmp_path / "tws" / "checkpoint").as_uri()
    if backend == "s3":
        root = f"s3://{request.getfixturevalue('s3_bucket')}/typed"
    _typed_root(tmp_path, root, settings)
    clean = {reader: _typed_read(root, reader) for reader in TYPED_READERS}
    assert all(clean.values())
    path = plant(root, StoreId(OPERATOR, 0), cls, _canary(tmp_path), monkeypatch)
    bounds = _Bounds(tmp_path, (tmp_path / "tws", work), work)
    caplog.set_level(logging.WARNING)
    seen: dict[str, str] = {}
    for reader in TYPED_READERS:
        clear_caches()
        caplog.clear()
        t0 = time.monotonic()
        try:
            rows = _typed_read(root, reader)
        except StatekeeperError as e:
            seen[reader] = f"refused ({type(e).__name__})" + (", file named" if path in str(e) else "")
        else:
            assert rows == clean[reader], f"{reader}: rows other than the undamaged root's"
            # the load's repair warning: "...; loading version N without it" / "... along the commit records instead"
            repaired = any(path in r.getMessage() and "loading version" in r.getMessage() for r in caplog.records)
            named = ", file named" if path in caplog.text else ""
            seen[reader] = "repaired" if repaired else f"read exactly{named}"
        bounds.check(reader, t0)
    bounds.check_end()
    _record(backend, cls, seen)
    assert seen == {r: EXPECTED[backend][cls][r] for r in TYPED_READERS}, seen
