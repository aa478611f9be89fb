"""`S3FileManager`: the checkpoint file manager contract (`store/files/base.py`) on S3.

It composes the parts of this package: an `S3Root` (bucket, prefix, shared client, error
translation) and the upload, download, listing and deletion functions that work on it. It holds no
logic of its own beyond routing and the S3-only checks (`check`, `probe_conditional_writes`).
Managers are cheap to make and pickle without their client, so Spark can ship them to executors.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from statekeeper.store.files.base import DeleteResult, FileInfo, file_not_found
from statekeeper.store.files.paths import validate_listing, validate_prefix
from statekeeper.store.files.s3.capabilities import probe_conditional_writes
from statekeeper.store.files.s3.deletion import abort_upload, delete_objects
from statekeeper.store.files.s3.download import S3Reader, download
from statekeeper.store.files.s3.listing import IncompleteUpload, list_objects, list_uploads
from statekeeper.store.files.s3.root import S3Root
from statekeeper.store.files.s3.upload import S3Output, put_file

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client


class S3FileManager:
    """Checkpoint files under `s3://bucket/prefix`; thread-safe and cheap to make (clients are shared)."""

    def __init__(self, root_uri: str, **options: Any) -> None:
        self._attach(S3Root(root_uri, options))

    def _attach(self, root: S3Root) -> None:
        self._root = root
        self.bucket = root.bucket
        self.prefix = root.prefix
        """The key prefix of the root inside its bucket, without a trailing '/' ("" for the bucket)."""
        self.key_prefix = root.key_prefix
        """What every key under the root starts with: `prefix/`, or "" for a whole bucket."""
        self.options = root.options

    # -- where, and with what -------------------------------------------------------------------
    @property
    def root_uri(self) -> str:
        return self._root.root_uri

    @property
    def client(self) -> S3Client:
        """The boto3 client, looked up on first use (so a manager can be pickled to executors)."""
        return self._root.client

    def uri_of(self, path: str) -> str:
        return self._root.uri_of(path)

    def __getstate__(self) -> dict[str, Any]:
        return {"root_uri": self.root_uri, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._attach(S3Root(state["root_uri"], state["options"]))

    def with_options(self, **options: Any) -> S3FileManager:
        """A manager on the same root with some settings changed (tests, tools)."""
        new_options = replace(self.options, **options)
        new_options.validate()
        new = S3FileManager.__new__(S3FileManager)
        new.__setstate__({"root_uri": self.root_uri, "options": new_options})
        return new

    # -- CheckpointFileManager ------------------------------------------------------------------
    def create(self, path: str, *, exclusive: bool = True) -> S3Output:
        return S3Output(self._root, path, exclusive)

    def put_file(self, local_path: str, path: str, *, exclusive: bool = True) -> int:
        """Stream a local file through `create`: one PUT when small, else multipart with bounded memory."""
        return put_file(self._root, local_path, path, exclusive=exclusive)

    def open(self, path: str) -> BinaryIO:
        """A streaming, non-seekable reader (the store downloads to disk when it needs to seek)."""
        return cast(BinaryIO, io.BufferedReader(S3Reader(self._root, path), buffer_size=256 * 1024))

    def read_bytes(self, path: str) -> bytes:
        with S3Reader(self._root, path) as raw:
            return raw.readall()

    def download(self, path: str, local_path: str) -> int:
        """Streamed GET into `local_path`; a failed download leaves no partial local file."""
        return download(self._root, path, local_path)

    def exists(self, path: str) -> bool:
        return self._root.head(self._root.key(path), path) is not None

    def info(self, path: str) -> FileInfo:
        head = self._root.head(self._root.key(path), path)
        if head is None:
            raise file_not_found(self.uri_of(path))
        return FileInfo(path, int(head["ContentLength"]), head["LastModified"].timestamp())

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[FileInfo]:
        """ListObjectsV2 page by page (never assuming one page); S3 order is the lexicographic one."""
        validate_listing(prefix, start_after)
        return list_objects(self._root, prefix, start_after)

    def delete_many(self, paths: Iterable[str]) -> DeleteResult:
        """DeleteObjects in batches of <= 1000 keys on a bounded pool; throttled keys are retried.

        Every path is validated before anything is deleted, so bad input deletes nothing.
        """
        return delete_objects(self._root, paths)

    # -- S3 only --------------------------------------------------------------------------------
    def check(self) -> None:
        """Fail fast with a clear error if the bucket is missing, unreachable or not listable."""
        root = self._root
        root.verify_bucket()
        with root.errors("ListObjectsV2", None):
            root.client.list_objects_v2(Bucket=root.bucket, Prefix=root.key_prefix, MaxKeys=1)

    def probe_conditional_writes(self) -> bool:
        """Whether the store honours `If-None-Match: *` (two conditional PUTs of a probe object).

        Writes and deletes one object `_statekeeper_probe_<random>` under the root.
        """
        return probe_conditional_writes(self._root)

    def list_incomplete_uploads(self, prefix: str = "") -> Iterator[IncompleteUpload]:
        """Multipart uploads started under `prefix` and not completed or aborted (paginated).

        Some are writes still in flight: maintenance aborts only those older than its grace period.
        """
        validate_prefix(prefix)
        return list_uploads(self._root, prefix)

    def abort_incomplete_upload(self, path: str, upload_id: str) -> bool:
        """Abort one multipart upload; False if it was already gone (completed or aborted)."""
        return abort_upload(self._root, path, upload_id)


__all__ = ["S3FileManager"]
