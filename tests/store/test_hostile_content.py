"""Checkpoint content is untrusted (DESIGN invariant 12): well-framed, checksum-valid files with hostile
contents, written with the product's own encoders, are refused naming the file, and write nothing outside
the work directory.

Hostile names (`../x`, absolute paths, `a/b`, empty, NUL, overlong) in manifests, commit records and
changelog headers; JSON nested 100k deep; zstd bombs; negative lengths; bad column family names; FIFOs and
symlinks to endless devices named like checkpoint files; values and names the formats cannot hold at `put`.
"""

from __future__ import annotations

import io
import json
import os
import resource
import struct
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.store import faults
from statekeeper.store.commit_log import CommitLog
from statekeeper.store.config import StoreConfig
from statekeeper.store.errors import ConfigurationError, CorruptFileError, StatekeeperError
from statekeeper.store.files import LocalFileManager, open_file_manager
from statekeeper.store.formats import changelog as cl
from statekeeper.store.formats.commit import CommitRecord
from statekeeper.store.formats.framing import encode_frame, json_depth
from statekeeper.store.formats.limits import MAX_JSON_DEPTH, MAX_VALUE_BYTES
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import StoreId, commit_path
from statekeeper.store.snapshot import read_manifest, write_snapshot
from statekeeper.store.state_store import StateStore
from testkit.hostile import tree_contents

