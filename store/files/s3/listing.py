"""Listing an S3 checkpoint root: its objects (ListObjectsV2) and its incomplete multipart uploads.

Both go through botocore's paginators, which follow continuation tokens / key markers until the
last page (never assuming one page), with `PageSize` = `list_page_size` (STATEKEEPER_S3_LIST_PAGE_SIZE;
the tests force many pages with a small value). Each page request is retried by botocore; a failure
that remains is raised naming the root and the operation.

The contract wants keys in binary order, and S3 lists them so. A store that does not (s3rver walks
its directory tree, and its continuation token resumes after the last key returned, so paging can
skip keys) is listed with `listing="unordered"`: one request of up to 1000 keys, sorted here, and a
prefix holding more is refused rather than listed partially. In the default flat mode a key that
arrives out of order is refused naming the setting, rather than trusted. A store that does not implement
ListMultipartUploads (s3rver) has no incomplete uploads to show: that listing is empty, with a warning.
With `verify_published` (a store that shows objects while they upload), each listed key is HEADed and
kept only once its write-id metadata shows the publish finished.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import botocore.exceptions as bce

from statekeeper.store.errors import CheckpointError
from statekeeper.store.faults import reached as fault_point
from statekeeper.store.files.base import FileInfo
from statekeeper.store.files.s3.errors import error_code
from statekeeper.store.files.s3.root import S3Root

log = logging.getLogger(__name__)

UNORDERED_LIMIT = 1000
"""Keys one listing request returns at most: all a store listed with listing="unordered" may hold per prefix."""
UNSUPPORTED_CODES = frozenset({"NotImplemented", "MethodNotAllowed"})
"""Error codes of a store that lacks an operation altogether (s3rver: ListMultipartUploads)."""


@dataclass(frozen=True, slots=True)
class IncompleteUpload:
    """A multipart upload that was started and neither completed nor aborted (in flight or abandoned)."""

    path: str
    upload_id: str
    initiated: float
    """Start time (epoch seconds) as the store reports it; moto reports a fixed date in 2010."""


def _pages(root: S3Root, op: str, prefix: str, pages: Iterable[Any]) -> Iterator[Any]:
    """The pages of a paginator; each page's request runs lazily, so its failure is translated here."""
    it = iter(pages)
    while True:
        with root.errors(op, prefix or None):
            page = next(it, None)
        if page is None:
            return
        yield page


def list_objects(root: S3Root, prefix: str, start_after: str | None) -> Iterator[FileInfo]:
    """Objects whose path starts with `prefix`, after `start_after`, in binary (lexicographic) key order."""
    fault_point("s3.list", prefix)
    key_start_after = None if start_after is None else root.key_prefix + start_after
    if root.options.listing == "unordered":
        infos = _list_unordered(root, root.key_prefix + prefix, key_start_after)
    else:
        infos = _list_flat(root, root.key_prefix + prefix, key_start_after)
    strip = len(root.key_prefix)
    for key, listed_size, mtime in infos:
        size = listed_size
        if root.options.verify_published:
            head = root.head(key, key[strip:])
            if head is None:
                continue  # still being written (or gone since): not published yet
            size = int(head["ContentLength"])  # the listing may have caught it mid-write
        yield FileInfo(key[strip:], size, mtime)


_Entry = tuple[str, int, float]
"""(key, size, modified epoch seconds) of one listed object."""


def _paginate(root: S3Root, key_prefix: str, start_after: str | None) -> Iterator[Any]:
    kwargs: dict[str, Any] = {"Bucket": root.bucket, "Prefix": key_prefix}
    if start_after is not None:
        kwargs["StartAfter"] = start_after
    paginator = root.client.get_paginator("list_objects_v2")
    pages = paginator.paginate(**kwargs, PaginationConfig={"PageSize": root.options.list_page_size})
    yield from _pages(root, "ListObjectsV2", key_prefix[len(root.key_prefix) :], pages)


def _entries(root: S3Root, page: Any) -> Iterator[_Entry]:
    for obj in page.get("Contents", []):
        key = obj["Key"]
        if len(key) > len(root.key_prefix) and not key.endswith("/"):  # skip "directory" marker objects
            yield key, int(obj.get("Size", 0)), obj["LastModified"].timestamp()


def _list_flat(root: S3Root, key_prefix: str, start_after: str | None) -> Iterator[_Entry]:
    """One paginated walk, checked to come in order: a store that lists otherwise may also skip keys."""
    last = start_after or ""
    for page in _paginate(root, key_prefix, start_after):
        for entry in _entries(root, page):
            if entry[0] <= last:
                raise CheckpointError(
                    f"S3 listed key {entry[0]!r} after {last!r}: this store does not list in binary key order "
                    "(and may skip keys across pages); set the S3 option listing='unordered' "
                    f"(STATEKEEPER_S3_LISTING=unordered; at most {UNORDERED_LIMIT} keys per prefix, docs/s3.md)",
                    root.uri_of(key_prefix[len(root.key_prefix) :]),
                )
            last = entry[0]
            yield entry


def _list_unordered(root: S3Root, key_prefix: str, start_after: str | None) -> Iterator[_Entry]:
    """One page of up to 1000 keys, sorted here; a prefix holding more is refused, never half-listed."""
    kwargs: dict[str, Any] = {"Bucket": root.bucket, "Prefix": key_prefix, "MaxKeys": UNORDERED_LIMIT}
    if start_after is not None:
        kwargs["StartAfter"] = start_after
    with root.errors("ListObjectsV2", key_prefix[len(root.key_prefix) :] or None):
        page = root.client.list_objects_v2(**kwargs)
    if page.get("IsTruncated"):
        raise CheckpointError(
            f"more than {UNORDERED_LIMIT} keys under this prefix on a store listed with listing='unordered': "
            "such a store cannot be paged through without skipping keys (docs/s3.md); use a store that "
            "lists in binary key order",
            root.uri_of(key_prefix[len(root.key_prefix) :]),
        )
    entries = [e for e in _entries(root, page) if start_after is None or e[0] > start_after]
    entries.sort(key=lambda e: e[0])
    yield from entries


def list_uploads(root: S3Root, prefix: str) -> Iterator[IncompleteUpload]:
    """Multipart uploads started under `prefix` and neither completed nor aborted."""
    paginator = root.client.get_paginator("list_multipart_uploads")
    pages = paginator.paginate(
        Bucket=root.bucket,
        Prefix=root.key_prefix + prefix,
        PaginationConfig={"PageSize": root.options.list_page_size},
    )
    strip = len(root.key_prefix)
    it = iter(pages)
    while True:
        try:
            page = next(it, None)
        except bce.ClientError as e:
            if error_code(e)[0] not in UNSUPPORTED_CODES:
                raise root.translate(e, "ListMultipartUploads", prefix or None) from e
            log.warning(
                "the S3 store at %s does not implement ListMultipartUploads (%s): no incomplete uploads "
                "listed under %s",
                root.client.meta.endpoint_url,
                error_code(e)[0],
                root.uri_of(prefix) if prefix else root.root_uri,
            )
            return
        except bce.BotoCoreError as e:
            raise root.translate(e, "ListMultipartUploads", prefix or None) from e
        if page is None:
            return
        for up in page.get("Uploads", []):
            yield IncompleteUpload(up["Key"][strip:], up["UploadId"], up["Initiated"].timestamp())
