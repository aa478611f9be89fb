"""Crashes at any instant (DESIGN invariants 1, 2 and 3), with real processes and SIGKILL.

A writer process (`tests/store/helpers/crash_writer.py`) writes through the checkpoint file manager
or runs the store's commit loop, and is killed with SIGKILL after chosen and random delays, or kills
itself just before / after the N-th fsync, link, unlink or rename (an exact point inside a publish).
After every kill the checkpoint location is checked:

* every file under a final name is complete: blobs carry their own length and checksum, changelogs,
  commit records and manifests parse and verify from end to end, SSTs hash to their names, and
  every SST a manifest lists is there (invariant 1);
* anything else is a hidden temp file, exactly what `LocalFileManager.list_temp_files` reports;
* no file, once seen under a final name, ever changes (invariant 2; checked by inode, size, mtime);
* every version the writer reported committed has a commit record, the committed versions are
  1..latest without a gap, and each loads to exactly the state derived from its version number
  (invariant 3). A load costs two RocksDB rebuilds (~0.1 s, more on a busy machine), so each round
  loads a sample: the first and the latest version committed since the previous round, two random
  ones in between, and a random older one. The slow variants load every new version in every
  round (the random-kill one also all versions at the end).

Local disk only: SIGKILL is a process crash, so this shows atomic publish against a dying writer, not
against power loss (the fsyncs are there for that, but a test cannot pull the plug).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.files import LocalFileManager
from statekeeper.store.files.local import is_temp_name
from statekeeper.store.formats.changelog import ChangelogReader
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import parse_commit_name, parse_versioned_name
from tests.store.helpers.crash_writer import CF2, OPERATOR, PARTITIONS, apply, batch_updates, check_blob

REPO = Path(__file__).resolve().parents[2]
WRITER = [sys.executable, "-m", "tests.store.helpers.crash_writer"]
# Delays after the writer reports "ready": the first instants of a publish, then spread out. The
# store writer commits ~30 versions/s on an idle machine (fewer when the 2 cores are shared).
FILE_DELAYS = [0.0, 0.001, 0.003, 0.007, 0.015, 0.03, 0.06, 0.12, 0.25, 0.5]
STORE_DELAYS = [0.0, 0.01, 0.04, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 1.1]


# -- running and killing writers --------------------------------------------------------------------


@dataclass
class Run:
    proc: subprocess.Popen[bytes]
    progress: Path
    stderr: Path

    def lines(self) -> list[str]:
        text = self.progress.read_text() if self.progress.exists() else ""
        complete = text[: text.rfind("\n") + 1]  # a line cut by the kill is not a report
        return complete.splitlines()

    def diagnostics(self) -> str:
        return f"exit {self.proc.returncode}; progress {self.lines()[-3:]}; stderr:\n{self.stderr.read_text()}"


def start(tmp: Path, n: int, mode: str, *args: str, root: Path | None = None) -> Run:
    progress, stderr = tmp / f"progress-{n}.txt", tmp / f"stderr-{n}.txt"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [*WRITER, mode, str(root or tmp / "root"), str(progress), *args],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return Run(proc, progress, stderr)


def wait_ready(run: Run, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(line.startswith("ready") for line in run.lines()):
        if run.proc.poll() is not None:
            pytest.fail(f"writer died before it was ready: {run.diagnostics()}")
        if time.monotonic() > deadline:
            run.proc.kill()
            pytest.fail(f"writer not ready after {timeout}s: {run.diagnostics()}")
        time.sleep(0.002)


def kill_after(run: Run, delay: float) -> None:
    wait_ready(run)
    time.sleep(delay)
    if run.proc.poll() is None:
        run.proc.send_signal(signal.SIGKILL)
    run.proc.wait(timeout=30)
    assert run.proc.returncode == -signal.SIGKILL, f"writer failed instead of being killed: {run.diagnostics()}"


def finish(run: Run, timeout: float = 60.0) -> bool:
    """Wait for a writer that kills itself; True if it did, False if it ran to the end."""
    run.proc.wait(timeout=timeout)
    if run.proc.returncode == 0:
        return False
    assert run.proc.returncode == -signal.SIGKILL, f"writer failed: {run.diagnostics()}"
    return True


# -- checking the checkpoint location ---------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class TreeChecker:
    """Verifies every file of a checkpoint root; remembers what it verified so that later rounds
    only re-verify what changed, and flags any change to a file that may never change."""

    root: Path
    seen: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # path -> (inode, size, mtime_ns)
    replaceable_prefixes: tuple[str, ...] = ("shared/",)  # published with exclusive=False on purpose
    checked_files: int = 0
    temp_files_seen: int = 0

    def check(self) -> list[str]:
        fm = LocalFileManager(str(self.root))
        finals: list[str] = []
        temps: set[str] = set()
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                rel = os.path.relpath(os.path.join(dirpath, name), self.root)
                if is_temp_name(name):
                    temps.add(rel)
                else:
                    finals.append(rel)
        assert {i.path for i in fm.list_temp_files()} == temps
        assert [i.path for i in fm.list()] == sorted(finals), "listing must show exactly the published files"
        self.temp_files_seen += len(temps)
        for rel in sorted(finals):
            st = os.stat(self.root / rel)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            before = self.seen.get(rel)
            if before == key:
                continue
            if before is not None and not rel.startswith(self.replaceable_prefixes):
                pytest.fail(f"{rel} changed after it was published: {before} -> {key} (invariant 2)")
            self.verify(rel)
            self.seen[rel] = key
            self.checked_files += 1
        return finals

    def verify(self, rel: str) -> None:
        path = self.root / rel
        if rel.startswith(("blobs/", "shared/")):
            name = check_blob(path.read_bytes(), rel)
            if rel.startswith("blobs/"):
                assert rel == f"blobs/{name}.blob"
        elif rel.startswith("commits/"):
            version = parse_commit_name(rel)
            assert version is not None, f"unexpected file {rel}"
            record = CommitRecord.from_bytes(path.read_bytes(), rel)
            assert record.version == version
            assert len(record.checkpoint_ids[OPERATOR]) == PARTITIONS
        elif rel.startswith(f"state/{OPERATOR}/"):
            self.verify_state_file(rel)
        else:
            pytest.fail(f"unexpected file {rel}")

    def verify_state_file(self, rel: str) -> None:
        path = self.root / rel
        _, _, part, kind, fname = rel.split("/")
        partition = int(part)
        if kind == "sst":
            assert fname == sha256_file(path)[:40] + ".sst", f"{rel}: content does not hash to its name"
            return
        parsed = parse_versioned_name(fname)
        assert parsed is not None, f"unexpected file {rel}"
        version, ckpt, suffix = parsed
        if kind == "changelogs" and suffix == ".changelog":
            with open(path, "rb") as f:
                reader = ChangelogReader(f, rel)
                h = reader.header
                assert (h.operator, h.partition, h.version, h.checkpoint_id) == (OPERATOR, partition, version, ckpt)
                _, records = reader.check_footer()
                assert sum(len(keys) for _, keys, _ in reader.blocks()) == records
        elif kind == "snapshots" and suffix == ".manifest":
            m = SnapshotManifest.from_bytes(path.read_bytes(), rel)
            assert (m.operator, m.partition, m.version, m.checkpoint_id) == (OPERATOR, partition, version, ckpt)
            for sst in m.sst_files:  # the manifest is written last: everything it names is complete
                sst_path = self.root / f"state/{OPERATOR}/{part}/sst/{sst.remote_name}"
                assert sst_path.stat().st_size == sst.size, f"{rel}: SST {sst.remote_name} has the wrong size"
                assert sha256_file(sst_path) == sst.sha256
        else:
            pytest.fail(f"unexpected file {rel}")


class ExpectedStates:
    """The state of (partition, version), derived from the version number alone."""

    EVERY = 5

    def __init__(self) -> None:
        empty: dict[str, dict[bytes, bytes]] = {"default": {}, CF2: {}}
        self._saved: dict[tuple[int, int], dict[str, dict[bytes, bytes]]] = {(p, 0): empty for p in range(PARTITIONS)}

    def get(self, partition: int, version: int) -> dict[str, dict[bytes, bytes]]:
        base = max(v for (p, v) in self._saved if p == partition and v <= version)
        state = {cf: dict(kv) for cf, kv in self._saved[(partition, base)].items()}
        for v in range(base + 1, version + 1):
            apply(state, batch_updates(partition, v))
            if v % self.EVERY == 0:
                self._saved[(partition, v)] = {cf: dict(kv) for cf, kv in state.items()}
        return state


class VersionChecker:
    """Loads committed versions with a fresh store per partition and compares them with the model."""

    def __init__(self, root: Path, work: Path) -> None:
        self.root = root
        self.expected = ExpectedStates()
        self.stores = [
            StateStore(str(root), OPERATOR, p, config=StoreConfig(local_dir=str(work / f"check-{p}")))
            for p in range(PARTITIONS)
        ]
        self.verified: set[int] = set()
        self.rng = random.Random(1)

    def close(self) -> None:
        for s in self.stores:
            s.close()

    def committed(self) -> list[int]:
        versions = list(CommitLog(LocalFileManager(str(self.root))).versions())
        assert versions == list(range(1, len(versions) + 1)), f"gap in committed versions: {versions}"
        return versions

    def check(self, reported: set[int], *, sample_new: int | None = None, everything: bool = False) -> int:
        """Load the versions committed since the last check (at most `sample_new` of them: the
        first, the latest and random ones in between), plus a random older one."""
        versions = self.committed()
        missing = reported - set(versions)
        assert not missing, f"versions reported committed but not durable: {sorted(missing)} (invariant 3)"
        new = [v for v in versions if v not in self.verified]
        if sample_new is not None and len(new) > sample_new:
            new = [new[0], new[-1], *self.rng.sample(new[1:-1], max(0, sample_new - 2))]
        todo = set(new)
        if versions:
            todo.add(versions[-1])
            todo.add(self.rng.choice(versions))
        if everything:
            todo = set(versions)
        for v in sorted(todo):
            self.load_and_compare(v)
            self.verified.add(v)
        return len(versions)

    def load_and_compare(self, version: int) -> None:
        for p, s in enumerate(self.stores):
            s.load(version)
            want = self.expected.get(p, version)
            assert sorted(s.column_families()) == sorted(want), f"column families of {p}@{version}"
            for cf, kv in want.items():
                got = dict(s.items(cf=cf))
                assert got == kv, f"partition {p} version {version} column family {cf}: state differs from the model"
            s.abort()


# -- the tests --------------------------------------------------------------------------------------


def delays(chosen: list[float], n: int, seed: int) -> list[float]:
    """The chosen delays first, then random ones over the same range."""
    rng = random.Random(seed)
    return chosen[:n] + [rng.uniform(0.0, max(chosen)) for _ in range(n - len(chosen))]


def files_crash_loop(tmp_path: Path, kills: int) -> None:
    tree = TreeChecker(tmp_path / "root")
    reported: set[str] = set()
    for n, delay in enumerate(delays(FILE_DELAYS, kills, seed=11)):
        run = start(tmp_path, n, "files", "--run", str(n))
        kill_after(run, delay)
        tree.check()
        for line in run.lines():
            if line.startswith("published "):
                reported.add(line.split()[1])
        for path in reported:  # a publish that returned survives the crash
            assert (tmp_path / "root" / path).is_file(), f"{path} was published, then lost"
    assert tree.checked_files > 2 * kills, "the writer must have published files between the kills"


def store_crash_loop(tmp_path: Path, kills: int, *, sample_new: int | None, check_all_at_end: bool) -> None:
    root = tmp_path / "root"
    tree = TreeChecker(root)
    versions = VersionChecker(root, tmp_path)
    reported: set[int] = set()
    try:
        for n, delay in enumerate(delays(STORE_DELAYS, kills, seed=23)):
            run = start(tmp_path, n, "store", str(tmp_path / f"work-{n}"))
            kill_after(run, delay)
            tree.check()
            ready = [int(line.split()[1]) for line in run.lines() if line.startswith("ready")]
            assert ready and ready[0] >= max(reported, default=0), "a restarted writer resumes at the latest version"
            reported.update(int(line.split()[1]) for line in run.lines() if line.startswith("committed "))
            versions.check(reported, sample_new=sample_new)
        committed = versions.check(reported, everything=check_all_at_end)
        assert committed >= kills // 2, f"only {committed} versions committed across {kills} runs"
        assert any(f.startswith("state/") and f.endswith(".manifest") for f in tree.seen), "no snapshot written"
    finally:
        versions.close()


def test_file_publish_survives_sigkill(tmp_path: Path) -> None:
    files_crash_loop(tmp_path, kills=12)


def test_store_commit_loop_survives_sigkill(tmp_path: Path) -> None:
    store_crash_loop(tmp_path, kills=10, sample_new=2, check_all_at_end=False)


# Exact points inside a publish, before and after each syscall. With --count 4 on a fresh root:
# blob 0 (exclusive, in pieces): fsync 1 and 2 (the new root and blobs/ directories' parents),
#   fsync 3 (data), link 1 (publish), unlink 1 (temp name), fsync 4 (directory);
# blob 1 (exclusive): fsync 5, link 2, unlink 2, fsync 6;
# blob 2 (non-exclusive replace): fsync 7 (shared/ created), fsync 8 (data), replace 1, fsync 9;
# blob 3 (put_file of a complete local file): fdatasync 1 (the source), link 3 (straight to the final
#   name: no temp name), fsync 10 (directory).
ALL_FILE_POINTS = [
    f"{call}:{n}:{when}"
    for call, count in (("fsync", 10), ("fdatasync", 1), ("link", 3), ("unlink", 2), ("replace", 1))
    for n in range(1, count + 1)
    for when in ("before", "after")
]
# The fast run leaves out blob 1, which repeats blob 0 without creating directories.
FILE_POINTS = [p for p in ALL_FILE_POINTS if p.rsplit(":", 1)[0] not in ("fsync:5", "fsync:6", "link:2", "unlink:2")]


def file_points_loop(tmp_path: Path, points: list[str]) -> None:
    """4 blobs (exclusive in pieces, exclusive, replace, put_file), killed at each given point."""
    killed = temp_files = 0
    for n, point in enumerate(points):
        root = tmp_path / f"root-{n}"
        tree = TreeChecker(root)
        run = start(tmp_path, n, "files", "--run", str(n), "--count", "4", "--die-at", point, root=root)
        killed += finish(run)
        if root.exists():
            tree.check()
        temp_files += tree.temp_files_seen
        published = [line.split()[1] for line in run.lines() if line.startswith("published ")]
        for path in published:
            assert (root / path).is_file(), f"{path} was published, then lost ({point})"
    assert killed == len(points), f"only {killed} of {len(points)} kill points were reached"
    assert temp_files > 0, "some kill points must leave a temp file behind"


def test_file_publish_killed_at_each_step(tmp_path: Path) -> None:
    file_points_loop(tmp_path, FILE_POINTS)


# In the store writer each version publishes two changelogs and a commit record (3 links), every
# 4th also a snapshot (SSTs, then its manifest); fsyncs include the local changelog's and the
# directories'. The first points fall in version 1, where the directories are created.
STORE_POINTS_FAST = [
    "link:1:before",
    "link:1:after",
    "link:2:after",
    "link:3:before",
    "link:3:after",
    "link:13:before",
    "link:14:after",
    "fsync:4:before",
    "fsync:6:after",
    "fdatasync:2:before",
    "fdatasync:3:after",
    "unlink:3:before",
]


def store_points_loop(tmp_path: Path, points: list[str], *, check_all_at_end: bool = True) -> None:
    """One checkpoint, resumed after a kill at each point in turn (the counts restart per process)."""
    root = tmp_path / "root"
    tree = TreeChecker(root)
    versions = VersionChecker(root, tmp_path)
    reported: set[int] = set()
    killed = 0
    try:
        for n, point in enumerate(points):
            run = start(tmp_path, n, "store", str(tmp_path / f"work-{n}"), "--count", "5", "--die-at", point)
            killed += finish(run)
            tree.check()
            reported.update(int(line.split()[1]) for line in run.lines() if line.startswith("committed "))
            versions.check(reported)  # every version committed since the previous kill
        if check_all_at_end:
            versions.check(reported, everything=True)
    finally:
        versions.close()
    assert killed >= len(points) * 3 // 4, f"only {killed} of {len(points)} kill points were reached"


def test_store_commit_killed_at_each_step(tmp_path: Path) -> None:
    store_points_loop(tmp_path, STORE_POINTS_FAST)


@pytest.mark.slow
def test_file_publish_killed_at_every_step(tmp_path: Path) -> None:
    file_points_loop(tmp_path, ALL_FILE_POINTS)


@pytest.mark.slow
def test_file_publish_survives_sigkill_many(tmp_path: Path) -> None:
    files_crash_loop(tmp_path, kills=50)


@pytest.mark.slow
def test_store_commit_loop_survives_sigkill_many(tmp_path: Path) -> None:
    store_crash_loop(tmp_path, kills=30, sample_new=None, check_all_at_end=True)


@pytest.mark.slow
def test_store_commit_killed_at_every_step(tmp_path: Path) -> None:
    # Killing after an fsync leaves the same files as killing before the next syscall, so fsyncs
    # are only killed before; links and unlinks both sides (the publish itself and its cleanup).
    points = [
        f"{call}:{n}:{when}"
        for call, count in (("link", 16), ("unlink", 8))
        for n in range(1, count + 1)
        for when in ("before", "after")
    ]
    points += [f"fsync:{n}:before" for n in range(1, 21)]
    store_points_loop(tmp_path, points, check_all_at_end=False)