OP = "agg"
STORE = StoreId(OP, 0)
VERSIONS = 3
HYPO = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def hostile_names(canary_dir: str) -> st.SearchStrategy[str]:
    """Names that must never become a path: traversals, absolute paths into the canary directory, separators,
    empty, NUL, overlong, and arbitrary text."""
    fixed = [
        "../x",
        "../../outside/evil",
        f"{canary_dir}/evil",
        f"{canary_dir}/canary.txt",
        "/abs/path",
        "a/b",
        "",
        ".",
        "..",
        "\x00",
        "000012.sst\x00",
        "x" * 300,
        "0" * 300 + ".sst",
    ]
    return st.sampled_from(fixed) | st.text(min_size=0, max_size=40).filter(lambda s: "/" in s or s.startswith("."))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A local root with VERSIONS commits of one store and a snapshot of the latest; its state."""
    base = tmp_path_factory.mktemp("hostile")
    root = str(base / "root")
    log = CommitLog(open_file_manager(root))
    with StateStore(root, OP, 0, config=StoreConfig(local_dir=str(base / "w"))) as s:
        for v in range(VERSIONS):
            s.load(v)
            s.put(f"k{v}".encode(), b"v" * 10)
            s.put(b"shared", str(v).encode(), cf="counts")
            r = s.commit()
            log.commit(r.version, {OP: [r.checkpoint_id]})
        s.load(VERSIONS)
        snap = write_snapshot(s.fm, STORE, VERSIONS, s.checkpoint_id or "", s.db, str(base / "w"))
        state = {cf: dict(s.items(cf=cf)) for cf in s.column_families()}
    return {"root": root, "manifest": snap.manifest_path, "state": state}


@pytest.fixture
def site(pristine: dict[str, object], tmp_path: Path) -> Iterator[dict[str, object]]:
    """A copy of the pristine root, a canary directory beside it and a work directory for loads."""
    root = tmp_path / "root"
    src = Path(str(pristine["root"]))
    for p in src.rglob("*"):
        if p.is_file():
            (root / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (root / p.relative_to(src)).write_bytes(p.read_bytes())
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("precious")
    yield {**pristine, "root": str(root), "outside": outside, "work": tmp_path / "work", "tmp": tmp_path}


def plant(root: str, path: str, data: bytes) -> None:
    full = Path(root) / path
    full.unlink(missing_ok=True)
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(data)


def load(site: dict[str, object], version: int, tag: str = "w") -> StateStore:
    work = Path(str(site["work"])) / tag
    s = StateStore(str(site["root"]), OP, 0, config=StoreConfig(local_dir=str(work)))
    try:
        s.load(version)
    except BaseException:
        s.close()
        raise
    return s


class TestHostileManifestNames:
    """A manifest's SST local names and embedded file names become local paths when a snapshot is restored."""

    @given(data=st.data())
    @HYPO
    def test_a_load_never_writes_outside_and_repairs_around_the_snapshot(
        self, site: dict[str, object], data: st.DataObject
    ) -> None:
        outside = Path(str(site["outside"]))
        tmp = Path(str(site["tmp"]))
        bad = data.draw(hostile_names(str(outside)))
        field = data.draw(st.sampled_from(["sst local", "db file", "sst remote"]))
        fm = open_file_manager(str(site["root"]))
        path = str(site["manifest"])
        m = SnapshotManifest.from_bytes(fm.read_bytes(path), path)
        if field == "sst local":
            hostile = replace(m, sst_files=(replace(m.sst_files[0], local_name=bad), *m.sst_files[1:]))
        elif field == "sst remote":
            hostile = replace(m, sst_files=(replace(m.sst_files[0], remote_name=bad), *m.sst_files[1:]))
        else:
            hostile = replace(m, db_files={**m.db_files, bad: b"evil"})
        plant(str(site["root"]), path, hostile.to_bytes())
        before = tree_contents(tmp, (Path(str(site["work"])),))
        with pytest.raises(CorruptFileError) as ei:
            SnapshotManifest.from_bytes(fm.read_bytes(path), path)
        assert path in str(ei.value) and "field" in str(ei.value)
        with load(site, VERSIONS, f"w{data.draw(st.integers(0, 10**9))}") as s:  # repaired from the changelogs
            assert {cf: dict(s.items(cf=cf)) for cf in s.column_families()} == site["state"]
            assert s.last_load is not None and s.last_load.repaired_snapshots == 1
        assert tree_contents(tmp, (Path(str(site["work"])),)) == before, "a file changed outside the work dir"
        assert (outside / "canary.txt").read_text() == "precious"
        plant(str(site["root"]), path, m.to_bytes())

    @given(data=st.data())
    @HYPO
    def test_a_manifest_naming_another_snapshot_is_never_restored(
        self, site: dict[str, object], data: st.DataObject
    ) -> None:
        """Every checksum right, only the identity it claims differs from its name (another operator, partition,
        version or attempt): the load repairs around it from the changelogs, exactly, naming nothing outside."""
        fm = open_file_manager(str(site["root"]))
        path = str(site["manifest"])
        m = SnapshotManifest.from_bytes(fm.read_bytes(path), path)
        field = data.draw(st.sampled_from(["operator", "partition", "version", "checkpoint_id"]))
        other: st.SearchStrategy[Any] = {
            "operator": st.sampled_from(["agg2", "Agg", "x"]),
            "partition": st.integers(1, 10_000),
            "version": st.integers(0, 2**40).filter(lambda v: v != m.version),
            "checkpoint_id": st.text("0123456789abcdef", min_size=32, max_size=32).filter(
                lambda c: c != m.checkpoint_id
            ),
        }[field]
        claimed: dict[str, Any] = {field: data.draw(other)}
        plant(str(site["root"]), path, replace(m, **claimed).to_bytes())
        try:
            with pytest.raises(CorruptFileError, match="its name says") as ei:
                read_manifest(fm, StoreId(OP, 0), m.version, m.checkpoint_id)
            assert path in str(ei.value)
            with load(site, VERSIONS, f"i{data.draw(st.integers(0, 10**9))}") as s:
                assert {cf: dict(s.items(cf=cf)) for cf in s.column_families()} == site["state"]
                assert s.last_load is not None and s.last_load.repaired_snapshots == 1
        finally:
            plant(str(site["root"]), path, m.to_bytes())

    def test_two_files_under_one_local_name_are_refused(self, site: dict[str, object]) -> None:
        fm = open_file_manager(str(site["root"]))
        path = str(site["manifest"])
        m = SnapshotManifest.from_bytes(fm.read_bytes(path), path)
        twice = replace(m, sst_files=(*m.sst_files, m.sst_files[0]))
        plant(str(site["root"]), path, twice.to_bytes())
        with pytest.raises(CorruptFileError, match="share a local name"):
            SnapshotManifest.from_bytes(fm.read_bytes(path), path)


