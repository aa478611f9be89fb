"""Where s3rver differs from S3 (docs/s3.md, "S3 implementations compared"), and what the product does.

The backend-parametrized suites already run on s3rver with the settings such a store needs; these
tests show that without them the product refuses with an error naming the capability and the
setting, and that with them nothing is lost or half-listed.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from statekeeper.store.errors import CheckpointError, CheckpointFileNotFoundError, ConfigurationError
from statekeeper.store.files.s3 import MIN_PART_SIZE, WRITE_ID_META, S3FileManager
from statekeeper.store.files.s3 import listing as listing_module
from testkit.s3 import all_keys, s3_client

TREE = ["a/b/c", "a/b/c2/deep/file", "a/bb", "a-x", "a.txt", "b"]
"""s3rver walks `a/` before `a-x` and `a.txt`; binary key order puts them first ('-' and '.' < '/')."""


@pytest.fixture
def raw(s3rver_endpoint: str, s3rver_bucket: str) -> Any:
    return s3_client(s3rver_endpoint)


def _fill(raw: Any, bucket: str, keys: list[str]) -> None:
    """Objects as statekeeper publishes them (with a write id), put directly."""
    for k in keys:
        raw.put_object(Bucket=bucket, Key=f"root/{k}", Body=k.encode(), Metadata={WRITE_ID_META: "test"})


def test_store_ignoring_if_none_match_is_refused_until_head_check(s3rver_bucket: str, raw: Any) -> None:
    probing = S3FileManager(f"s3://{s3rver_bucket}/root", head_before_create=False)
    assert probing.probe_conditional_writes() is False, "s3rver ignores If-None-Match"
    refused = pytest.raises(ConfigurationError, match=r"ignores If-None-Match.*head_before_create")
    with refused, probing.create("commits/1.commit") as out:
        out.write(b"one")
    assert all_keys(raw, s3rver_bucket) == {}, "nothing published, the probe object removed"
    checked = S3FileManager(f"s3://{s3rver_bucket}/root")  # the fixture's environment: HEAD check
    with checked.create("commits/1.commit") as out:
        out.write(b"one")
    with pytest.raises(CheckpointError, match="HEAD check"), checked.create("commits/1.commit") as out:
        out.write(b"two")
    assert checked.read_bytes("commits/1.commit") == b"one"


def test_flat_listing_refuses_keys_out_of_order(s3rver_bucket: str, raw: Any) -> None:
    _fill(raw, s3rver_bucket, TREE)
    flat = S3FileManager(f"s3://{s3rver_bucket}/root", listing="flat", list_page_size=1000)
    with pytest.raises(CheckpointError, match=r"binary key order.*STATEKEEPER_S3_LISTING=unordered"):
        list(flat.list())


def test_unordered_listing_sorts_and_filters(s3rver_bucket: str, raw: Any) -> None:
    _fill(raw, s3rver_bucket, TREE)
    fm = S3FileManager(f"s3://{s3rver_bucket}/root", listing="unordered")
    assert [i.path for i in fm.list()] == sorted(TREE)
    assert [i.path for i in fm.list("a")] == sorted(k for k in TREE if k.startswith("a"))
    assert [i.path for i in fm.list(start_after="a/b/c")] == [k for k in sorted(TREE) if k > "a/b/c"]
    assert [i.path for i in fm.list("a/", start_after="a/b/c2/deep/file")] == ["a/bb"]


def test_unordered_listing_refuses_more_than_one_page(
    s3rver_bucket: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that cannot be paged through is never half-listed (the page limit is lowered to 5 keys)."""
    monkeypatch.setattr(listing_module, "UNORDERED_LIMIT", 5)
    _fill(raw, s3rver_bucket, TREE)
    fm = S3FileManager(f"s3://{s3rver_bucket}/root", listing="unordered")
    with pytest.raises(CheckpointError, match="more than 5 keys"):
        list(fm.list())
    assert [i.path for i in fm.list("a/")] == ["a/b/c", "a/b/c2/deep/file", "a/bb"]


def test_no_multipart_upload_listing_or_abort(s3rver_bucket: str, raw: Any, caplog: pytest.LogCaptureFixture) -> None:
    """s3rver has no ListMultipartUploads and refuses AbortMultipartUpload: listed as none, never visible."""
    fm = S3FileManager(f"s3://{s3rver_bucket}/root", multipart_threshold=MIN_PART_SIZE)
    caplog.set_level(logging.WARNING, logger="statekeeper.store")
    out = fm.create("big")
    out.write(b"x" * (MIN_PART_SIZE + 10))  # a multipart upload with a part in flight
    out.cancel()
    assert list(fm.list_incomplete_uploads()) == []
    assert "does not implement ListMultipartUploads (NotImplemented)" in caplog.text
    assert all_keys(raw, s3rver_bucket) == {}
    with fm.create("big") as out:
        out.write(b"y" * (2 * MIN_PART_SIZE + 3))
    assert fm.info("big").size == 2 * MIN_PART_SIZE + 3
    assert fm.read_bytes("big") == b"y" * (2 * MIN_PART_SIZE + 3)


def test_objects_not_yet_published_are_invisible(s3rver_bucket: str, raw: Any) -> None:
    """s3rver shows an object while its upload is written and adds its metadata last: with
    `verify_published` an object without statekeeper's write id is not there yet (here: put without it)."""
    _fill(raw, s3rver_bucket, ["done"])
    raw.put_object(Bucket=s3rver_bucket, Key="root/in-flight", Body=b"")
    fm = S3FileManager(f"s3://{s3rver_bucket}/root")  # the fixture's environment: verify_published
    assert [i.path for i in fm.list()] == ["done"]
    assert not fm.exists("in-flight")
    with pytest.raises(CheckpointFileNotFoundError):
        fm.read_bytes("in-flight")
    trusting = S3FileManager(f"s3://{s3rver_bucket}/root", verify_published=False)
    assert [i.path for i in trusting.list()] == ["done", "in-flight"]
