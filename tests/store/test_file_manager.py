"""The checkpoint file manager contract (DESIGN invariants 1 and 2), on every backend.

Written against the `CheckpointFileManager` protocol only, through the `file_manager` /
`checkpoint_root` fixtures, so the same tests run on local disk and on S3.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.store import (
    CheckpointError,
    CheckpointFileExistsError,
    CheckpointFileManager,
    CheckpointFileNotFoundError,
    CommitLog,
    ConfigurationError,
    LineageError,
    open_file_manager,
)
from statekeeper.store.files import LocalFileManager
from statekeeper.store.files.paths import validate_component, validate_relative_path
from statekeeper.store.layout import commit_path, new_checkpoint_id


def leftover_temp_files(fm: CheckpointFileManager) -> list[str]:
    """Unpublished leftovers, where the backend can show them (local temp files)."""
    lister = getattr(fm, "list_temp_files", None)
    return [] if lister is None else [i.path for i in lister()]


def paths(fm: CheckpointFileManager, prefix: str = "", start_after: str | None = None) -> list[str]:
    return [i.path for i in fm.list(prefix, start_after=start_after)]


def payload(n: int, seed: int = 0) -> bytes:
    """n deterministic, incompressible-looking bytes."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(b"%d:%d" % (seed, counter)).digest()
        counter += 1
    return bytes(out[:n])


# -- atomic create ----------------------------------------------------------------------------------


def test_create_publishes_on_close_only(file_manager: CheckpointFileManager) -> None:
    data = payload(3 << 20, seed=1)
    out = file_manager.create("dir/sub/file.bin")
    for i in range(0, len(data), 100_000):  # many writes
        assert out.write(data[i : i + 100_000]) == len(data[i : i + 100_000])
        assert not file_manager.exists("dir/sub/file.bin")
    assert paths(file_manager) == []
    out.close()
    assert file_manager.exists("dir/sub/file.bin")
    assert file_manager.read_bytes("dir/sub/file.bin") == data
    assert file_manager.info("dir/sub/file.bin").size == len(data)
    assert leftover_temp_files(file_manager) == []
    out.close()  # closing twice is harmless
    assert file_manager.read_bytes("dir/sub/file.bin") == data


def test_context_manager_publishes(file_manager: CheckpointFileManager) -> None:
    with file_manager.create("a.bin") as out:
        out.write(b"hello ")
        out.write(memoryview(b"world"))
        out.write(bytearray(b"!"))
    assert file_manager.read_bytes("a.bin") == b"hello world!"


def test_empty_file(file_manager: CheckpointFileManager) -> None:
    with file_manager.create("empty"):
        pass
    assert file_manager.read_bytes("empty") == b""
    assert file_manager.info("empty").size == 0


def test_cancel_discards(file_manager: CheckpointFileManager) -> None:
    out = file_manager.create("x/cancelled.bin")
    out.write(payload(1 << 20))
    out.cancel()
    assert not file_manager.exists("x/cancelled.bin")
    assert paths(file_manager) == []
    assert leftover_temp_files(file_manager) == []
    with pytest.raises(CheckpointError):
        out.write(b"more")
    out.cancel()  # idempotent
    with contextlib.suppress(CheckpointError):
        out.close()  # after cancel: nothing to publish (a backend may also refuse loudly)
    assert not file_manager.exists("x/cancelled.bin")


def test_exception_in_block_leaves_nothing(file_manager: CheckpointFileManager) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), file_manager.create("x/failed.bin") as out:
        out.write(payload(2 << 20))
        raise Boom
    assert not file_manager.exists("x/failed.bin")
    assert paths(file_manager) == []
    assert leftover_temp_files(file_manager) == []


def test_exclusive_create_refuses_existing_name(file_manager: CheckpointFileManager) -> None:
    original = payload(10_000, seed=2)
    with file_manager.create("c/taken") as out:
        out.write(original)
    with pytest.raises(CheckpointFileExistsError) as ei, file_manager.create("c/taken") as out:
        out.write(b"different content")
    assert "c/taken" in str(ei.value)
    assert isinstance(ei.value, FileExistsError)
    assert file_manager.read_bytes("c/taken") == original
    assert paths(file_manager) == ["c/taken"]
    assert leftover_temp_files(file_manager) == []


