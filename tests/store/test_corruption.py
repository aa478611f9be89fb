"""Bad input is refused loudly (DESIGN invariant 7).

Corrupt, truncated, wrong-magic and unknown-format-version changelogs, commit records, snapshot
manifests and SST files each give `CorruptFileError` / `UnsupportedFormatError` naming the file.
The checkpoint location is byte-for-byte unchanged afterwards (every file hashed before and after),
and the same store instance still loads the versions that do not depend on the broken file.

The readers are checked exhaustively (every single-bit flip, every truncation) on in-memory copies;
loads through `StateStore` are checked for a representative set of each kind.
Bad arguments and configuration raise `ConfigurationError` naming the value, and write nothing.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from statekeeper.store import (
    CheckpointError,
    CommitLog,
    ConfigurationError,
    CorruptFileError,
    LineageError,
    MemoryLimits,
    StateStore,
    StoreConfig,
    UnsupportedFormatError,
    open_file_manager,
)
from statekeeper.store.formats.changelog import FOOTER_SIZE, ChangelogReader
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.framing import CRC, FRAME_HEAD
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import StoreId, commit_path, new_checkpoint_id
from statekeeper.store.snapshot import write_snapshot

OP = "agg"
CF2 = "second"
VERSIONS = 5
SNAPSHOT_AT = 2
State = dict[str, dict[bytes, bytes]]


def updates(partition: int, version: int) -> list[tuple[str, bytes, bytes | None]]:
    out: list[tuple[str, bytes, bytes | None]] = []
    for i in range(400):
        k = (i * 7919 + version * 104729 + partition) % 1000
        out.append(("default", b"key%04d" % k, b"p%d v%d i%d " % (partition, version, i) * (1 + i % 9)))
    for i in range(0, 1000, 37 + version):
        out.append(("default", b"key%04d" % i, None))
    out += [(CF2, b"c%02d" % ((version * 3 + j) % 20), b"%d" % version) for j in range(8)]
    return out


@dataclass
class Pristine:
    root: Path
    expected: dict[tuple[int, int], State]  # (partition, version) -> state
    ids: dict[tuple[int, int], str]  # (partition, version) -> committed checkpoint id
    manifest: str  # path of the snapshot manifest of partition 0

    def changelog(self, partition: int, version: int) -> str:
        return StoreId(OP, partition).changelog(version, self.ids[(partition, version)])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    """Two partitions, versions 1..5, a snapshot of partition 0 at version 2; never modified."""
    base = tmp_path_factory.mktemp("pristine")
    root = base / "root"
    stores = [
        StateStore(str(root), OP, p, config=StoreConfig(local_dir=str(base / f"w{p}"), block_bytes=2048))
        for p in range(2)
    ]
    log = CommitLog(stores[0].fm)
    expected: dict[tuple[int, int], State] = {}
    ids: dict[tuple[int, int], str] = {}
    states: list[State] = [{"default": {}, CF2: {}} for _ in range(2)]
    for v in range(1, VERSIONS + 1):
        for p, s in enumerate(stores):
            s.load(v - 1, ids.get((p, v - 1)))
            for cf, k, val in updates(p, v):
                if val is None:
                    s.delete(k, cf)
                    states[p][cf].pop(k, None)
                else:
                    s.put(k, val, cf)
                    states[p][cf][k] = val
            ids[(p, v)] = s.commit().checkpoint_id
            expected[(p, v)] = {cf: dict(kv) for cf, kv in states[p].items()}
        log.commit(v, {OP: [ids[(0, v)], ids[(1, v)]]})
        if v == SNAPSHOT_AT:
            s0 = stores[0]
            write_snapshot(s0.fm, s0.store_id, v, ids[(0, v)], s0.db, s0.local_dir)
    for s in stores:
        s.close()
    manifest = StoreId(OP, 0).manifest(SNAPSHOT_AT, ids[(0, SNAPSHOT_AT)])
    assert (root / manifest).is_file()
    return Pristine(root, expected, ids, manifest)


@pytest.fixture
def ckpt(pristine: Pristine, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "root"
    shutil.copytree(pristine.root, root)
    yield root


def tree_digest(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def state_of(s: StateStore) -> State:
    return {cf: dict(s.items(cf=cf)) for cf in s.column_families()}


# -- byte-level corruptions -------------------------------------------------------------------------


def flip(data: bytes, pos: int, bit: int = 0) -> bytes:
    b = bytearray(data)
    b[pos] ^= 1 << bit
    return bytes(b)


def with_magic(data: bytes, magic: bytes) -> bytes:
    return magic + data[4:]


def with_format_version(data: bytes, version: int) -> bytes:
    """A well-formed frame from the future: only the version differs, the header CRC is recomputed."""
    magic, _v, reserved, length = FRAME_HEAD.unpack_from(data)
    head = FRAME_HEAD.pack(magic, version, reserved, length)
    end = FRAME_HEAD.size + length
    body = data[FRAME_HEAD.size : end]
    return head + body + CRC.pack(zlib.crc32(body, zlib.crc32(head))) + data[end + CRC.size :]


def header_end(data: bytes) -> int:
    return FRAME_HEAD.size + int(FRAME_HEAD.unpack_from(data)[3]) + CRC.size


def read_changelog(data: bytes, name: str) -> int:
    reader = ChangelogReader(io.BytesIO(data), name)
    reader.check_footer()
    return int(sum(len(keys) for _, keys, _ in reader.blocks()))


READERS: dict[str, Callable[[bytes, str], object]] = {
    "changelog": read_changelog,
    "commit": CommitRecord.from_bytes,
    "manifest": SnapshotManifest.from_bytes,
}


def pristine_file(pristine: Pristine, kind: str) -> tuple[str, bytes]:
    path = {"changelog": pristine.changelog(0, 3), "commit": commit_path(3), "manifest": pristine.manifest}[kind]
    return path, (pristine.root / path).read_bytes()


def corruptions(kind: str, data: bytes) -> dict[str, bytes]:
    """Named corruptions of a file: in its header, its body, its end, its identity."""
    h = header_end(data)
    cases = {
        "flip in header magic": flip(data, 1),
        "flip in header length": flip(data, 8, 3),
        "flip in header payload": flip(data, h // 2, 5),
        "flip in header crc": flip(data, h - 2),
        "wrong magic": with_magic(data, b"NOPE"),
        "unknown format version": with_format_version(data, 2),
        "format version 0": with_format_version(data, 0),
        "empty": b"",
        "truncated in header": data[: h // 2],
        "truncated one byte short": data[:-1],
        "trailing garbage": data + b"\x00garbage",
    }
    if kind == "changelog":
        cases |= {
            "flip in first block header": flip(data, h + 3, 1),
            "flip in a block payload": flip(data, (h + len(data)) // 2, 6),
            "flip in footer counts": flip(data, len(data) - FOOTER_SIZE + 2),
            "flip in footer magic": flip(data, len(data) - 2),
            "truncated after header": data[:h],
            "truncated mid block": data[: (h + len(data)) // 2],
            "truncated before footer": data[: len(data) - FOOTER_SIZE],
        }
    else:
        cases |= {"flip in payload crc": flip(data, len(data) - 1, 7)}
    return cases


EXPECTED_ERROR = {
    "unknown format version": UnsupportedFormatError,
    "format version 0": UnsupportedFormatError,
}


# -- reader level: exhaustive -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(READERS))
def test_pristine_files_read(pristine: Pristine, kind: str) -> None:
    name, data = pristine_file(pristine, kind)
    READERS[kind](data, name)


@pytest.mark.parametrize("kind", sorted(READERS))
def test_every_single_bit_flip_is_detected(pristine: Pristine, kind: str) -> None:
    name, data = pristine_file(pristine, kind)
    step = max(1, len(data) // 6000)  # every byte of small files; a dense sample of large ones
    for pos in range(0, len(data), step):
        with pytest.raises((CorruptFileError, UnsupportedFormatError)) as ei:
            READERS[kind](flip(data, pos, pos % 8), name)
        assert name in str(ei.value), (pos, str(ei.value))


@pytest.mark.parametrize("kind", sorted(READERS))
def test_every_truncation_is_detected(pristine: Pristine, kind: str) -> None:
    name, data = pristine_file(pristine, kind)
    step = max(1, len(data) // 6000)
    for size in [*range(0, len(data), step), len(data) - 1]:
        with pytest.raises(CorruptFileError) as ei:
            READERS[kind](data[:size], name)
        assert name in str(ei.value), (size, str(ei.value))


@pytest.mark.parametrize("kind", sorted(READERS))
def test_named_corruptions_are_detected(pristine: Pristine, kind: str) -> None:
    name, data = pristine_file(pristine, kind)
    for case, bad in corruptions(kind, data).items():
        with pytest.raises(CheckpointError) as ei:
            READERS[kind](bad, name)
        assert isinstance(ei.value, EXPECTED_ERROR.get(case, CorruptFileError)), (case, repr(ei.value))
        assert name in str(ei.value) and ei.value.path is not None and name in ei.value.path, case


def test_files_of_another_kind_are_refused(pristine: Pristine) -> None:
    files = {kind: pristine_file(pristine, kind) for kind in READERS}
    for reader_kind, reader in READERS.items():
        for kind, (_, data) in files.items():
            if kind != reader_kind:
                with pytest.raises(CorruptFileError, match="wrong magic"):
                    reader(data, "some/file")


# -- store level: loads refuse, nothing changes, other versions still load ---------------------------

# Which versions of partition 0 depend on the broken file (the others must still load):
# changelog 3 -> 3, 4, 5 replay it; commit record 3 -> 3, 4, 5 check the changelog they replay against it
# (invariant 13: the commit records, not the headers, say which attempt is committed). A broken manifest
# (the snapshot at 2) stops no load: 2..5 replay from version 0 instead (invariant 10).
BROKEN = {"changelog": {3, 4, 5}, "commit": {3, 4, 5}}


def check_load_refused(root: Path, work: Path, pristine: Pristine, kind: str, path: str, case: str) -> None:
    before = tree_digest(root)
    broken = BROKEN[kind]
    expected_error = EXPECTED_ERROR.get(case, CorruptFileError)
    config = StoreConfig(local_dir=str(work))
    with StateStore(str(root), OP, 0, config=config) as s:
        for v in sorted(broken)[:2]:
            with pytest.raises(CheckpointError) as ei:
                s.load(v)
            assert isinstance(ei.value, expected_error), (case, v, repr(ei.value))
            assert path in str(ei.value), (case, v, str(ei.value))
            assert s.version is None  # nothing half-loaded
        good = [v for v in range(1, VERSIONS + 1) if v not in broken]
        for v in good:
            s.load(v)
            assert state_of(s) == pristine.expected[(0, v)], (case, v)
        # partition 1 shares only the commit records
        with StateStore(str(root), OP, 1, config=StoreConfig(local_dir=str(work) + "-p1")) as s1:
            v = VERSIONS if kind != "commit" else 2
            s1.load(v)
            assert state_of(s1) == pristine.expected[(1, v)]
    assert tree_digest(root) == before, f"{case}: the checkpoint location changed"
    assert CommitLog(open_file_manager(str(root))).latest() == VERSIONS


@pytest.mark.parametrize("kind", ["changelog", "commit"])
def test_load_refuses_corrupt_files_and_changes_nothing(
    pristine: Pristine, ckpt: Path, tmp_path: Path, kind: str
) -> None:
    path, data = pristine_file(pristine, kind)
    for i, (case, bad) in enumerate(corruptions(kind, data).items()):
        (ckpt / path).write_bytes(bad)  # the test's corruption, not the store's
        check_load_refused(ckpt, tmp_path / f"work-{i}", pristine, kind, path, case)
    (ckpt / path).write_bytes(data)
    assert tree_digest(ckpt) == tree_digest(pristine.root)


def test_load_repairs_around_a_corrupt_manifest_and_changes_nothing(
    pristine: Pristine, ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, data = pristine_file(pristine, "manifest")
    for i, (case, bad) in enumerate(corruptions("manifest", data).items()):
        (ckpt / path).write_bytes(bad)  # the test's corruption, not the store's
        before = tree_digest(ckpt)
        caplog.clear()
        for v in (SNAPSHOT_AT, VERSIONS):
            with StateStore(str(ckpt), OP, 0, config=StoreConfig(local_dir=str(tmp_path / f"w{i}-{v}"))) as s:
                s.load(v)
                assert state_of(s) == pristine.expected[(0, v)], (case, v)
                assert s.last_load is not None and s.last_load.repaired_snapshots == 1, case
                assert s.last_load.snapshot_version is None and s.last_load.replayed_changelogs == v
        assert any(r.levelname == "WARNING" and path in r.getMessage() for r in caplog.records), case
        assert tree_digest(ckpt) == before, f"{case}: the checkpoint location changed"
    (ckpt / path).write_bytes(data)
    assert tree_digest(ckpt) == tree_digest(pristine.root)


def test_load_refuses_changelog_truncated_at_many_offsets(pristine: Pristine, ckpt: Path, tmp_path: Path) -> None:
    path, data = pristine_file(pristine, "changelog")
    h = header_end(data)
    offsets = sorted({0, 1, 4, 11, 12, h - 1, h, h + 1, h + 40, len(data) // 3, len(data) // 2, len(data) - 20})
    offsets += [len(data) - FOOTER_SIZE, len(data) - FOOTER_SIZE + 1, len(data) - 1]
    for i, size in enumerate(offsets):
        (ckpt / path).write_bytes(data[:size])
        before = tree_digest(ckpt)
        with StateStore(str(ckpt), OP, 0, config=StoreConfig(local_dir=str(tmp_path / f"w{i}"))) as s:
            with pytest.raises(CorruptFileError) as ei:
                s.load(4)  # replays the truncated changelog of version 3 after the snapshot at 2
            assert path in str(ei.value), (size, str(ei.value))
            if i % 5 == 0:
                s.load(2)
                assert state_of(s) == pristine.expected[(0, 2)]
        assert tree_digest(ckpt) == before, f"truncated at {size}: the checkpoint location changed"


@pytest.mark.parametrize("damage", ["bit flip", "truncated", "missing"])
def test_damaged_snapshot_sst_is_repaired_or_refused(
    pristine: Pristine, ckpt: Path, tmp_path: Path, damage: str
) -> None:
    """Repaired by replay from version 0 while the changelogs are there; refused naming the SST once not."""
    manifest = SnapshotManifest.from_bytes((ckpt / pristine.manifest).read_bytes(), pristine.manifest)
    sst = StoreId(OP, 0).sst(manifest.sst_files[0].remote_name)
    data = (ckpt / sst).read_bytes()
    if damage == "bit flip":
        (ckpt / sst).write_bytes(flip(data, len(data) // 2))
    elif damage == "truncated":
        (ckpt / sst).write_bytes(data[:-100])
    else:
        (ckpt / sst).unlink()
    before = tree_digest(ckpt)
    with StateStore(str(ckpt), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        s.load(SNAPSHOT_AT)
        assert state_of(s) == pristine.expected[(0, SNAPSHOT_AT)]
        assert s.last_load is not None and s.last_load.repaired_snapshots == 1
        assert s.last_plan is not None and s.last_plan.skipped[0].path.endswith(sst)
    assert tree_digest(ckpt) == before
    (ckpt / pristine.changelog(0, 1)).unlink()  # no intact path left
    before = tree_digest(ckpt)
    with StateStore(str(ckpt), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w2"))) as s:
        with pytest.raises(CheckpointError) as ei:
            s.load(SNAPSHOT_AT)
        assert sst in str(ei.value) and "no intact" in str(ei.value)
        assert s.version is None
    assert tree_digest(ckpt) == before


def test_changelog_under_another_name_is_refused(pristine: Pristine, ckpt: Path, tmp_path: Path) -> None:
    """A complete, valid changelog whose header names another store or version than its file name."""
    target = pristine.changelog(0, 3)
    (ckpt / target).write_bytes((ckpt / pristine.changelog(1, 3)).read_bytes())  # partition 1's bytes
    before = tree_digest(ckpt)
    with StateStore(str(ckpt), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        with pytest.raises(CorruptFileError, match="header says") as ei:
            s.load(3)
        assert target in str(ei.value)
    assert tree_digest(ckpt) == before


def test_commit_record_of_another_version_is_refused(ckpt: Path, tmp_path: Path) -> None:
    (ckpt / commit_path(3)).write_bytes((ckpt / commit_path(4)).read_bytes())
    before = tree_digest(ckpt)
    with StateStore(str(ckpt), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        with pytest.raises(LineageError, match="claims version 4") as ei:
            s.load(3)
        assert commit_path(3) in str(ei.value)
    assert tree_digest(ckpt) == before


def test_missing_changelog_is_a_clear_error(pristine: Pristine, ckpt: Path, tmp_path: Path) -> None:
    (ckpt / pristine.changelog(0, 4)).unlink()
    with StateStore(str(ckpt), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        with pytest.raises(CheckpointError) as ei:
            s.load(4)
        assert pristine.changelog(0, 4) in str(ei.value)
        with pytest.raises(LineageError, match="not committed"):
            s.load(VERSIONS + 1)
        with pytest.raises(LineageError, match="not the committed one"):
            s.load(3, new_checkpoint_id())
        s.load(3)
        assert state_of(s) == pristine.expected[(0, 3)]


# -- bad arguments and configuration ----------------------------------------------------------------


BAD_OPERATORS = ["a/b", "..", "", ".hidden", "-dash", "x" * 201, "a b", "op\x00"]
BAD_PARTITIONS: list[object] = [-1, 100_000, True, "0", 1.0]
BAD_VERSIONS: list[object] = [-1, -100, True, "1", 1.5, None, 10**20]
BAD_IDS: list[object] = ["", "xyz", "A" * 32, "0" * 31, "0" * 33, "../" + "0" * 29, 123]


def test_bad_operator_names(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for op in BAD_OPERATORS:
        with pytest.raises(ConfigurationError) as ei:
            StateStore(str(root), op, 0, config=StoreConfig(local_dir=str(tmp_path / "w")))
        assert repr(op) in str(ei.value)
        with pytest.raises(ConfigurationError) as ei:
            CommitLog(open_file_manager(str(root))).commit(1, {op: [new_checkpoint_id()]})
        assert repr(op) in str(ei.value)
    assert not root.exists() or tree_digest(root) == {}


def test_bad_partitions(tmp_path: Path) -> None:
    for p in BAD_PARTITIONS:
        with pytest.raises(ConfigurationError) as ei:
            StateStore(str(tmp_path / "root"), OP, p, config=StoreConfig(local_dir=str(tmp_path / "w")))  # type: ignore[arg-type]
        assert repr(p) in str(ei.value)


def test_bad_versions_and_checkpoint_ids(ckpt: Path, tmp_path: Path) -> None:
    before = tree_digest(ckpt)
    log = CommitLog(open_file_manager(str(ckpt)))
    with StateStore(str(ckpt), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
        for v in BAD_VERSIONS:
            with pytest.raises(ConfigurationError) as ei:
                s.load(v)  # type: ignore[arg-type]
            assert repr(v) in str(ei.value)
            with pytest.raises(ConfigurationError) as ei:
                log.commit(v, {OP: [new_checkpoint_id(), new_checkpoint_id()]})  # type: ignore[arg-type]
            assert repr(v) in str(ei.value)
        for ckpt_id in BAD_IDS:
            with pytest.raises(ConfigurationError) as ei:
                s.load(1, ckpt_id)  # type: ignore[arg-type]
            assert repr(ckpt_id) in str(ei.value)
            with pytest.raises(ConfigurationError) as ei:
                log.commit(VERSIONS + 1, {OP: [ckpt_id, new_checkpoint_id()]})  # type: ignore[list-item]
            assert repr(ckpt_id) in str(ei.value)
        s.load(1)  # still usable
    assert tree_digest(ckpt) == before


@pytest.mark.parametrize("uri", ["gs://bucket/prefix", "hdfs://nn/ckpt", "ftp://host/x", "file://remotehost/x"])
def test_unknown_uri_schemes(uri: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as ei:
        StateStore(uri, OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w")))
    named = uri.split("://", maxsplit=1)[0] if "remotehost" not in uri else "remotehost"
    assert named in str(ei.value)


def test_bad_store_and_memory_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="block_bytes=10"):
        StoreConfig(block_bytes=10)
    with pytest.raises(ConfigurationError, match="max_lineage=0"):
        StoreConfig(max_lineage=0)
    with pytest.raises(ConfigurationError, match="read_ahead=-1"):
        StoreConfig(read_ahead=-1)
    with pytest.raises(ConfigurationError, match="total_bytes=1024"):
        MemoryLimits(total_bytes=1024)
    with pytest.raises(ConfigurationError, match=r"write_buffer_fraction=0\.99"):
        MemoryLimits(write_buffer_fraction=0.99)
    monkeypatch.setenv("STATEKEEPER_MEMORY_MB", "lots")
    with pytest.raises(ConfigurationError, match="STATEKEEPER_MEMORY_MB='lots'"):
        MemoryLimits.from_env()


def test_bad_commit_outcomes_write_nothing(ckpt: Path) -> None:
    before = tree_digest(ckpt)
    log = CommitLog(open_file_manager(str(ckpt)))
    with pytest.raises(ConfigurationError, match="no partitions"):
        log.commit(VERSIONS + 1, {OP: []})
    with pytest.raises(ConfigurationError, match="2 partitions"):
        log.commit(VERSIONS + 1, {OP: [new_checkpoint_id()]})
    assert tree_digest(ckpt) == before


def test_frame_header_layout_is_what_the_tests_assume() -> None:
    """Guards the helpers above: magic(4) u16 version, u16 reserved, u32 length."""
    assert FRAME_HEAD.size == 12 and struct.calcsize("<4sHHI") == 12