class TestHostileIdsAndOperators:
    """Checkpoint ids and operator names in commit records and changelog headers build file names."""

    @given(bad=hostile_names("/tmp/outside"), where=st.sampled_from(["id", "operator"]))
    @HYPO
    def test_commit_record(self, site: dict[str, object], bad: str, where: str) -> None:
        fm = open_file_manager(str(site["root"]))
        path = commit_path(VERSIONS)
        rec = CommitRecord.from_bytes(fm.read_bytes(path), path)
        ids: dict[str, tuple[str, ...]] = {OP: (bad,)} if where == "id" else {bad: rec.checkpoint_ids[OP]}
        payload = replace(rec, checkpoint_ids=ids, layouts={}).to_bytes()
        with pytest.raises(CorruptFileError) as ei:
            CommitRecord.from_bytes(payload, "file:///x/" + path)
        assert path in str(ei.value) and "'operators'" in str(ei.value)

    @given(bad=hostile_names("/tmp/outside"), where=st.sampled_from(["lineage", "checkpoint_id", "operator"]))
    @HYPO
    def test_changelog_header(self, bad: str, where: str) -> None:
        good = "a" * 32
        header = cl.ChangelogHeader(
            bad if where == "operator" else OP,
            0,
            3,
            bad if where == "checkpoint_id" else good,
            ((2, bad if where == "lineage" else good),),
        )
        data = encode_frame(cl.MAGIC, cl.FORMAT_VERSION, header.to_payload())
        with pytest.raises(CorruptFileError) as ei:
            cl.read_header(io.BytesIO(data), "the/changelog")
        assert "the/changelog" in str(ei.value) and where in str(ei.value)

    def test_a_load_of_a_hostile_lineage_fails_naming_the_changelog(self, site: dict[str, object]) -> None:
        fm = open_file_manager(str(site["root"]))
        path = next(i.path for i in fm.list(STORE.changelog_dir()) if i.path.split("/")[-1].startswith("0" * 19 + "3"))
        with open(Path(str(site["root"])) / path, "rb") as f:
            header = cl.read_header(f, path)
            rest = f.read()
        hostile = replace(header, lineage=((2, "../../../../outside/evil"),))
        plant(str(site["root"]), path, encode_frame(cl.MAGIC, cl.FORMAT_VERSION, hostile.to_payload()) + rest)
        Path(str(site["root"]), str(site["manifest"])).unlink()  # no snapshot: the load reads the lineage
        with pytest.raises(CorruptFileError) as ei:
            load(site, VERSIONS).close()
        assert path in str(ei.value)


def deep(n: int) -> object:
    value: object = 1
    for _ in range(n):
        value = [value]
    return value


class TestNesting:
    """JSON nested 100k deep raised RecursionError out of every reader."""

    @pytest.mark.parametrize("kind", ["commit", "manifest", "changelog"])
    def test_deep_json_is_corruption_naming_the_file(self, site: dict[str, object], kind: str) -> None:
        body = b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        magic = {"commit": b"SKCR", "manifest": b"SKSM", "changelog": b"SKCL"}[kind]
        head = struct.pack("<4sHHI", magic, 1, 0, len(body))
        data = head + body + struct.pack("<I", zlib.crc32(body, zlib.crc32(head)))
        with pytest.raises(CorruptFileError, match=r"nests .* deep.*the/file"):
            if kind == "commit":
                CommitRecord.from_bytes(data, "the/file")
            elif kind == "manifest":
                SnapshotManifest.from_bytes(data, "the/file")
            else:
                cl.read_header(io.BytesIO(data), "the/file")

    def test_a_deep_commit_record_fails_the_load_naming_it(self, site: dict[str, object]) -> None:
        body = b'{"version":3,"operators":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
        head = struct.pack("<4sHHI", b"SKCR", 1, 0, len(body))
        plant(
            str(site["root"]),
            commit_path(VERSIONS),
            head + body + struct.pack("<I", zlib.crc32(body, zlib.crc32(head))),
        )
        with pytest.raises(CorruptFileError) as ei:
            load(site, VERSIONS).close()
        assert commit_path(VERSIONS) in str(ei.value)

    @given(
        value=st.recursive(
            st.none() | st.text(alphabet='[]{}"\\ab', max_size=5),
            lambda c: st.lists(c) | st.dictionaries(st.text(alphabet='[]{}"\\', max_size=3), c),
            max_leaves=30,
        )
    )
    @HYPO
    def test_depth_is_counted_exactly(self, value: object) -> None:
        def true_depth(v: object) -> int:
            if isinstance(v, list):
                return 1 + max(map(true_depth, v), default=0)
            if isinstance(v, dict):
                return 1 + max(map(true_depth, v.values()), default=0)
            return 0

        assert min(json_depth(json.dumps(value).encode()), MAX_JSON_DEPTH + 1) == min(
            true_depth(value), MAX_JSON_DEPTH + 1
        )


