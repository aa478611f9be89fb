"""Reading S3 checkpoint files: a streamed GetObject that resumes where a broken connection left off.

botocore retries a request until its response headers arrive, but a body that breaks off mid-stream
is past its reach: the reader here resumes it with a ranged GET pinned to the object's ETag
(`If-Match`), so a long read does not restart from byte 0 and can never splice two versions of an
object. That is the one hand-written retry loop of the read path.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from collections.abc import Iterator
from typing import Any, cast

import botocore.exceptions as bce

from statekeeper.store.errors import CheckpointError, CorruptFileError
from statekeeper.store.files.base import file_not_found
from statekeeper.store.files.s3.errors import STREAM_ERRORS, backoff, error_code
from statekeeper.store.files.s3.options import MiB
from statekeeper.store.files.s3.root import S3Root
from statekeeper.store.formats.limits import MAX_WHOLE_FILE

log = logging.getLogger(__name__)


class S3Reader(io.RawIOBase):
    """A streamed GET that resumes with a ranged GET (pinned by ETag) when the connection breaks."""

    def __init__(self, root: S3Root, path: str) -> None:
        super().__init__()
        self._root = root
        self._path = path
        self._key = root.key(path)
        self._pos = 0
        self._resumes = 0
        self._body: Any = None
        self._etag = ""
        self.size = 0
        self._get(first=True)

    def _get(self, *, first: bool) -> None:
        root = self._root
        with root.errors("GetObject", self._path):
            if first:
                resp = root.client.get_object(Bucket=root.bucket, Key=self._key)
                if not root.published(resp):
                    resp["Body"].close()
                    raise file_not_found(root.uri_of(self._path))
                self.size = int(resp["ContentLength"])
                self._etag = resp.get("ETag", "")
            else:
                resp = root.client.get_object(
                    Bucket=root.bucket, Key=self._key, Range=f"bytes={self._pos}-", IfMatch=self._etag
                )
        self._body = resp["Body"]

    def readable(self) -> bool:
        return True

    def _read_some(self, n: int) -> bytes:
        while True:
            if self._pos >= self.size:
                return b""
            try:
                data = cast(bytes, self._body.read(n))
                if not data:
                    raise bce.IncompleteReadError(actual_bytes=self._pos, expected_bytes=self.size)
            except bce.FlexibleChecksumError as e:
                raise CheckpointError(f"S3 checksum mismatch while reading ({e})", self._root.uri_of(self._path)) from e
            except STREAM_ERRORS as e:
                self._resume(e)
                continue
            self._pos += len(data)
            return data

    def _resume(self, cause: BaseException) -> None:
        self._resumes += 1
        if self._resumes > self._root.options.max_attempts:
            raise CheckpointError(
                f"S3 read broke off at byte {self._pos} of {self.size} {self._resumes - 1} times "
                f"({type(cause).__name__})",
                self._root.uri_of(self._path),
            ) from cause
        log.debug("resuming read of %s at byte %d after %s", self._root.uri_of(self._path), self._pos, cause)
        with contextlib.suppress(Exception):
            self._body.close()
        time.sleep(backoff(self._resumes - 1))
        try:
            self._get(first=False)
        except CheckpointError as e:
            if isinstance(e.__cause__, bce.ClientError) and error_code(e.__cause__)[0] == "PreconditionFailed":
                raise CheckpointError(
                    "S3 object changed while being read", self._root.uri_of(self._path)
                ) from e.__cause__
            raise

    def readinto(self, buffer: Any) -> int:
        mv = memoryview(buffer).cast("B")
        data = self._read_some(len(mv))
        mv[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        """The whole object; one larger than `MAX_WHOLE_FILE` (no file read whole is) is refused unread."""
        if self.size - self._pos > MAX_WHOLE_FILE:
            raise CorruptFileError(
                f"file has {self.size} bytes, above the {MAX_WHOLE_FILE}-byte limit of a file read whole",
                self._root.uri_of(self._path),
            )
        out = bytearray()
        while chunk := self._read_some(MiB):
            out += chunk
        return bytes(out)

    def iter_chunks(self, size: int = MiB) -> Iterator[bytes]:
        while chunk := self._read_some(size):
            yield chunk

    def close(self) -> None:
        if not self.closed and self._body is not None:
            with contextlib.suppress(Exception):
                self._body.close()
        super().close()


def download(root: S3Root, path: str, local_path: str) -> int:
    """Streamed GET into `local_path`; a failed download leaves no partial local file."""
    size = 0
    with S3Reader(root, path) as raw:
        try:
            with open(local_path, "wb") as dst:
                for chunk in raw.iter_chunks():
                    dst.write(chunk)
                    size += len(chunk)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local_path)
            raise
    return size
