"""Atomic publish on S3: one PutObject for a small file, a streamed multipart upload for a large one.

S3 has no rename, so the upload itself is the publish (DESIGN invariant 1). A file up to the
multipart threshold is buffered and sent in one PutObject when the output closes; a larger one is
streamed as a multipart upload (at most two parts in memory: one buffered, one in flight) that
becomes visible only on CompleteMultipartUpload and is aborted on any error or cancel.

Exclusive creates send `If-None-Match: *`, so S3 itself refuses to replace a name (invariant 2).
Every object carries a random write id in its metadata: when a conditional write reports a conflict
after botocore retried it (the first attempt succeeded but its response was lost), a HEAD tells our
own write apart from somebody else's and the publish succeeds instead of failing spuriously.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import botocore.exceptions as bce

from statekeeper.store.errors import CheckpointError
from statekeeper.store.faults import reached as fault_point
from statekeeper.store.files.base import PublishOnExit, overwrite_refused
from statekeeper.store.files.s3.capabilities import require_conditional_writes
from statekeeper.store.files.s3.client import shared_upload_pool
from statekeeper.store.files.s3.errors import error_code, is_conflict
from statekeeper.store.files.s3.options import MAX_PART_SIZE, MAX_PARTS, MiB
from statekeeper.store.files.s3.root import WRITE_ID_META, S3Root

if TYPE_CHECKING:
    from types_boto3_s3.type_defs import CompletedPartTypeDef

log = logging.getLogger(__name__)


class S3Output(PublishOnExit):
    """Atomic output: one PUT for small files, a streamed multipart upload for large ones."""

    def __init__(self, root: S3Root, path: str, exclusive: bool) -> None:
        self.path = path
        self._root = root
        self._key = root.key(path)
        self._exclusive = exclusive
        self._write_id = uuid.uuid4().hex
        self._buf = bytearray()
        self._size = 0
        self._upload_id: str | None = None
        self._parts: list[CompletedPartTypeDef] = []
        self._pending: Future[CompletedPartTypeDef] | None = None
        self._state = "open"  # open -> closed | cancelled | failed

    @property
    def size(self) -> int:
        return self._size

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._state != "open":
            raise CheckpointError(f"write after {self._state}", self._root.uri_of(self.path))
        mv = memoryview(data).cast("B")
        n, off = len(mv), 0
        try:
            while off < n:
                limit = self._root.options.multipart_threshold + 1 if self._upload_id is None else self._part_target()
                take = min(n - off, limit - len(self._buf))
                self._buf += mv[off : off + take]
                off += take
                if len(self._buf) >= limit:
                    if self._upload_id is None:
                        self._begin_multipart()
                    while len(self._buf) >= self._part_target():
                        self._send_part(self._part_target())
        except BaseException:
            self._state = "failed"
            raise
        self._size += n
        return n

    def _part_target(self) -> int:
        """Part size for the next part; grows every 1000 parts so 10,000 parts hold > 400 GiB."""
        number = len(self._parts) + (self._pending is not None) + 1
        return min(MAX_PART_SIZE, self._root.options.multipart_part_size * (1 + (number - 1) // 1000))

    def _begin_multipart(self) -> None:
        with self._root.errors("CreateMultipartUpload", self.path):
            resp = self._root.client.create_multipart_upload(
                Bucket=self._root.bucket,
                Key=self._key,
                Metadata={WRITE_ID_META: self._write_id},
                ChecksumAlgorithm="CRC32",
            )
        self._upload_id = resp["UploadId"]
        log.debug("started multipart upload of %s", self._root.uri_of(self.path))

    def _send_part(self, size: int) -> None:
        """Hand one part to the upload pool, first waiting for the previous one (two parts in memory)."""
        self._wait_pending()
        number = len(self._parts) + 1
        if number > MAX_PARTS:
            raise CheckpointError(f"file exceeds {MAX_PARTS} multipart parts", self._root.uri_of(self.path))
        chunk = bytes(self._buf[:size])
        del self._buf[:size]
        self._pending = shared_upload_pool().submit(self._upload_part, number, chunk)

    def _upload_part(self, number: int, chunk: bytes) -> CompletedPartTypeDef:
        assert self._upload_id is not None
        fault_point("s3.part", self.path)
        with self._root.errors("UploadPart", self.path):
            resp = self._root.client.upload_part(
                Bucket=self._root.bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=chunk,
                ChecksumAlgorithm="CRC32",
            )
        part: CompletedPartTypeDef = {"PartNumber": number, "ETag": resp["ETag"]}
        if resp.get("ChecksumCRC32"):
            part["ChecksumCRC32"] = resp["ChecksumCRC32"]
        return part

    def _wait_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._parts.append(pending.result())

    def close(self) -> None:
        """Publish: the single PUT, or the last part and CompleteMultipartUpload."""
        if self._state == "closed":
            return
        if self._state != "open":
            self._abort()  # a failed write may have left a multipart upload behind
            raise CheckpointError(f"close after {self._state}", self._root.uri_of(self.path))
        try:
            if self._exclusive:
                require_conditional_writes(self._root)
            if self._exclusive and self._root.options.head_before_create and self._taken():
                raise overwrite_refused(self._root.uri_of(self.path), "HEAD check")
            if self._upload_id is None:
                self._put_single()
            else:
                if self._buf or (not self._parts and self._pending is None):
                    self._send_part(len(self._buf))
                self._wait_pending()
                self._complete()
        except BaseException:
            self._state = "failed"
            self._abort()
            raise
        self._state = "closed"
        self._buf = bytearray()

    def _taken(self) -> bool:
        return self._root.head(self._key, self.path) is not None

    def _condition(self) -> dict[str, Any]:
        """The precondition of the publishing request: an exclusive create refuses an existing key."""
        return {"IfNoneMatch": "*"} if self._exclusive else {}

    def _put_single(self) -> None:
        root = self._root
        fault_point("s3.put", self.path)
        try:
            root.client.put_object(
                Bucket=root.bucket,
                Key=self._key,
                Body=bytes(self._buf),
                Metadata={WRITE_ID_META: self._write_id},
                ChecksumAlgorithm="CRC32",
                **self._condition(),
            )
        except bce.ClientError as e:
            self._conflict_or_raise(e, "PutObject")
        except bce.BotoCoreError as e:
            raise root.translate(e, "PutObject", self.path) from e

    def _complete(self) -> None:
        root = self._root
        assert self._upload_id is not None
        fault_point("s3.complete", self.path)
        try:
            root.client.complete_multipart_upload(
                Bucket=root.bucket,
                Key=self._key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
                **self._condition(),
            )
        except bce.ClientError as e:
            if error_code(e)[0] == "NoSuchUpload" and root.written_by(self._key, self._write_id):
                self._upload_id = None  # a retried Complete of our own completed upload
                return
            self._conflict_or_raise(e, "CompleteMultipartUpload")
        except bce.BotoCoreError as e:
            raise root.translate(e, "CompleteMultipartUpload", self.path) from e
        self._upload_id = None
        log.debug("completed multipart upload of %s (%d parts)", root.uri_of(self.path), len(self._parts))

    def _conflict_or_raise(self, e: bce.ClientError, op: str) -> None:
        """412/409 on a conditional write: our own earlier attempt (retried) succeeds, anything else refuses."""
        if self._exclusive and is_conflict(e):
            if self._root.written_by(self._key, self._write_id):
                log.debug("%s of %s: conflict with our own retried write; done", op, self._root.uri_of(self.path))
                self._upload_id = None
                return
            raise overwrite_refused(self._root.uri_of(self.path)) from None
        raise self._root.translate(e, op, self.path) from e

    def _abort(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            with contextlib.suppress(BaseException):
                pending.result()
        self._buf = bytearray()
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            try:
                self._root.client.abort_multipart_upload(Bucket=self._root.bucket, Key=self._key, UploadId=upload_id)
                log.debug("aborted multipart upload of %s", self._root.uri_of(self.path))
            except Exception as e:  # the original error matters more; maintenance reaps the upload later
                log.warning(
                    "could not abort multipart upload %s of %s (%s); list_incomplete_uploads() finds it",
                    upload_id,
                    self._root.uri_of(self.path),
                    type(e).__name__,
                )

    def cancel(self) -> None:
        """Discard everything: drop the buffer and abort the multipart upload if one was started."""
        if self._state in ("closed", "cancelled"):
            return
        self._state = "cancelled"
        self._abort()


def put_file(root: S3Root, local_path: str, path: str, *, exclusive: bool) -> int:
    """Stream a local file through an `S3Output`: one PUT when small, else multipart with bounded memory."""
    out = S3Output(root, path, exclusive)
    with out, open(local_path, "rb") as src:
        chunk = max(MiB, min(root.options.multipart_part_size, 8 * MiB))
        while data := src.read(chunk):
            out.write(data)
    return out.size
