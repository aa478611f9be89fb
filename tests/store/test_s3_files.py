"""The S3 checkpoint file manager against moto's server over real HTTP.

Atomic create (single PUT and streamed multipart), cancel and abort, exclusive create, streaming
reads, paginated listing, batched delete, incomplete-upload maintenance and conditional-write probing.
The backend-neutral behaviour is covered by test_file_manager.py on both backends.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import pickle
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.store.errors import (
    CheckpointError,
    CheckpointFileExistsError,
    CheckpointFileNotFoundError,
    ConfigurationError,
)
from statekeeper.store.files import open_file_manager
from statekeeper.store.files.s3 import MIN_PART_SIZE, S3FileManager, write_id_of
from testkit.s3 import FaultProxy, Request, all_keys, incomplete_uploads, s3_client

MiB = 1 << 20
PART = MIN_PART_SIZE


@pytest.fixture
def raw(s3_endpoint: str) -> Any:
    return s3_client(s3_endpoint)


@pytest.fixture
def fm(s3_bucket: str) -> S3FileManager:
    return S3FileManager(f"s3://{s3_bucket}/root", list_page_size=7, multipart_threshold=PART, multipart_part_size=PART)


@pytest.fixture
def counting(s3_endpoint: str, s3_bucket: str) -> Iterator[tuple[FaultProxy, S3FileManager]]:
    """A manager behind a fault-free proxy, to count the requests it makes."""
    with FaultProxy(s3_endpoint) as proxy:
        yield (
            proxy,
            S3FileManager(
                f"s3://{s3_bucket}/root",
                endpoint_url=proxy.endpoint_url,
                list_page_size=7,
                multipart_threshold=PART,
                multipart_part_size=PART,
            ),
        )


def chunks(total: int, size: int, seed: int = 0) -> Iterator[bytes]:
    """Deterministic pseudo-random data made on the fly (so tests can measure memory)."""
    block = hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1)
    i = 0
    while total > 0:
        n = min(size, total)
        yield bytes([i % 251]) + block[1:n]
        total -= n
        i += 1


def test_small_create_is_one_put_published_on_close(fm: S3FileManager, raw: Any, s3_bucket: str) -> None:
    out = fm.create("a/small.bin")
    out.write(b"hello ")
    out.write(bytearray(b"wor"))
    out.write(memoryview(b"ld"))
    assert all_keys(raw, s3_bucket) == {}, "nothing is visible before close"
    out.close()
    assert fm.read_bytes("a/small.bin") == b"hello world"
    head = raw.head_object(Bucket=s3_bucket, Key="root/a/small.bin")
    assert write_id_of(head)
    assert incomplete_uploads(raw, s3_bucket) == []


def test_empty_file(fm: S3FileManager) -> None:
    with fm.create("empty"):
        pass
    assert fm.read_bytes("empty") == b""
    assert fm.info("empty").size == 0


def test_multipart_create_streams_parts_and_publishes_on_close(fm: S3FileManager, raw: Any, s3_bucket: str) -> None:
    data = b"".join(chunks(2 * PART + 123_457, 700_001))
    out = fm.create("big/file.bin")
    for i in range(0, len(data), 999_983):  # odd write sizes across part boundaries
        out.write(data[i : i + 999_983])
    assert all_keys(raw, s3_bucket) == {}, "no partial object is ever visible"
    assert len(incomplete_uploads(raw, s3_bucket)) == 1, "parts were streamed while writing"
    out.close()
    head = raw.head_object(Bucket=s3_bucket, Key="root/big/file.bin")
    assert head["ETag"].endswith('-3"'), head["ETag"]
    assert head["ContentLength"] == len(data)
    assert fm.read_bytes("big/file.bin") == data
    assert incomplete_uploads(raw, s3_bucket) == []


def test_multipart_memory_is_bounded(fm: S3FileManager) -> None:
    """40 MiB through 5 MiB parts: the writer holds at most two parts (buffer + one in flight).

    moto runs in this process, so only memory allocated by the manager's own code is counted.
    """
    out = fm.create("huge.bin")
    only_s3 = [tracemalloc.Filter(True, "*store/files/s3/*.py")]
    held = []
    tracemalloc.start()
    try:
        for block in chunks(8 * PART, MiB):
            out.write(block)
            assert len(out._buf) <= PART
            snap = tracemalloc.take_snapshot().filter_traces(only_s3)
            held.append(sum(stat.size for stat in snap.statistics("filename")))
    finally:
        tracemalloc.stop()
    out.close()
    assert fm.info("huge.bin").size == 8 * PART
    assert max(held) <= 2 * PART + MiB, f"writer held {max(held) / MiB:.1f} MiB of a {8 * PART // MiB} MiB file"
    assert max(held) > PART, "the measurement sees the buffered part"


@pytest.mark.parametrize("size", [100, 2 * PART + 1], ids=["single", "multipart"])
def test_cancel_leaves_nothing(fm: S3FileManager, raw: Any, s3_bucket: str, size: int) -> None:
    out = fm.create("c.bin")
    out.write(b"x" * size)
    out.cancel()
    out.cancel()  # idempotent
    assert all_keys(raw, s3_bucket) == {}
    assert incomplete_uploads(raw, s3_bucket) == [], "the multipart upload was aborted"
    with pytest.raises(CheckpointError, match="after cancelled"):
        out.write(b"more")


@pytest.mark.parametrize("size", [100, 2 * PART + 1], ids=["single", "multipart"])
def test_exception_in_block_leaves_nothing_and_aborts(fm: S3FileManager, raw: Any, s3_bucket: str, size: int) -> None:
    with pytest.raises(RuntimeError, match="boom"), fm.create("e.bin") as out:
        out.write(b"y" * size)
        raise RuntimeError("boom")
    assert all_keys(raw, s3_bucket) == {}
    assert incomplete_uploads(raw, s3_bucket) == []


@pytest.mark.parametrize("size", [10, 2 * PART + 7], ids=["single", "multipart"])
def test_exclusive_create_refuses_to_overwrite(fm: S3FileManager, raw: Any, s3_bucket: str, size: int) -> None:
    with fm.create("commits/1.commit") as out:
        out.write(b"first")
    with (
        pytest.raises(CheckpointFileExistsError, match=r"s3://.*/root/commits/1\.commit"),
        fm.create("commits/1.commit", exclusive=True) as out,
    ):
        out.write(b"z" * size)
    assert fm.read_bytes("commits/1.commit") == b"first"
    assert incomplete_uploads(raw, s3_bucket) == [], "the refused multipart upload was aborted"


def test_non_exclusive_create_replaces(fm: S3FileManager) -> None:
    for content in (b"one", b"two"):
        with fm.create("sst/abc.sst", exclusive=False) as out:
            out.write(content)
    assert fm.read_bytes("sst/abc.sst") == b"two"


@pytest.mark.parametrize("size", [3 * MiB, 2 * PART + 5], ids=["single", "multipart"])
def test_put_file_and_download(fm: S3FileManager, tmp_path: Path, size: int) -> None:
    src = tmp_path / "src.bin"
    data = b"".join(chunks(size, MiB, seed=size))
    src.write_bytes(data)
    assert fm.put_file(str(src), "state/x.bin") == size
    dst = tmp_path / "dst.bin"
    assert fm.download("state/x.bin", str(dst)) == size
    assert dst.read_bytes() == data
    with pytest.raises(CheckpointFileExistsError):
        fm.put_file(str(src), "state/x.bin")


def test_open_streams_without_seeking(fm: S3FileManager) -> None:
    data = b"".join(chunks(3 * MiB + 17, MiB))
    with fm.create("s.bin") as out:
        out.write(data)
    with fm.open("s.bin") as f:
        assert not f.seekable()
        assert f.read(10) == data[:10]
        rest = bytearray()
        while block := f.read(65_537):
            rest += block
    assert bytes(rest) == data[10:]


@pytest.mark.parametrize("op", ["open", "read_bytes", "download", "info"])
def test_missing_file_names_the_uri(fm: S3FileManager, tmp_path: Path, op: str) -> None:
    calls: dict[str, Callable[[], object]] = {
        "open": lambda: fm.open("no/such.file"),
        "read_bytes": lambda: fm.read_bytes("no/such.file"),
        "download": lambda: fm.download("no/such.file", str(tmp_path / "d")),
        "info": lambda: fm.info("no/such.file"),
    }
    with pytest.raises(CheckpointFileNotFoundError, match=r"s3://.*/root/no/such\.file"):
        calls[op]()
    assert not (tmp_path / "d").exists()
    assert not fm.exists("no/such.file")


def test_listing_paginates_with_start_after(
    counting: tuple[FaultProxy, S3FileManager], raw: Any, s3_bucket: str
) -> None:
    proxy, fm = counting
    names = [f"state/op/{p:05d}/changelogs/{v:020d}_x.changelog" for p in range(3) for v in range(10)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: raw.put_object(Bucket=s3_bucket, Key=f"root/{k}", Body=b"1"), names))
    raw.put_object(Bucket=s3_bucket, Key="root/state/op/marker/", Body=b"")  # a "directory" object
    raw.put_object(Bucket=s3_bucket, Key="rootother/state/x", Body=b"")  # outside the root
    before = proxy.requests["ListObjectsV2"]
    listed = [i.path for i in fm.list()]
    assert listed == sorted(names)
    assert proxy.requests["ListObjectsV2"] - before == 5, "30 keys at 7 per page"
    after = names[13]
    assert [i.path for i in fm.list("state/op/", start_after=after)] == sorted(names)[14:]
    assert [i.path for i in fm.list("state/op/00001/")] == sorted(names)[10:20]
    assert [i.path for i in fm.list("state/op/0000")] == sorted(names)
    assert list(fm.list("nothing/")) == []
    info = fm.list("state/op/00002/").__next__()
    assert info.size == 1 and info.mtime > 0


def test_delete_many_over_1000_keys_in_batches(
    counting: tuple[FaultProxy, S3FileManager], raw: Any, s3_bucket: str
) -> None:
    proxy, fm = counting
    sizes: list[int] = []

    def record(req: Request) -> None:
        if req.operation == "DeleteObjects":
            sizes.append(req.body.count(b"<Key>"))

    proxy.rules.append(record)
    names = [f"d/{i:05d}" for i in range(2345)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: raw.put_object(Bucket=s3_bucket, Key=f"root/{k}", Body=b""), names))
    raw.put_object(Bucket=s3_bucket, Key="keep/outside", Body=b"")
    result = fm.delete_many([*names, "d/missing", names[0]])  # a missing key and a duplicate
    assert result.errors == {}
    assert sorted(result.deleted) == sorted([*names, "d/missing"])
    assert sorted(sizes) == [346, 1000, 1000]
    assert all_keys(raw, s3_bucket) == {"keep/outside": 0}


def test_delete_many_validates_every_path_first(fm: S3FileManager, raw: Any, s3_bucket: str) -> None:
    with fm.create("ok") as out:
        out.write(b"1")
    for bad in ("../escape", "/abs", "a/../../b", "", "x/"):
        with pytest.raises(ConfigurationError):
            fm.delete_many(["ok", bad])
    assert fm.exists("ok"), "bad input deletes nothing"
    assert fm.delete_many([]).deleted == []


def test_incomplete_uploads_are_listed_and_aborted(fm: S3FileManager, raw: Any, s3_bucket: str) -> None:
    """A writer that dies between parts leaves an upload, never an object; maintenance aborts it."""
    crashed = fm.create("state/op/00000/sst/big.sst")
    crashed.write(b"p" * (PART + 1))  # multipart started, first part sent
    crashed._wait_pending()
    other = fm.create("other/x.bin")
    other.write(b"q" * (PART + 1))
    assert all_keys(raw, s3_bucket) == {}
    ups = list(fm.list_incomplete_uploads("state/"))
    assert [u.path for u in ups] == ["state/op/00000/sst/big.sst"]
    assert len(list(fm.list_incomplete_uploads())) == 2
    assert fm.abort_incomplete_upload(ups[0].path, ups[0].upload_id) is True
    assert fm.abort_incomplete_upload(ups[0].path, ups[0].upload_id) is False
    assert [u.path for u in fm.list_incomplete_uploads()] == ["other/x.bin"]
    other.cancel()
    assert list(fm.list_incomplete_uploads()) == []
    with pytest.raises(ConfigurationError):
        fm.abort_incomplete_upload("../x", "id")


def test_incomplete_upload_listing_paginates(fm: S3FileManager) -> None:
    outs = []
    for i in range(9):
        out = fm.create(f"u/{i}")
        out.write(b"r" * (PART + 1))
        outs.append(out)
    assert len(list(fm.list_incomplete_uploads("u/"))) == 9  # 7 per page
    for out in outs:
        out.cancel()


def test_conditional_writes_probe(s3_endpoint: str, s3_bucket: str, raw: Any) -> None:
    fm = S3FileManager(f"s3://{s3_bucket}/root")
    assert fm.probe_conditional_writes() is True, "moto honours If-None-Match: *"
    with FaultProxy(s3_endpoint, ignore_if_none_match=True) as proxy:
        ignoring = S3FileManager(f"s3://{s3_bucket}/root", endpoint_url=proxy.endpoint_url)
        assert ignoring.probe_conditional_writes() is False
    assert all_keys(raw, s3_bucket) == {}, "the probe cleans up"


@pytest.mark.parametrize("size", [10, 2 * PART + 3], ids=["single", "multipart"])
def test_store_ignoring_if_none_match_needs_head_check(s3_endpoint: str, s3_bucket: str, size: int) -> None:
    """A store that ignores If-None-Match is refused at the first exclusive publish, naming the
    capability and the setting; trusted anyway it would overwrite; the documented HEAD check refuses
    (racy between two writers, see docs/s3.md)."""
    with FaultProxy(s3_endpoint, ignore_if_none_match=True) as proxy:
        common = {"endpoint_url": proxy.endpoint_url, "multipart_threshold": PART, "multipart_part_size": PART}
        probing = S3FileManager(f"s3://{s3_bucket}/root", **common)
        trusting = S3FileManager(f"s3://{s3_bucket}/root", conditional_writes="trust", **common)
        checked = S3FileManager(f"s3://{s3_bucket}/root", head_before_create=True, **common)
        refused = pytest.raises(ConfigurationError, match=r"ignores If-None-Match.*STATEKEEPER_S3_HEAD_BEFORE_CREATE")
        with refused, probing.create("commit") as out:
            out.write(b"x" * size)
        assert not probing.exists("commit")
        with probing.create("sst", exclusive=False) as out:  # content-addressed names need no condition
            out.write(b"sst")
        with trusting.create("commit") as out:
            out.write(b"first")
        with trusting.create("commit", exclusive=True) as out:
            out.write(b"x" * size)
        assert trusting.info("commit").size == size, "the store ignored the condition and replaced the file"
        with pytest.raises(CheckpointFileExistsError, match="HEAD check"), checked.create("commit") as out:
            out.write(b"second")
        assert checked.info("commit").size == size
        assert list(checked.list_incomplete_uploads()) == []
        with checked.create("fresh", exclusive=True) as out:
            out.write(b"ok")
        assert checked.read_bytes("fresh") == b"ok"
        assert [i.path for i in checked.list()] == ["commit", "fresh", "sst"], "no probe object is left"


def test_manager_pickles_for_executors(fm: S3FileManager) -> None:
    with fm.create("p") as out:
        out.write(b"pickled")
    clone = pickle.loads(pickle.dumps(fm))
    assert clone.root_uri == fm.root_uri
    assert clone.options == fm.options
    assert clone.read_bytes("p") == b"pickled"


def test_selected_by_scheme(s3_bucket: str) -> None:
    for scheme in ("s3", "s3a", "S3"):
        fm = open_file_manager(f"{scheme}://{s3_bucket}/a/b/")
        assert isinstance(fm, S3FileManager)
        assert fm.root_uri == f"{scheme.lower()}://{s3_bucket}/a/b"
    bucket_root = open_file_manager(f"s3://{s3_bucket}")
    with bucket_root.create("top") as out:
        out.write(b"t")
    assert [i.path for i in bucket_root.list()] == ["top"]
    assert os.environ["STATEKEEPER_S3_LIST_PAGE_SIZE"] == "7"


@given(st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2200, 1, 1)))
def test_timestamps_parse_as_botocore_parses_them(when: dt.datetime) -> None:
    """The clients' fast timestamp parser agrees with botocore's own on both forms S3 sends."""
    import botocore.utils

    from statekeeper.store.files.s3.client import parse_timestamp

    iso = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    http = when.strftime("%a, %d %b %Y %H:%M:%S GMT")
    for text in (iso, http, when.isoformat() + "+00:00", str(int(when.replace(tzinfo=dt.UTC).timestamp()))):
        assert parse_timestamp(text) == botocore.utils.parse_timestamp(text), text


@pytest.mark.parametrize("spool", [None, 64], ids=["in-memory", "spilled-to-disk"])
def test_a_load_fetches_each_changelog_once(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path, spool: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replaying changelogs from S3 issues one GetObject per changelog (the stream is kept, not fetched
    again), also when the kept copy outgrows memory and goes to a temporary file."""
    from statekeeper.store import CommitLog, StateStore, StoreConfig
    from statekeeper.store.files import base

    if spool is not None:
        monkeypatch.setattr(base, "SPOOL_BYTES", spool)

    fm = S3FileManager(f"s3://{s3_bucket}/ckpt", endpoint_url=s3_endpoint)
    commits = CommitLog(fm)
    writer = StateStore(fm, "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "w")))
    ckpt = None
    for v in range(5):
        store = writer.load(v, ckpt)
        store.put(b"k%d" % v, os.urandom(100))
        ckpt = store.commit().checkpoint_id
        commits.commit(v + 1, {"agg": [ckpt]})
    writer.close()
    gets: list[str] = []

    def count(params: dict[str, Any], **_: Any) -> None:
        gets.append(params["Key"])

    events = fm.client.meta.events  # the process's shared client: unregistered below
    events.register("provide-client-params.s3.GetObject", count)
    reader = StateStore(fm, "agg", 0, config=StoreConfig(local_dir=str(tmp_path / "r")))
    try:
        assert len(list(reader.load(5, ckpt).items())) == 5
    finally:
        reader.close()
        events.unregister("provide-client-params.s3.GetObject", count)
    changelog_gets = [k for k in gets if "/changelogs/" in k]
    # once each for the replay, and the newest once more: the load plan reads its lineage first
    assert len(set(changelog_gets)) == 5 and len(changelog_gets) == 6, gets


def test_the_write_id_is_found_however_the_store_spells_its_metadata_name() -> None:
    """S3 returns metadata names in lower case; a server that canonicalises header names (Go's, and the waitress
    that serves moto to these tests) capitalises them. A published object must be recognised either way."""
    assert write_id_of({"Metadata": {"statekeeper-write-id": "a1"}}) == "a1"
    assert write_id_of({"Metadata": {"Statekeeper-Write-Id": "a1"}}) == "a1"
    assert write_id_of({"Metadata": {"other": "a1"}}) is None
    assert write_id_of({}) is None
