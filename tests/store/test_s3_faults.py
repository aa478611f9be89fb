"""Fault injection over real HTTP: the S3 manager behind a proxy that fails requests like S3 does.

Each fault kind hits each write, read, list and delete path; a failure between multipart parts
aborts the upload; throttled DeleteObjects keys are retried and other per-key errors reported.
Throughout: nothing written is lost and no partial object is ever visible.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store.errors import CheckpointError
from statekeeper.store.files.s3 import MIN_PART_SIZE, S3FileManager
from testkit.s3 import (
    ALL_FAULTS,
    DENY,
    INTERNAL,
    INTERNAL_AFTER,
    RESET,
    RESET_AFTER,
    SLOWDOWN,
    TIMEOUT,
    TRUNCATE,
    FaultProxy,
    Request,
    Rule,
    all_keys,
    incomplete_uploads,
    s3_client,
)

PART = MIN_PART_SIZE
WRITE_FAULTS = (SLOWDOWN, INTERNAL, INTERNAL_AFTER, RESET, RESET_AFTER, TIMEOUT)


@pytest.fixture
def raw(s3_endpoint: str) -> Any:
    return s3_client(s3_endpoint)


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_endpoint, seed=7, hang_s=1.5) as p:
        yield p


@pytest.fixture
def fm(proxy: FaultProxy, s3_bucket: str) -> S3FileManager:
    return S3FileManager(
        f"s3://{s3_bucket}/root",
        endpoint_url=proxy.endpoint_url,
        max_attempts=10,
        connect_timeout=1.0,
        read_timeout=1.0,
        list_page_size=7,
        multipart_threshold=PART,
        multipart_part_size=PART,
        delete_batch_size=50,
    )


def first(op: str, kind: str, times: int = 1, when: Callable[[Request], bool] | None = None) -> Rule:
    """Inject `kind` on the first `times` requests of operation `op` (optionally matching `when`)."""
    left = [times]

    def rule(req: Request) -> str | None:
        if req.operation == op and left[0] > 0 and (when is None or when(req)):
            left[0] -= 1
            return kind
        return None

    return rule


def data_of(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def assert_no_partial_uploads(raw: Any, bucket: str) -> None:
    """Only empty orphans may remain: a CreateMultipartUpload whose answer was lost (docs/s3.md)."""
    for up in incomplete_uploads(raw, bucket):
        parts = raw.list_parts(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"]).get("Parts", [])
        assert parts == [], f"an upload with parts was left behind: {up['Key']}"


@pytest.mark.parametrize("kind", WRITE_FAULTS)
@pytest.mark.parametrize("op", ["PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"])
def test_write_survives_each_fault(
    fm: S3FileManager, proxy: FaultProxy, raw: Any, s3_bucket: str, op: str, kind: str
) -> None:
    """An exclusive create still publishes exactly once, even when the request took effect and its
    answer was lost (the retried conditional write recognises its own write id)."""
    size = 100 if op == "PutObject" else 2 * PART + 11
    data = data_of(size, 1)
    proxy.rules.append(first(op, kind))
    with fm.create("commits/00000000000000000001.commit", exclusive=True) as out:
        out.write(data)
    assert proxy.injected[kind] == 1
    assert fm.read_bytes("commits/00000000000000000001.commit") == data
    assert all_keys(raw, s3_bucket) == {"root/commits/00000000000000000001.commit": size}
    assert_no_partial_uploads(raw, s3_bucket)


@pytest.mark.parametrize("kind", [SLOWDOWN, INTERNAL, RESET, RESET_AFTER, TIMEOUT, TRUNCATE])
def test_reads_survive_each_fault(fm: S3FileManager, proxy: FaultProxy, tmp_path: Path, kind: str) -> None:
    data = data_of(3 * (1 << 20) + 5, 2)
    with fm.create("f.bin") as out:
        out.write(data)

    def download() -> bytes:
        fm.download("f.bin", str(tmp_path / "d"))
        return (tmp_path / "d").read_bytes()

    reads: list[Callable[[], bytes]] = [lambda: fm.read_bytes("f.bin"), lambda: fm.open("f.bin").read(), download]
    for i, read in enumerate(reads):
        proxy.rules[:] = [first("GetObject", kind)]
        assert read() == data, f"read path {i}"
        assert proxy.injected[kind] == i + 1


def test_read_resumes_many_times_then_gives_up_naming_the_file(fm: S3FileManager, proxy: FaultProxy) -> None:
    data = data_of(2 << 20, 3)
    with fm.create("r.bin") as out:
        out.write(data)
    proxy.rules.append(first("GetObject", TRUNCATE, times=4))
    assert fm.read_bytes("r.bin") == data, "four broken bodies, four ranged resumes"
    proxy.rules[:] = [lambda req: TRUNCATE if req.operation == "GetObject" else None]
    with pytest.raises(CheckpointError, match=r"read broke off .* s3://.*/root/r\.bin"):
        fm.with_options(max_attempts=3).read_bytes("r.bin")


@pytest.mark.parametrize("kind", WRITE_FAULTS)
def test_listing_and_head_survive_faults(
    fm: S3FileManager, proxy: FaultProxy, raw: Any, s3_bucket: str, kind: str
) -> None:
    names = [f"l/{i:03d}" for i in range(20)]
    for n in names:
        raw.put_object(Bucket=s3_bucket, Key=f"root/{n}", Body=b"x")
    proxy.rules[:] = [first("ListObjectsV2", kind, when=lambda r: "continuation-token" in r.query)]
    assert [i.path for i in fm.list("l/", start_after="l/002")] == names[3:]
    proxy.rules[:] = [first("HeadObject", kind)]
    assert fm.exists("l/005") and fm.info("l/006").size == 1
    proxy.rules[:] = [first("HeadObject", kind)]
    assert not fm.exists("l/999")


@pytest.mark.parametrize("kind", WRITE_FAULTS)
def test_delete_many_survives_request_faults(
    fm: S3FileManager, proxy: FaultProxy, raw: Any, s3_bucket: str, kind: str
) -> None:
    names = [f"d/{i:04d}" for i in range(120)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: raw.put_object(Bucket=s3_bucket, Key=f"root/{n}", Body=b""), names))
    proxy.rules.append(first("DeleteObjects", kind, times=2))
    result = fm.delete_many(names)
    assert result.errors == {} and sorted(result.deleted) == names
    assert all_keys(raw, s3_bucket) == {}


def test_failure_between_multipart_parts_aborts_and_publishes_nothing(
    fm: S3FileManager, proxy: FaultProxy, raw: Any, s3_bucket: str
) -> None:
    fm = fm.with_options(max_attempts=3)  # part 2 always fails: keep the backoff short
    proxy.rules.append(lambda r: INTERNAL if r.operation == "UploadPart" and r.query["partNumber"] == ["2"] else None)
    with (
        pytest.raises(CheckpointError, match=r"UploadPart failed: InternalError .* s3://.*/root/big\.bin"),
        fm.create("big.bin") as out,
    ):
        for _ in range(4):
            out.write(data_of(PART, 4))
    assert proxy.requests["UploadPart"] >= 4, "part 2 was tried max_attempts times"
    assert proxy.requests["AbortMultipartUpload"] == 1
    assert all_keys(raw, s3_bucket) == {}
    assert incomplete_uploads(raw, s3_bucket) == []


def test_failed_abort_leaves_an_upload_for_maintenance_but_no_object(
    fm: S3FileManager, proxy: FaultProxy, raw: Any, s3_bucket: str
) -> None:
    fm = fm.with_options(max_attempts=3)
    proxy.rules += [
        lambda r: INTERNAL if r.operation == "UploadPart" and r.query["partNumber"] == ["2"] else None,
        lambda r: DENY if r.operation == "AbortMultipartUpload" else None,
    ]
    with pytest.raises(CheckpointError, match="UploadPart failed"), fm.create("big.bin") as out:
        out.write(data_of(3 * PART, 5))
    assert all_keys(raw, s3_bucket) == {}
    proxy.rules.clear()
    [leftover] = fm.list_incomplete_uploads()
    assert leftover.path == "big.bin"
    assert fm.abort_incomplete_upload(leftover.path, leftover.upload_id)
    assert incomplete_uploads(raw, s3_bucket) == []


def test_delete_many_retries_throttled_keys(fm: S3FileManager, proxy: FaultProxy, raw: Any, s3_bucket: str) -> None:
    names = [f"t/{i:04d}" for i in range(400)]
    rng = random.Random(11)  # each key is throttled 0-4 times (< delete_retries), then deleted
    throttle = {f"root/{n}": rng.choice([0, 0, 1, 2, 4]) for n in names}
    lock = threading.Lock()

    def key_fault(key: str) -> str | None:
        with lock:
            if throttle[key] > 0:
                throttle[key] -= 1
                return "SlowDown"
        return None

    proxy.key_fault = key_fault
    proxy.set_faults(0.1, WRITE_FAULTS)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: raw.put_object(Bucket=s3_bucket, Key=f"root/{n}", Body=b""), names))
    result = fm.delete_many(names)
    assert result.errors == {}
    assert sorted(result.deleted) == names
    assert all_keys(raw, s3_bucket) == {}
    assert proxy.injected["delete-key-SlowDown"] >= 5
    assert not any(throttle.values()), "every throttled key was retried until deleted"


def test_delete_many_reports_per_key_errors(fm: S3FileManager, proxy: FaultProxy, raw: Any, s3_bucket: str) -> None:
    names = [f"e/{i:03d}" for i in range(60)]
    for n in names:
        raw.put_object(Bucket=s3_bucket, Key=f"root/{n}", Body=b"")
    proxy.key_fault = lambda key: "AccessDenied" if key.endswith("7") else None
    result = fm.delete_many(names)
    denied = [n for n in names if n.endswith("7")]
    assert sorted(result.errors) == denied
    assert all(v.startswith("AccessDenied") for v in result.errors.values())
    assert sorted(result.deleted) == sorted(set(names) - set(denied))
    assert sorted(all_keys(raw, s3_bucket)) == [f"root/{n}" for n in denied], "refused keys stay"
    assert proxy.requests["DeleteObjects"] == 2, "AccessDenied is not retried"

    proxy.key_fault = lambda key: "SlowDown"
    stubborn = fm.with_options(delete_retries=2)
    result = stubborn.delete_many(denied[:3])
    assert sorted(result.errors) == denied[:3]
    assert all(v.startswith("SlowDown") for v in result.errors.values()), "reported once the retries run out"


def test_random_faults_on_a_mixed_workload(
    fm: S3FileManager, proxy: FaultProxy, raw: Any, s3_bucket: str, tmp_path: Path
) -> None:
    proxy.set_faults(0.2, ALL_FAULTS)
    files = {f"w/{i:03d}": data_of(50 + i, i) for i in range(30)}
    files["w/big1"] = data_of(PART + 99, 100)
    files["w/big2"] = data_of(2 * PART + 7, 101)
    for name, content in files.items():
        with fm.create(name, exclusive=True) as out:
            out.write(content)
    local = tmp_path / "local.bin"
    local.write_bytes(files["w/big2"])
    fm.put_file(str(local), "w/big3")
    files["w/big3"] = files["w/big2"]
    assert {i.path: i.size for i in fm.list("w/")} == {k: len(v) for k, v in files.items()}
    for name, content in files.items():
        assert fm.read_bytes(name) == content
    gone = sorted(files)[::2]
    assert fm.delete_many(gone).errors == {}
    assert [i.path for i in fm.list()] == sorted(set(files) - set(gone))
    assert sum(proxy.injected.values()) >= 20
    assert len([k for k in ALL_FAULTS if proxy.injected[k]]) >= 5, proxy.injected
    assert_no_partial_uploads(raw, s3_bucket)


def test_close_after_a_failed_write_aborts_the_upload(
    fm: S3FileManager, proxy: FaultProxy, raw: Any, s3_bucket: str
) -> None:
    """Without a `with` block: the write that meets a failed part raises, and close() still cleans up."""
    fm = fm.with_options(max_attempts=2)
    proxy.rules.append(lambda r: INTERNAL if r.operation == "UploadPart" else None)
    out = fm.create("w.bin")
    with pytest.raises(CheckpointError, match="UploadPart failed"):
        for _ in range(4):
            out.write(data_of(PART, 6))
    with pytest.raises(CheckpointError, match="close after failed"):
        out.close()
    assert all_keys(raw, s3_bucket) == {}
    assert incomplete_uploads(raw, s3_bucket) == []