def test_exclusive_race_first_publisher_wins(file_manager: CheckpointFileManager) -> None:
    """Two writers of one name (a retried task and its zombie): exactly one publishes, intact."""
    first, second = file_manager.create("race"), file_manager.create("race")
    first.write(b"A" * 5000)
    second.write(b"B" * 7000)
    first.close()
    with pytest.raises(CheckpointFileExistsError):
        second.close()
    assert file_manager.read_bytes("race") == b"A" * 5000
    assert leftover_temp_files(file_manager) == []


def test_non_exclusive_create_replaces_content_addressed_name(file_manager: CheckpointFileManager) -> None:
    for _ in range(2):
        with file_manager.create("sst/abc.sst", exclusive=False) as out:
            out.write(b"same bytes")
    assert file_manager.read_bytes("sst/abc.sst") == b"same bytes"
    assert paths(file_manager) == ["sst/abc.sst"]


def test_put_file(file_manager: CheckpointFileManager, tmp_path: Path) -> None:
    src = tmp_path / "local.bin"
    data = payload(2_500_000, seed=3)
    src.write_bytes(data)
    assert file_manager.put_file(str(src), "up/loaded.bin") == len(data)
    assert file_manager.read_bytes("up/loaded.bin") == data
    other = tmp_path / "other.bin"  # a new file: put_file's sources are never modified once published
    other.write_bytes(b"other")
    with pytest.raises(CheckpointFileExistsError):
        file_manager.put_file(str(other), "up/loaded.bin")
    assert file_manager.read_bytes("up/loaded.bin") == data
    assert file_manager.put_file(str(other), "up/loaded.bin", exclusive=False) == 5
    assert file_manager.read_bytes("up/loaded.bin") == b"other"
    src.unlink()
    other.unlink()  # the published files outlive their sources
    assert file_manager.read_bytes("up/loaded.bin") == b"other"
    assert leftover_temp_files(file_manager) == []


def test_local_put_file_links_on_the_same_file_system(tmp_path: Path) -> None:
    """The commit path's publish: no second copy (and fsync) of the bytes when a link will do."""
    fm = LocalFileManager(str(tmp_path / "root"))
    src = tmp_path / "sealed.changelog"
    src.write_bytes(b"sealed bytes")
    os.utime(src, (1_000_000, 1_000_000))  # a source written long ago
    assert fm.put_file(str(src), "a/b.changelog") == 12
    assert time.time() - fm.info("a/b.changelog").mtime < 60, "the published file is dated by its publish"
    assert os.stat(fm.root_path + "/a/b.changelog").st_ino == src.stat().st_ino
    with pytest.raises(CheckpointFileExistsError):
        fm.put_file(str(src), "a/b.changelog")
    assert leftover_temp_files(fm) == []


