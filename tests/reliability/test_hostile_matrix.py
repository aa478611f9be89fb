"""Checkpoint content is untrusted (DESIGN invariant 12), as a matrix: each hostile class (`testkit.hostile`)
planted in the first of two stores of a root, on local disk and on S3 (moto), then every reader run on it in
turn (load, inspect, verify, verify --rebuild, catalog sync, clean-orphans, expire, snapshot), with a canary
directory beside the root. Each cell's outcome must be `EXPECTED`'s (refused or reported naming the file, or
repaired), and after every reader: nothing written outside the root and its work directory, the canary intact,
the reader done within a minute, RSS and temp disk bounded; at the end every retained version of the other
store, and every retained version of the bad one the file is not part of, loads exactly (nothing needed deleted).

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
import time
import uuid
from pathlib import Path

import pytest

from statekeeper.maintenance.build_processes import close_build_processes
from statekeeper.maintenance.cli import main
from statekeeper.maintenance.inventory import Inventory, clear_caches
from statekeeper.maintenance.replica_pool import close_replicas
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.store import StateStore, StoreConfig
from statekeeper.store.errors import StatekeeperError
from statekeeper.store.files import LocalFileManager
from statekeeper.store.files.s3 import download
from statekeeper.store.formats import changelog as cl
from statekeeper.store.formats import snapshot as snap
from statekeeper.store.formats.framing import decode_whole_frame, encode_frame
from statekeeper.store.formats.snapshot import SnapshotManifest
from testkit.hostile import CLASSES, EXPECTED, READERS, framed, reframed_changelog, tree_contents
from tests.maintenance.helpers import History, clobber, small_settings, snapshotted_history

RESULT_ENV = "STATEKEEPER_HOSTILE_RESULT"
S3_DEFAULT = ("special or oversized file",)
"""The classes whose S3 variant runs by default (the rest under `slow`)."""
SMALL_CAP = 64 * 1024
RSS_BOUND_MIB = 512
TEMP_BOUND_BYTES = 64 << 20
COMMAND_SECONDS = 60.0


def _cases() -> list[object]:
    out: list[object] = []
    for backend in ("local", "s3"):
        for cls in CLASSES:
            slow = backend == "s3" and cls not in S3_DEFAULT
            out.append(pytest.param(backend, cls, id=f"{backend}-{cls}", marks=[pytest.mark.slow] if slow else []))
    return out


def _size(top: Path) -> int:
    return sum(p.stat().st_size for p in top.rglob("*") if p.is_file() and not p.is_symlink()) if top.exists() else 0


def _newest(h: History, kind: str) -> str:
    files = Inventory.scan(h.fm, use_cache=False).files_of(h.stores[0])
    entries = files.manifests if kind == "manifest" else files.changelogs
    return entries[max(entries)].path


def plant(h: History, cls: str, outside: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make one file of the first store hostile (class `cls`); returns its path under the root."""
    if cls in ("lineage", "malformed frame"):
        path = _newest(h, "changelog")
        data = h.fm.read_bytes(path)
        if cls == "malformed frame":
            deep = b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            clobber(h.root, path, framed(deep, cl.MAGIC, cl.FORMAT_VERSION))
        else:
            store = h.stores[0]
            version = h.latest
            cid = h.committed[version][store][0]
            header = cl.ChangelogHeader(store.operator, store.partition, version, cid, ((version - 1, "f" * 32),))
            clobber(h.root, path, reframed_changelog(header, data))
        return path
    path = _newest(h, "manifest")
    m = SnapshotManifest.from_bytes(h.fm.read_bytes(path), path)
    if cls == "path names":
        first = dataclasses.replace(m.sst_files[0], local_name=f"{outside}/evil.sst")
        hostile = dataclasses.replace(
            m, sst_files=(first, *m.sst_files[1:]), db_files={**m.db_files, "../../../evil": b"x"}
        )
        clobber(h.root, path, hostile.to_bytes())
    elif cls == "unopenable snapshot":
        clobber(
            h.root, path, dataclasses.replace(m, db_files={**m.db_files, "CURRENT": b"MANIFEST-999999\n"}).to_bytes()
        )
    elif isinstance(h.fm, LocalFileManager):
        clobber(h.root, path, None)
        os.mkfifo(Path(h.fm.root_path) / path)
    else:
        monkeypatch.setattr(download, "MAX_WHOLE_FILE", SMALL_CAP)
        payload = decode_whole_frame(m.to_bytes(), snap.MAGIC, snap.FORMAT_VERSION, path)
        padded = encode_frame(snap.MAGIC, snap.FORMAT_VERSION, {**payload, "padding": "x" * SMALL_CAP})
        assert SnapshotManifest.from_bytes(padded, path) == m, "a valid manifest but for its size"
        clobber(h.root, path, padded)
    return path


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
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("precious")
    path = plant(h, cls, outside, monkeypatch)
    work = tmp_path / "work"
    skip = (tmp_path / "ckpt", work, tmp_path / "home")
    before = tree_contents(tmp_path, skip)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    caplog.set_level(logging.WARNING)
    seen: dict[str, str] = {}
    for reader in READERS:
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
        assert time.monotonic() - t0 < COMMAND_SECONDS, f"{reader} took too long"
        assert tree_contents(tmp_path, skip) == before, f"{reader}: a file changed outside the root and work directory"
        assert (outside / "canary.txt").read_text() == "precious"
        assert _size(work) < TEMP_BOUND_BYTES, f"{reader}: {_size(work)} bytes of temp disk"
    rss_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert rss_mib < RSS_BOUND_MIB, f"peak RSS grew {rss_mib:.0f} MiB"
    assert not (outside / "evil.sst").exists()
    _record(backend, cls, seen)
    h.check_loadable(h.retained(settings), h.stores[1:])
    hit = {h.latest} if cls in ("lineage", "malformed frame") else set()  # the versions the bad file is part of
    h.check_loadable([v for v in h.retained(settings) if v not in hit], h.stores[:1])  # nothing needed deleted
    assert seen == EXPECTED[backend][cls], seen


def _record(backend: str, cls: str, seen: dict[str, str]) -> None:
    out = os.environ.get(RESULT_ENV)
    if not out:
        return
    data = json.loads(Path(out).read_text()) if os.path.exists(out) else {}
    data.setdefault(backend, {})[cls] = seen
    Path(out).write_text(json.dumps(data, indent=1, sort_keys=True))