class TestTimes:
    """A `created_at` no clock holds (an int past a float's range raised OverflowError out of the manifest and header
    readers): the load repairs around such a manifest and names such a changelog (the readers: test_hostile_caps)."""

    def test_a_load_repairs_around_a_manifest_and_names_a_changelog_holding_one(self, site: dict[str, object]) -> None:
        root = Path(str(site["root"]))
        manifest = str(site["manifest"])
        data = (root / manifest).read_bytes()
        plant(str(root), manifest, encode_frame(data[:4], 1, {**json.loads(data[12:-4]), "created_at": 10**309}))
        with load(site, VERSIONS) as s:
            assert {cf: dict(s.items(cf=cf)) for cf in s.column_families()} == site["state"]
            assert s.last_load is not None and s.last_load.repaired_snapshots == 1
        (root / manifest).unlink()
        fm = open_file_manager(str(root))
        path = next(i.path for i in fm.list(STORE.changelog_dir()) if i.path.split("/")[-1].startswith("0" * 19 + "3"))
        with open(root / path, "rb") as f:
            header = cl.read_header(f, path)
            rest = f.read()
        payload = {**header.to_payload(), "created_at": 10**309}
        plant(str(root), path, encode_frame(cl.MAGIC, cl.FORMAT_VERSION, payload) + rest)
        with pytest.raises(CorruptFileError, match="'created_at'") as ei:
            load(site, VERSIONS, "w2").close()
        assert path in str(ei.value)


def changelog_with_block(head_extra: bytes, cf: bytes = b"default") -> bytes:
    """A changelog whose one block is `head_extra` after the kind and cf name (CRC supplied by the caller)."""
    header = cl.ChangelogHeader(OP, 0, 1, "a" * 32, ())
    frame = encode_frame(cl.MAGIC, cl.FORMAT_VERSION, header.to_payload())
    body = struct.pack("<IQ", 1, 1)
    footer = struct.pack("<BIQI4s", cl.BLOCK_END, 1, 1, zlib.crc32(body), cl.END_MAGIC)
    return frame + bytes((cl.BLOCK_DATA, len(cf))) + cf + head_extra + footer


def record_block(
    payload_raw: bytes, n: int, compressed: bytes, cf: bytes = b"default", raw_len: int | None = None
) -> bytes:
    raw_len = len(payload_raw) if raw_len is None else raw_len
    head = bytes((cl.BLOCK_DATA, len(cf))) + cf + struct.pack("<III", n, raw_len, len(compressed))
    crc = zlib.crc32(compressed, zlib.crc32(head))
    return struct.pack("<III", n, raw_len, len(compressed)) + struct.pack("<I", crc) + compressed


def read_all(data: bytes, name: str = "the/changelog") -> None:
    reader = cl.ChangelogReader(io.BytesIO(data), name)
    reader.check_footer()
    for _ in reader.entries(None):
        pass


