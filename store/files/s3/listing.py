"""Listing an S3 checkpoint root: its objects (ListObjectsV2) and its incomplete multipart uploads.

Both go through botocore's paginators, which follow continuation tokens / key markers until the
last page (never assuming one page), with `PageSize` = `list_page_size` (STATEKEEPER_S3_LIST_PAGE_SIZE;
the tests force many pages with a small value). Each page request is retried by botocore; a failure
that remains is raised naming the root and the operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from statekeeper.store.faults import reached as fault_point
from statekeeper.store.files.base import FileInfo
from statekeeper.store.files.s3.root import S3Root


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
    """Objects whose path starts with `prefix`, after `start_after`, in S3's (lexicographic) order."""
    fault_point("s3.list", prefix)
    kwargs: dict[str, Any] = {"Bucket": root.bucket, "Prefix": root.key_prefix + prefix}
    if start_after is not None:
        kwargs["StartAfter"] = root.key_prefix + start_after
    paginator = root.client.get_paginator("list_objects_v2")
    pages = paginator.paginate(**kwargs, PaginationConfig={"PageSize": root.options.list_page_size})
    strip = len(root.key_prefix)
    for page in _pages(root, "ListObjectsV2", prefix, pages):
        for obj in page.get("Contents", []):
            rel = obj["Key"][strip:]
            if rel and not rel.endswith("/"):  # skip "directory" marker objects
                yield FileInfo(rel, int(obj.get("Size", 0)), obj["LastModified"].timestamp())


def list_uploads(root: S3Root, prefix: str) -> Iterator[IncompleteUpload]:
    """Multipart uploads started under `prefix` and neither completed nor aborted."""
    paginator = root.client.get_paginator("list_multipart_uploads")
    pages = paginator.paginate(
        Bucket=root.bucket,
        Prefix=root.key_prefix + prefix,
        PaginationConfig={"PageSize": root.options.list_page_size},
    )
    strip = len(root.key_prefix)
    for page in _pages(root, "ListMultipartUploads", prefix, pages):
        for up in page.get("Uploads", []):
            yield IncompleteUpload(up["Key"][strip:], up["UploadId"], up["Initiated"].timestamp())