def test_put_file_missing_source_publishes_nothing(file_manager: CheckpointFileManager, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        file_manager.put_file(str(tmp_path / "nope"), "up/never")
    assert not file_manager.exists("up/never")
    assert leftover_temp_files(file_manager) == []


# -- reading ----------------------------------------------------------------------------------------


def test_open_streams(file_manager: CheckpointFileManager) -> None:
    data = payload(1_000_000, seed=4)
    with file_manager.create("r/data") as out:
        out.write(data)
    with file_manager.open("r/data") as f:
        head = f.read(10)
        rest = b""
        while chunk := f.read(65536):
            rest += chunk
    assert head + rest == data


def test_download(file_manager: CheckpointFileManager, tmp_path: Path) -> None:
    data = payload(300_000, seed=5)
    with file_manager.create("r/dl") as out:
        out.write(data)
    target = tmp_path / "copy"
    target.write_bytes(b"stale content that is longer than nothing")
    assert file_manager.download("r/dl", str(target)) == len(data)
    assert target.read_bytes() == data


@pytest.mark.parametrize("op", ["open", "read_bytes", "download", "info"])
def test_missing_file_raises_not_found(file_manager: CheckpointFileManager, tmp_path: Path, op: str) -> None:
    with pytest.raises(CheckpointFileNotFoundError) as ei:
        if op == "download":
            file_manager.download("no/such/file", str(tmp_path / "t"))
        else:
            getattr(file_manager, op)("no/such/file")
    assert "no/such/file" in str(ei.value)
    assert isinstance(ei.value, FileNotFoundError)
    if op == "download":
        assert not (tmp_path / "t").exists()


def test_exists_and_info(file_manager: CheckpointFileManager) -> None:
    t0 = time.time()
    with file_manager.create("i/f.txt") as out:
        out.write(b"12345")
    t1 = time.time()
    assert file_manager.exists("i/f.txt")
    assert not file_manager.exists("i/g.txt")
    assert not file_manager.exists("i")  # a directory / common prefix is not a file
    info = file_manager.info("i/f.txt")
    assert (info.path, info.size) == ("i/f.txt", 5)
    assert t0 - 5 <= info.mtime <= t1 + 5


# -- listing ----------------------------------------------------------------------------------------

# Chosen so that walking directories in name order differs from sorting full paths: '-' and '.'
# sort before '/', '0' after it.
TREE = [
    "a-x",
    "a.txt",
    "a/b.txt",
    "a/b/c",
    "a/b/c2/deep/file",
    "a/b/d",
    "a/b-",
    "a/bb",
    "a0",
    "b/x",
    "state/op/00000/changelogs/00000000000000000001_" + "0" * 32 + ".changelog",
    "state/op/00000/changelogs/00000000000000000002_" + "1" * 32 + ".changelog",
    "state/op/00001/changelogs/00000000000000000001_" + "2" * 32 + ".changelog",
    "z",
]


@pytest.fixture
def tree(file_manager: CheckpointFileManager) -> Iterator[CheckpointFileManager]:
    for i, p in enumerate(TREE):
        with file_manager.create(p) as out:
            out.write(b"x" * i)
    yield file_manager


def test_list_is_sorted_across_nested_directories(tree: CheckpointFileManager) -> None:
    infos = list(tree.list())
    assert [i.path for i in infos] == sorted(TREE)
    assert {i.path: i.size for i in infos} == {p: i for i, p in enumerate(TREE)}
    assert all(i.mtime > 0 for i in infos)


PREFIXES = ["", "a", "a/", "a/b", "a/b/", "a/b/c", "a.", "b/", "state/op/", "state/op/0000", "state/op/00000/", "q"]


def test_list_prefix_and_start_after(tree: CheckpointFileManager) -> None:
    # start_after at every listed path, between them, and before/after everything
    cursors = [*TREE, "", "a", "a/", "a/b", "a/b/", "a/b/c1", "a/b/c3", "a/c", "m", "state/op/00000/", "zz"]
    for prefix in PREFIXES:
        expected = sorted(p for p in TREE if p.startswith(prefix))
        assert paths(tree, prefix) == expected, prefix
        for cursor in cursors:
            want = [p for p in expected if p > cursor]
            assert paths(tree, prefix, start_after=cursor) == want, (prefix, cursor)


def test_list_resumes_page_by_page(tree: CheckpointFileManager) -> None:
    """A watcher that remembers the last name it saw sees every file exactly once."""
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = [i.path for i, _ in zip(tree.list(start_after=cursor), range(3), strict=False)]
        if not page:
            break
        seen += page
        cursor = page[-1]
    assert seen == sorted(TREE)


def test_list_hides_unpublished_writes(file_manager: CheckpointFileManager) -> None:
    with file_manager.create("p/done") as out:
        out.write(b"1")
    pending = file_manager.create("p/pending")
    pending.write(b"partial")
    try:
        assert paths(file_manager) == ["p/done"]
        assert paths(file_manager, "p/") == ["p/done"]
    finally:
        pending.cancel()


# -- delete_many ------------------------------------------------------------------------------------


def test_delete_many(tree: CheckpointFileManager) -> None:
    gone = ["a/b/c", "a/b/c2/deep/file", "z", "a-x"]
    missing = ["a/b/never", "nothing/here"]
    result = tree.delete_many([*gone, *missing])
    assert result.errors == {}
    assert sorted(result.deleted) == sorted(gone + missing)  # missing files count as deleted
    assert paths(tree) == sorted(set(TREE) - set(gone))
    again = tree.delete_many(gone)
    assert sorted(again.deleted) == sorted(gone) and again.errors == {}
    assert tree.delete_many([]).deleted == []


def test_delete_many_many_files(file_manager: CheckpointFileManager) -> None:
    names = [f"bulk/{i:05d}" for i in range(60)]
    for n in names:
        with file_manager.create(n) as out:
            out.write(n.encode())
    result = file_manager.delete_many(iter(names))  # any iterable
    assert sorted(result.deleted) == names and result.errors == {}
    assert paths(file_manager) == []


def test_delete_many_with_one_bad_path_deletes_nothing(tree: CheckpointFileManager) -> None:
    """Every path is validated before the first delete (invariant 7), on every backend."""
    with pytest.raises(ConfigurationError, match=r"'\.\.'"):
        tree.delete_many(["z", "a-x", "../z"])
    assert paths(tree) == sorted(TREE)


def test_delete_many_takes_each_path_once(tree: CheckpointFileManager) -> None:
    result = tree.delete_many(["z", "z", "a-x", "z"])
    assert sorted(result.deleted) == ["a-x", "z"] and result.errors == {}


# -- path validation --------------------------------------------------------------------------------

BAD_PATHS = [
    "",
    "..",
    "../x",
    "a/../b",
    "a/..",
    "/abs",
    "/etc/passwd",
    "a//b",
    "a/",
    "./a",
    ".hidden",
    "a/.b",
    "a\\..\\b",
    "a\n",
    "a/b\n",
    "a\n/b",
]


def test_bad_paths_are_refused(file_manager: CheckpointFileManager, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x")
    ops: dict[str, Callable[[str], object]] = {
        "create": file_manager.create,
        "put_file": lambda bad: file_manager.put_file(str(src), bad),
        "open": file_manager.open,
        "read_bytes": file_manager.read_bytes,
        "download": lambda bad: file_manager.download(bad, str(tmp_path / "d")),
        "exists": file_manager.exists,
        "info": file_manager.info,
        "delete_many": lambda bad: file_manager.delete_many([bad]),
    }
    for bad in BAD_PATHS:
        for name, op in ops.items():
            with pytest.raises(ConfigurationError) as ei:
                op(bad)
            msg = str(ei.value)  # names the path, or the offending component of it
            assert any(repr(part) in msg for part in [bad, *bad.split("/")]), (name, msg)
    assert paths(file_manager) == []
    assert not (tmp_path / "d").exists()


@given(st.text(alphabet="ab0_.-=+/\n\\ ", max_size=12), st.booleans())
def test_a_path_is_accepted_exactly_when_each_component_is(path: str, allow_temp: bool) -> None:
    """The one-match fast path of `validate_relative_path` agrees with the component-by-component rule."""
    parts = path.split("/")
    last = parts[-1]
    if allow_temp and last.startswith(".") and last.endswith(".tmp"):
        last = last[1:]

    def safe(name: str) -> bool:
        try:
            validate_component(name)
        except ConfigurationError:
            return False
        return True

    expected = all(safe(p) for p in [*parts[:-1], last])
    try:
        accepted = validate_relative_path(path, allow_temp=allow_temp) == path
    except ConfigurationError:
        accepted = False
    assert accepted == expected


def test_bad_list_prefixes_are_refused(file_manager: CheckpointFileManager) -> None:
    for bad in ["../", "/abs", "a/../", "..", "a/../b"]:
        with pytest.raises(ConfigurationError) as ei:
            list(file_manager.list(bad))
        assert repr(bad) in str(ei.value)


def test_delete_many_never_leaves_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep me")
    fm = open_file_manager(str(tmp_path / "root"))
    for bad in ["../outside.txt", str(outside)]:
        with pytest.raises(ConfigurationError):
            fm.delete_many([bad])
    assert outside.read_bytes() == b"keep me"


# -- URIs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("gs://bucket/prefix", "gs"),
        ("hdfs://namenode/ckpt", "hdfs"),
        ("http://example.com/x", "http"),
        ("file://otherhost/tmp/x", "otherhost"),
        ("", "empty"),
        ("   ", "empty"),
    ],
)
def test_bad_root_uris(uri: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as ei:
        open_file_manager(uri)
    assert named in str(ei.value)


def test_root_uri_round_trips(file_manager: CheckpointFileManager) -> None:
    with file_manager.create("rt/file") as out:
        out.write(b"via one manager")
    again = open_file_manager(file_manager.root_uri)
    assert again.root_uri == file_manager.root_uri
    assert again.read_bytes("rt/file") == b"via one manager"


def test_local_roots_as_path_and_file_uri(tmp_path: Path) -> None:
    root = tmp_path / "with space" / "and%percent"
    by_path = open_file_manager(str(root))
    with by_path.create("f") as out:
        out.write(b"1")
    by_uri = open_file_manager(root.as_uri())  # percent-encoded
    assert by_uri.read_bytes("f") == b"1"
    assert (root / "f").read_bytes() == b"1"
    (tmp_path / "plainfile").write_bytes(b"")
    with pytest.raises(ConfigurationError, match="plainfile"):
        open_file_manager(str(tmp_path / "plainfile"))


# -- no overwrite of commit records (invariant 2) ---------------------------------------------------


def test_commit_record_is_never_overwritten(checkpoint_root: str) -> None:
    fm = open_file_manager(checkpoint_root)
    ids = [new_checkpoint_id(), new_checkpoint_id()]
    CommitLog(fm).commit(1, {"agg": ids})
    original = fm.read_bytes(commit_path(1))

    other = [new_checkpoint_id(), ids[1]]
    for log in (CommitLog(fm), CommitLog(open_file_manager(checkpoint_root))):  # cached and fresh readers
        with pytest.raises(CheckpointFileExistsError) as ei:
            log.commit(1, {"agg": other})
        assert commit_path(1) in str(ei.value)
        with pytest.raises(CheckpointFileExistsError):
            log.commit(1, {"agg": ids, "other_op": [new_checkpoint_id()]})
    assert fm.read_bytes(commit_path(1)) == original
    fresh = CommitLog(open_file_manager(checkpoint_root)).get(1)
    assert fresh is not None and fresh.checkpoint_ids == {"agg": tuple(ids)}
    assert leftover_temp_files(fm) == []


def test_commit_record_same_outcome_is_idempotent(checkpoint_root: str) -> None:
    fm = open_file_manager(checkpoint_root)
    ids = {"agg": [new_checkpoint_id()], "join": [new_checkpoint_id(), new_checkpoint_id()]}
    first = CommitLog(fm).commit(1, ids)
    original = fm.read_bytes(commit_path(1))
    time.sleep(0.01)  # a retry has a later created_at: it must not be written
    retried = CommitLog(open_file_manager(checkpoint_root)).commit(1, ids)
    assert retried.same_outcome(first)
    assert retried.created_at == first.created_at
    assert fm.read_bytes(commit_path(1)) == original
    assert list(CommitLog(fm).versions()) == [1]


def test_commit_log_refuses_gaps_and_partition_changes(checkpoint_root: str) -> None:
    fm = open_file_manager(checkpoint_root)
    log = CommitLog(fm)
    with pytest.raises(LineageError, match="version 1"):
        log.commit(2, {"agg": [new_checkpoint_id()]})
    log.commit(1, {"agg": [new_checkpoint_id(), new_checkpoint_id()]})
    with pytest.raises(ConfigurationError, match="'agg' has 2 partitions"):
        log.commit(2, {"agg": [new_checkpoint_id()]})
    assert not fm.exists(commit_path(2))
    with pytest.raises(ConfigurationError, match="version 0"):
        log.commit(0, {"agg": [new_checkpoint_id()]})


def test_local_publish_is_durable_rename(tmp_path: Path) -> None:
    """Local only: the published file is a regular file with one link (the temp name is gone)."""
    fm = open_file_manager(str(tmp_path))
    with fm.create("d/f") as out:
        out.write(b"abc")
    st = os.stat(tmp_path / "d" / "f")
    assert st.st_nlink == 1
    assert sorted(os.listdir(tmp_path / "d")) == ["f"]


@pytest.mark.parametrize("prefix", ["", "op/", "op/0/", "op/0/changelogs/", "op/1", "commits/", "o", "none/"])
def test_one_local_walk_lists_the_published_and_the_temp_files(tmp_path: Path, prefix: str) -> None:
    """`list_with_temp_files` (the maintenance inventory's one walk of a local root) gives exactly what
    `list` gives, in key order, and every unfinished write under the prefix: nothing a second walk found."""
    from statekeeper.store.files.local import temp_name_for

    fm = LocalFileManager(str(tmp_path))
    published = ["commits/0000000001.json", "op/0/changelogs/a.zst", "op/0/snapshots/b.json", "op/10/x", "op/1/y"]
    for p in published:
        with fm.create(p) as out:
            out.write(b"x")
    temps = []
    for final in ["commits/0000000002.json", "op/0/changelogs/c.zst", "op/1/z", "top.json"]:
        d, _, name = final.rpartition("/")
        temp = f"{d}/{temp_name_for(name)}" if d else temp_name_for(name)
        os.makedirs(tmp_path / d, exist_ok=True)
        (tmp_path / temp).write_bytes(b"partial")
        temps.append(temp)
    listed, unfinished = fm.list_with_temp_files(prefix)
    assert [i.path for i in listed] == paths(fm, prefix)
    assert sorted(i.path for i in unfinished) == sorted(t for t in temps if t.startswith(prefix))
    assert all(i.size == len(b"partial") for i in unfinished)
    assert sorted(i.path for i in fm.list_temp_files(prefix)) == sorted(i.path for i in unfinished)