class TestBlocks:
    """Framed, checksum-valid record blocks whose fields lie."""

    def test_a_zstd_bomb_is_refused_before_it_expands(self) -> None:
        stream = zstandard.ZstdCompressor(level=3).compressobj(size=1 << 30)  # built without holding 1 GiB
        zeros = bytes(1 << 20)
        # a few dozen KB claiming 1 GiB
        bomb = b"".join([*(stream.compress(zeros) for _ in range(1024)), stream.flush()])
        assert len(bomb) < 1 << 20
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for raw_len in (1 << 30, 100):  # the block head claims the frame's size, or a small one
            data = changelog_with_block(record_block(b"", 1, bomb, raw_len=raw_len))
            with pytest.raises(CorruptFileError, match="the/changelog"):
                read_all(data)
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200 << 10  # KiB: no GiB allocated

    @given(vlen=st.integers(min_value=-(2**31), max_value=-2))
    @HYPO
    def test_a_negative_length_other_than_minus_one_is_corruption_not_a_delete(self, vlen: int) -> None:
        raw = struct.pack("<Ii", 1, vlen) + b"k"
        data = changelog_with_block(record_block(raw, 1, zstandard.ZstdCompressor().compress(raw)))
        with pytest.raises(CorruptFileError, match="value length"):
            read_all(data)

    @pytest.mark.parametrize("cf", [b"\xff\xfe", b"", b"a\x00b"])
    def test_a_bad_column_family_name_is_corruption_naming_the_file(self, cf: bytes) -> None:
        raw = struct.pack("<Ii", 1, -1) + b"k"
        data = changelog_with_block(record_block(raw, 1, zstandard.ZstdCompressor().compress(raw), cf=cf), cf=cf)
        with pytest.raises(CorruptFileError, match=r"column family.*the/changelog"):
            read_all(data)


def special_files(kind: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
    else:
        os.symlink(f"/dev/{kind}", target)


@pytest.mark.timeout(60)
class TestSpecialFiles:
    """A FIFO or a symlink to an endless device named like a commit record or a changelog hung readers."""

    @pytest.mark.parametrize("kind", ["fifo", "zero", "urandom"])
    @pytest.mark.parametrize("what", ["commit", "changelog", "manifest"])
    def test_every_read_refuses_quickly(self, site: dict[str, object], kind: str, what: str) -> None:
        root = str(site["root"])
        fm = open_file_manager(root)
        path = {
            "commit": commit_path(VERSIONS),
            "manifest": str(site["manifest"]),
            "changelog": next(i.path for i in fm.list(STORE.changelog_dir())),
        }[what]
        special_files(kind, Path(root) / path)
        if what == "changelog":  # no snapshot: the load replays it
            Path(root, str(site["manifest"])).unlink()
        for read in (fm.read_bytes, fm.open, lambda p: fm.download(p, str(Path(str(site["tmp"])) / "copy"))):
            with pytest.raises(CorruptFileError, match="not a regular file"):
                read(path)
        assert path not in [i.path for i in fm.list("")], "a listing skips it"
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            s = load(site, VERSIONS)
        except StatekeeperError as e:
            assert what != "manifest" and path in str(e)
        else:
            assert what == "manifest"  # a listing skips it: the load replays the changelogs instead
            assert {cf: dict(s.items(cf=cf)) for cf in s.column_families()} == site["state"]
            s.close()
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200 << 10

    def test_a_symlinked_directory_out_of_the_root_is_refused(self, site: dict[str, object]) -> None:
        root = Path(str(site["root"]))
        outside = Path(str(site["outside"]))
        (outside / "commits").mkdir()
        (outside / "commits" / commit_path(1).split("/")[1]).write_bytes((root / commit_path(1)).read_bytes())
        os.rename(root / "commits", root / "commits-gone")
        os.symlink(outside / "commits", root / "commits")
        with pytest.raises(CorruptFileError, match="out of the checkpoint root"):
            open_file_manager(str(root)).read_bytes(commit_path(1))

    def test_nothing_is_written_or_deleted_through_a_directory_symlinked_out_of_the_root(self, tmp_path: Path) -> None:
        """A directory of the root replaced by a symlink out of it: a commit writes nothing there and a deletion
        (maintenance's) removes nothing there, each naming the file."""
        root, outside = tmp_path / "root", tmp_path / "outside"
        with StateStore(str(root), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
            s.load(0)
            s.put(b"k", b"v")
            s.commit()
        changelogs = root / StoreId(OP, 0).changelog(1, "0" * 32).rsplit("/", 1)[0]
        outside.mkdir()
        for f in changelogs.iterdir():
            f.rename(outside / f.name)
        changelogs.rmdir()
        changelogs.symlink_to(outside)
        before = tree_contents(outside, ())
        fm = open_file_manager(str(root))
        with StateStore(fm, OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w2"))) as s:
            s.load(0)  # version 0: nothing read through the link
            s.put(b"k", b"w")
            with pytest.raises(CorruptFileError, match="out of the checkpoint root: not written"):
                s.commit()
        victim = f"{changelogs.relative_to(root)}/{next(iter(before)).rsplit('/', 1)[1]}"
        result = fm.delete_many([victim])
        assert result.deleted == [] and "out of the checkpoint root" in result.errors[victim]
        assert tree_contents(outside, ()) == before, "a file outside the root was written or deleted"

    @pytest.mark.parametrize("step", ["publish", "delete"])
    def test_a_directory_swapped_for_a_symlink_mid_operation_is_not_followed(self, tmp_path: Path, step: str) -> None:
        """The directory of a file being published (or deleted) is renamed away and replaced by a symlink out of
        the root after the manager opened it: the publish lands in (the deletion removes from) the directory it
        opened, never the link's target (no check-then-use race: DESIGN invariant 12)."""
        root, outside = tmp_path / "root", tmp_path / "outside"
        blobs = root / "blobs"
        outside.mkdir()
        (outside / "b1").write_bytes(b"someone else's")
        (outside / "b2").write_bytes(b"someone else's")
        fm = open_file_manager(str(root))
        for name in ("b1", "b2"):
            with fm.create(f"blobs/{name}") as out:
                out.write(b"ours")
        before = tree_contents(outside, ())

        def swap(point: str, subject: str) -> None:
            if point == f"local.{step}" and subject.endswith("b2") and not blobs.is_symlink():
                blobs.rename(root / "moved")
                blobs.symlink_to(outside)

        previous = faults.arm(swap)
        try:
            if step == "publish":
                with fm.create("blobs/b2", exclusive=False) as out:
                    out.write(b"new")
                assert (root / "moved" / "b2").read_bytes() == b"new"
            else:
                result = fm.delete_many(["blobs/b1", "blobs/b2"])
                assert result.deleted == ["blobs/b1", "blobs/b2"] and not (root / "moved" / "b2").exists()
        finally:
            faults.arm(previous)
        assert tree_contents(outside, ()) == before, "a file outside the root was written or deleted"
        with pytest.raises(CorruptFileError, match="out of the checkpoint root"):
            fm.read_bytes("blobs/b1")

    def test_a_listing_does_not_follow_a_directory_swapped_for_a_symlink(self, tmp_path: Path) -> None:
        """A directory of the root replaced by a symlink out of it while a listing walks the root (after its parent
        was read): nothing under the link is listed, and a listing of a prefix through a symlink is empty, each
        naming the link as a special entry."""
        root, outside = tmp_path / "root", tmp_path / "outside"
        outside.mkdir()
        (outside / "evil").write_bytes(b"someone else's")
        fm = LocalFileManager(str(root))
        for name in ("a/1", "b/2"):
            with fm.create(name) as out:
                out.write(b"ours")
        walk = fm.list("")
        assert next(walk).path == "a/1"
        (root / "b").rename(root / "moved")
        (root / "b").symlink_to(outside)
        assert [f.path for f in walk] == []
        specials: list[str] = []
        assert fm.list_with_temp_files("b/", specials) == ([], []) and specials == ["b"]
        assert [f.path for f in fm.list("")] == ["a/1", "moved/2"]

    @HYPO
    @given(
        depth=st.integers(min_value=1, max_value=3),
        op=st.sampled_from(["local.write", "local.publish", "local.put_file", "local.delete", "listing"]),
        data=st.data(),
    )
    def test_no_operation_follows_a_directory_swapped_at_any_level_and_step(
        self, depth: int, op: str, data: st.DataObject
    ) -> None:
        """Generated: a file `depth` directories down; one of its directories (drawn) is replaced by a symlink out
        of the root at a step of a write, publish, upload, deletion or listing (drawn). Nothing outside changes,
        nothing outside is listed, and the operation either acted in the directory it opened (renamed inside the
        root) or failed naming the file out of the root."""
        level = data.draw(st.integers(min_value=0, max_value=depth - 1), label="level")
        dirs = [f"d{i}" for i in range(depth)]
        path = "/".join([*dirs, "f"])
        with tempfile.TemporaryDirectory() as tmp:
            root, target = Path(tmp) / "root", Path(tmp) / "outside"
            fm = LocalFileManager(str(root))
            for name in [*("/".join([*dirs[: d + 1], f"f{d}"]) for d in range(depth)), path]:
                with fm.create(name) as out:
                    out.write(b"ours")
            below = dirs[level + 1 :]  # the swapped directory's subtree, mirrored outside under other names
            for d in range(len(below)):
                target.joinpath(*below[: d + 1]).mkdir(parents=True)
                target.joinpath(*below[: d + 1], f"g{d}").write_bytes(b"theirs")
            target.mkdir(exist_ok=True)
            target.joinpath(*below, "g").write_bytes(b"theirs")
            before = tree_contents(target, ())
            swapped = root.joinpath(*dirs[: level + 1])
            renamed = root.joinpath(*dirs[:level], "moved")
            (Path(tmp) / "upload").write_bytes(b"new")

            def swap() -> None:
                if not swapped.is_symlink():
                    swapped.rename(renamed)
                    swapped.symlink_to(target)

            listed: list[str] = []
            done = False
            previous = faults.arm(lambda point, subject: swap() if point == op and subject.endswith(path) else None)
            try:
                if op == "listing":
                    after = data.draw(st.integers(min_value=0, max_value=depth), label="swap after")
                    for n, info in enumerate(fm.list("")):
                        listed.append(info.path)
                        if n == after:
                            swap()
                elif op == "local.delete":
                    result = fm.delete_many([path])
                    done = result.deleted == [path]
                    assert done or "out of the checkpoint root" in result.errors[path]
                elif op == "local.put_file":
                    fm.put_file(str(Path(tmp) / "upload"), path, exclusive=False)
                    done = True
                else:
                    with fm.create(path, exclusive=False) as out:
                        out.write(b"new")
                    done = True
            except CorruptFileError as e:
                assert "out of the checkpoint root" in str(e) and path in str(e)
            finally:
                faults.arm(previous)
            assert tree_contents(target, ()) == before, "a file outside the root was written or deleted"
            assert not [p for p in listed if p.rsplit("/", 1)[-1].startswith("g")], f"listed outside: {listed}"
            assert swapped.is_symlink() or op == "listing", "the drawn step was not reached"
            moved_file = renamed.joinpath(*below, "f")
            if done and op == "local.delete":
                assert not moved_file.exists()
            elif done:
                assert moved_file.read_bytes() == b"new"


class TestApiLimits:
    """Values and names the formats cannot hold are refused at the API, naming them."""

    def test_an_oversized_value_is_refused_at_put_naming_the_key(self, tmp_path: Path) -> None:
        with StateStore(str(tmp_path / "root"), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
            s.load(0)
            big = b"\x00" * (MAX_VALUE_BYTES + 1)
            with pytest.raises(ConfigurationError, match="b'the-key'"):
                s.put(b"the-key", big)
            with pytest.raises(ConfigurationError, match="b'other'"):
                s.put_batch([b"ok", b"other"], [b"1", big])
            del big
            s.put(b"fine", b"1")
            assert s.commit().version == 1

    @pytest.mark.parametrize("name", ["", "a\x00b", "\udcff", "x" * 256])
    def test_a_column_family_name_a_changelog_cannot_hold_is_refused(self, tmp_path: Path, name: str) -> None:
        with StateStore(str(tmp_path / "root"), OP, 0, config=StoreConfig(local_dir=str(tmp_path / "w"))) as s:
            s.load(0)
            with pytest.raises(ConfigurationError, match="column family name"):
                s.put(b"k", b"v", cf=name)
