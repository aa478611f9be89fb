"""Checkpoint files in S3 or any S3-compatible store (`s3://bucket/prefix`, also `s3a://`).

S3 has no rename, so atomic publish is the PUT itself: a file up to the multipart threshold is sent
in one PutObject when the output closes; a larger one is streamed as a multipart upload (at most two
parts in memory) that becomes visible only on CompleteMultipartUpload and is aborted on any error or
cancel. Exclusive creates send `If-None-Match: *`, so S3 itself refuses to replace a name.

Every object carries a random write id in its metadata: when a conditional write reports a conflict
after a retry (the first attempt succeeded but its response was lost), a HEAD tells our own write
apart from somebody else's and the create succeeds instead of failing spuriously.

Configuration (keyword options, else `STATEKEEPER_S3_*` environment variables) is described in
docs/s3.md. Credentials come only from the standard boto3 chain and are never logged.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import logging
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, fields, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, cast
from urllib.parse import urlparse

import boto3
import botocore.exceptions as bce
import urllib3.exceptions
from botocore.config import Config

from store.errors import (
    CheckpointError,
    CheckpointFileExistsError,
    CheckpointFileNotFoundError,
    ConfigurationError,
)
from store.files.base import DeleteResult, FileInfo
from store.files.paths import validate_component, validate_prefix, validate_relative_path

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client
    from types_boto3_s3.type_defs import CompletedPartTypeDef

log = logging.getLogger(__name__)

MiB = 1 << 20
MIN_PART_SIZE = 5 * MiB
"""S3's minimum size of every part but the last."""
MAX_PART_SIZE = 5 * 1024 * MiB
MAX_PARTS = 10_000
MAX_DELETE_BATCH = 1000
"""DeleteObjects takes at most this many keys per request."""
WRITE_ID_META = "statekeeper-write-id"
ENV_PREFIX = "STATEKEEPER_S3_"

_EXISTS_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_DENIED_CODES = frozenset(
    {"AccessDenied", "403", "AllAccessDisabled", "AccountProblem", "InvalidAccessKeyId", "SignatureDoesNotMatch"}
)
_CREDENTIAL_CODES = frozenset({"ExpiredToken", "InvalidToken", "TokenRefreshRequired", "InvalidAccessKeyId"})
_RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "OperationAborted",
        "500",
        "502",
        "503",
        "504",
    }
)
_STREAM_ERRORS: tuple[type[BaseException], ...] = (
    bce.ResponseStreamingError,
    bce.IncompleteReadError,
    bce.ReadTimeoutError,
    bce.ConnectionClosedError,
    bce.EndpointConnectionError,
    bce.ConnectTimeoutError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


# -- configuration -------------------------------------------------------------------------------


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


@dataclass(frozen=True, slots=True)
class S3Options:
    """Settings of one S3 checkpoint root; see docs/s3.md for each and its environment variable."""

    endpoint_url: str | None = None
    """S3-compatible endpoint (MinIO, Ceph, moto...); None lets botocore pick AWS (or AWS_ENDPOINT_URL_S3)."""
    region_name: str | None = None
    addressing_style: str | None = None
    """path | virtual | auto; default path with a custom endpoint (IP hosts have no bucket subdomains), else auto."""
    retry_mode: str = "standard"
    """botocore retry mode for every request: standard or adaptive (client-side rate limiting)."""
    max_attempts: int = 8
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    multipart_threshold: int = 8 * MiB
    """Files up to this size are buffered and sent in one PUT; larger ones go multipart."""
    multipart_part_size: int = 8 * MiB
    max_pool_connections: int = 16
    """HTTP connections botocore keeps; also the size of the part-upload thread pool."""
    delete_parallelism: int = 8
    """DeleteObjects requests in flight at once in `delete_many`."""
    delete_batch_size: int = MAX_DELETE_BATCH
    delete_retries: int = 8
    """Extra rounds for keys a DeleteObjects answer reports as throttled (SlowDown, 503...)."""
    list_page_size: int = 1000
    """MaxKeys of each listing request (tests force pagination with a small value)."""
    head_before_create: bool = False
    """Also HEAD before an exclusive PUT, for stores that ignore If-None-Match (racy; docs/s3.md)."""

    # environment variables read for a field, in order, after the STATEKEEPER_S3_<FIELD> one
    _ENV_ALIASES = {
        "region_name": ("STATEKEEPER_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"),
        "retry_mode": ("AWS_RETRY_MODE",),
        "max_attempts": ("AWS_MAX_ATTEMPTS",),
    }

    @classmethod
    def env_names(cls, name: str) -> tuple[str, ...]:
        return (f"{ENV_PREFIX}{name.upper()}", *cls._ENV_ALIASES.get(name, ()))

    @classmethod
    def resolve(cls, options: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> S3Options:
        """Keyword options override environment variables, which override the defaults."""
        environ = os.environ if environ is None else environ
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigurationError(f"unknown S3 option(s) {unknown}; valid options: {sorted(known)}")
        values: dict[str, Any] = {}
        for name, f in known.items():
            if name in options and options[name] is not None:
                values[name] = cls._coerce(name, f.type, options[name], f"option {name!r}")
                continue
            for env in cls.env_names(name):
                raw = environ.get(env)
                if raw is not None and raw.strip() != "":
                    values[name] = cls._coerce(name, f.type, raw, f"environment variable {env}")
                    break
        opts = cls(**values)
        opts.validate()
        return opts

    @staticmethod
    def _coerce(name: str, type_name: Any, value: Any, source: str) -> Any:
        kind = str(type_name).replace(" | None", "")
        try:
            if kind == "bool":
                return value if isinstance(value, bool) else _parse_bool(str(value))
            if kind == "int":
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError(f"expected an integer, got {value!r}")
                return int(value)
            if kind == "float":
                if isinstance(value, bool):
                    raise ValueError(f"expected a number, got {value!r}")
                return float(value)
            if not isinstance(value, str):
                raise ValueError(f"expected a string, got {type(value).__name__}")
            return value.strip()
        except ValueError as e:
            raise ConfigurationError(f"invalid S3 setting {name} from {source}: {e}") from None

    def validate(self) -> None:
        def bad(name: str, why: str) -> NoReturn:
            raise ConfigurationError(f"invalid S3 setting {name}={getattr(self, name)!r}: {why}")

        if self.endpoint_url is not None:
            parsed = urlparse(self.endpoint_url)
            if "@" in parsed.netloc:
                raise ConfigurationError(
                    "invalid S3 setting endpoint_url: it embeds credentials (user:secret@host); "
                    "pass credentials through the boto3 credential chain instead"
                )
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                bad("endpoint_url", "expected http(s)://host[:port]")
        if self.addressing_style not in (None, "path", "virtual", "auto"):
            bad("addressing_style", "expected path, virtual or auto")
        if self.retry_mode not in ("standard", "adaptive"):
            bad("retry_mode", "expected standard or adaptive")
        if not 1 <= self.max_attempts <= 100:
            bad("max_attempts", "expected 1..100")
        if not self.connect_timeout > 0 or not self.read_timeout > 0:
            bad("connect_timeout" if not self.connect_timeout > 0 else "read_timeout", "expected seconds > 0")
        if not MIN_PART_SIZE <= self.multipart_part_size <= MAX_PART_SIZE:
            bad("multipart_part_size", f"S3 parts must be {MIN_PART_SIZE} to {MAX_PART_SIZE} bytes")
        if not 1 <= self.multipart_threshold <= MAX_PART_SIZE:
            bad("multipart_threshold", f"expected 1 to {MAX_PART_SIZE} bytes (the largest single PUT)")
        if self.max_pool_connections < 1:
            bad("max_pool_connections", "expected >= 1")
        if not 1 <= self.delete_parallelism <= self.max_pool_connections:
            bad("delete_parallelism", f"expected 1..max_pool_connections ({self.max_pool_connections})")
        if not 1 <= self.delete_batch_size <= MAX_DELETE_BATCH:
            bad("delete_batch_size", f"DeleteObjects takes 1..{MAX_DELETE_BATCH} keys")
        if not 0 <= self.delete_retries <= 100:
            bad("delete_retries", "expected 0..100")
        if not 1 <= self.list_page_size <= 1000:
            bad("list_page_size", "expected 1..1000 keys per page")


def _redact(uri: str) -> str:
    """A URI with any user-info replaced, so an embedded secret never reaches a message."""
    return re.sub(r"^([A-Za-z0-9+.-]+://)[^/@]*@", r"\1***@", uri)


def parse_s3_uri(root_uri: str) -> tuple[str, str, str]:
    """`s3://bucket/a/b` -> ("s3", "bucket", "a/b"); raises naming what is wrong."""
    if not isinstance(root_uri, str):
        raise ConfigurationError(f"S3 checkpoint root must be a string, got {type(root_uri).__name__}")
    parsed = urlparse(root_uri)
    scheme = parsed.scheme.lower()
    if scheme not in ("s3", "s3a"):
        raise ConfigurationError(
            f"not an S3 URI (scheme {scheme!r}): {_redact(root_uri)!r}; expected s3://bucket/prefix"
        )
    if "@" in parsed.netloc:
        raise ConfigurationError(
            f"S3 URI {_redact(root_uri)!r} embeds credentials; use the boto3 credential chain instead"
        )
    if parsed.query or parsed.fragment or parsed.params:
        raise ConfigurationError(f"S3 URI {root_uri!r} has a query or fragment; expected s3://bucket/prefix")
    bucket = parsed.netloc
    if not bucket:
        raise ConfigurationError(f"S3 URI {root_uri!r} names no bucket; expected s3://bucket/prefix")
    if not _BUCKET.match(bucket) or ".." in bucket or ".-" in bucket or "-." in bucket or _is_ip(bucket):
        raise ConfigurationError(
            f"invalid S3 bucket name {bucket!r} in {root_uri!r}: 3-63 lowercase letters, digits, '.' and '-', "
            "starting and ending with a letter or digit, not an IP address"
        )
    prefix = parsed.path.strip("/")
    if prefix:
        try:
            for part in prefix.split("/"):
                validate_component(part, "S3 prefix component")
        except ConfigurationError as e:
            raise ConfigurationError(f"invalid prefix in S3 checkpoint root {root_uri!r}: {e}") from None
    return scheme, bucket, prefix


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class IncompleteUpload:
    """A multipart upload that was started and neither completed nor aborted (in flight or abandoned)."""

    path: str
    upload_id: str
    initiated: float
    """Start time (epoch seconds) as the store reports it; moto reports a fixed date in 2010."""


def _error_code(e: bce.ClientError) -> tuple[str, int]:
    err = e.response.get("Error", {})
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(err.get("Code", "") or status), status


def _backoff(attempt: int, base: float = 0.05, cap: float = 5.0) -> float:
    """Exponential backoff with jitter, so parallel workers do not retry in lockstep."""
    return float(min(cap, base * 2**attempt) * random.uniform(0.5, 1.0))


# -- writing -------------------------------------------------------------------------------------


class _S3Output:
    """Atomic output: one PUT for small files, a streamed multipart upload for large ones."""

    def __init__(self, fm: S3FileManager, path: str, key: str, exclusive: bool) -> None:
        self.path = path
        self._fm = fm
        self._key = key
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
            raise CheckpointError(f"write after {self._state}", self._fm.uri_of(self.path))
        mv = memoryview(data).cast("B")
        n, off = len(mv), 0
        try:
            while off < n:
                limit = self._fm.options.multipart_threshold + 1 if self._upload_id is None else self._part_target()
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
        return min(MAX_PART_SIZE, self._fm.options.multipart_part_size * (1 + (number - 1) // 1000))

    def _begin_multipart(self) -> None:
        with self._fm._errors("CreateMultipartUpload", self.path):
            resp = self._fm.client.create_multipart_upload(
                Bucket=self._fm.bucket,
                Key=self._key,
                Metadata={WRITE_ID_META: self._write_id},
                ChecksumAlgorithm="CRC32",
            )
        self._upload_id = resp["UploadId"]
        log.debug("started multipart upload of %s", self._fm.uri_of(self.path))

    def _send_part(self, size: int) -> None:
        """Hand one part to the upload pool, first waiting for the previous one (two parts in memory)."""
        self._wait_pending()
        number = len(self._parts) + 1
        if number > MAX_PARTS:
            raise CheckpointError(f"file exceeds {MAX_PARTS} multipart parts", self._fm.uri_of(self.path))
        chunk = bytes(self._buf[:size])
        del self._buf[:size]
        self._pending = _shared_upload_pool().submit(self._upload_part, number, chunk)

    def _upload_part(self, number: int, chunk: bytes) -> CompletedPartTypeDef:
        assert self._upload_id is not None
        with self._fm._errors("UploadPart", self.path):
            resp = self._fm.client.upload_part(
                Bucket=self._fm.bucket,
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
            raise CheckpointError(f"close after {self._state}", self._fm.uri_of(self.path))
        try:
            if self._exclusive and self._fm.options.head_before_create and self._fm.exists(self.path):
                raise CheckpointFileExistsError(
                    "refusing to overwrite existing checkpoint file (HEAD check)", self._fm.uri_of(self.path)
                )
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

    def _put_single(self) -> None:
        fm = self._fm
        try:
            if self._exclusive:
                fm.client.put_object(
                    Bucket=fm.bucket,
                    Key=self._key,
                    Body=bytes(self._buf),
                    Metadata={WRITE_ID_META: self._write_id},
                    ChecksumAlgorithm="CRC32",
                    IfNoneMatch="*",
                )
            else:
                fm.client.put_object(
                    Bucket=fm.bucket,
                    Key=self._key,
                    Body=bytes(self._buf),
                    Metadata={WRITE_ID_META: self._write_id},
                    ChecksumAlgorithm="CRC32",
                )
        except bce.ClientError as e:
            self._conflict_or_raise(e, "PutObject")
        except bce.BotoCoreError as e:
            raise fm._translate(e, "PutObject", self.path) from e

    def _complete(self) -> None:
        fm = self._fm
        assert self._upload_id is not None
        try:
            if self._exclusive:
                fm.client.complete_multipart_upload(
                    Bucket=fm.bucket,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                    IfNoneMatch="*",
                )
            else:
                fm.client.complete_multipart_upload(
                    Bucket=fm.bucket, Key=self._key, UploadId=self._upload_id, MultipartUpload={"Parts": self._parts}
                )
        except bce.ClientError as e:
            if _error_code(e)[0] == "NoSuchUpload" and fm._written_by(self._key, self._write_id):
                self._upload_id = None  # a retried Complete of our own completed upload
                return
            self._conflict_or_raise(e, "CompleteMultipartUpload")
        except bce.BotoCoreError as e:
            raise fm._translate(e, "CompleteMultipartUpload", self.path) from e
        self._upload_id = None
        log.debug("completed multipart upload of %s (%d parts)", fm.uri_of(self.path), len(self._parts))

    def _conflict_or_raise(self, e: bce.ClientError, op: str) -> None:
        """412/409 on a conditional write: our own earlier attempt (retried) succeeds, anything else refuses."""
        code, status = _error_code(e)
        if self._exclusive and (code in _EXISTS_CODES or status in (409, 412)):
            if self._fm._written_by(self._key, self._write_id):
                log.debug("%s of %s: conflict with our own retried write; done", op, self._fm.uri_of(self.path))
                self._upload_id = None
                return
            raise CheckpointFileExistsError(
                "refusing to overwrite existing checkpoint file", self._fm.uri_of(self.path)
            ) from None
        raise self._fm._translate(e, op, self.path) from e

    def _abort(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            with contextlib.suppress(BaseException):
                pending.result()
        self._buf = bytearray()
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            try:
                self._fm.client.abort_multipart_upload(Bucket=self._fm.bucket, Key=self._key, UploadId=upload_id)
                log.debug("aborted multipart upload of %s", self._fm.uri_of(self.path))
            except Exception as e:  # the original error matters more; maintenance reaps the upload later
                log.warning(
                    "could not abort multipart upload %s of %s (%s); list_incomplete_uploads() finds it",
                    upload_id,
                    self._fm.uri_of(self.path),
                    type(e).__name__,
                )

    def cancel(self) -> None:
        """Discard everything: drop the buffer and abort the multipart upload if one was started."""
        if self._state in ("closed", "cancelled"):
            return
        self._state = "cancelled"
        self._abort()

    def __enter__(self) -> _S3Output:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()


# -- reading -------------------------------------------------------------------------------------


class _S3Reader(io.RawIOBase):
    """A streamed GET that resumes with a ranged GET (pinned by ETag) when the connection breaks."""

    def __init__(self, fm: S3FileManager, path: str, key: str) -> None:
        super().__init__()
        self._fm = fm
        self._path = path
        self._key = key
        self._pos = 0
        self._resumes = 0
        self._body: Any = None
        self._etag = ""
        self.size = 0
        self._get(first=True)

    def _get(self, *, first: bool) -> None:
        fm = self._fm
        with fm._errors("GetObject", self._path):
            if first:
                resp = fm.client.get_object(Bucket=fm.bucket, Key=self._key)
                self.size = int(resp["ContentLength"])
                self._etag = resp.get("ETag", "")
            else:
                resp = fm.client.get_object(
                    Bucket=fm.bucket, Key=self._key, Range=f"bytes={self._pos}-", IfMatch=self._etag
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
                raise CheckpointError(f"S3 checksum mismatch while reading ({e})", self._fm.uri_of(self._path)) from e
            except _STREAM_ERRORS as e:
                self._resume(e)
                continue
            self._pos += len(data)
            return data

    def _resume(self, cause: BaseException) -> None:
        self._resumes += 1
        if self._resumes > self._fm.options.max_attempts:
            raise CheckpointError(
                f"S3 read broke off at byte {self._pos} of {self.size} {self._resumes - 1} times "
                f"({type(cause).__name__})",
                self._fm.uri_of(self._path),
            ) from cause
        log.debug("resuming read of %s at byte %d after %s", self._fm.uri_of(self._path), self._pos, cause)
        with contextlib.suppress(Exception):
            self._body.close()
        time.sleep(_backoff(self._resumes - 1))
        try:
            self._get(first=False)
        except CheckpointError as e:
            if isinstance(e.__cause__, bce.ClientError) and _error_code(e.__cause__)[0] == "PreconditionFailed":
                raise CheckpointError(
                    "S3 object changed while being read", self._fm.uri_of(self._path)
                ) from e.__cause__
            raise

    def readinto(self, buffer: Any) -> int:
        mv = memoryview(buffer).cast("B")
        data = self._read_some(len(mv))
        mv[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
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


# -- the manager ---------------------------------------------------------------------------------


_shared_lock = threading.Lock()
_clients: dict[tuple[Any, ...], S3Client] = {}
_upload_pool: tuple[int, ThreadPoolExecutor] | None = None
UPLOAD_THREADS = 32
"""Part uploads in flight per process; each open output has at most one (memory stays bounded)."""


def _shared_client(options: S3Options) -> S3Client:
    """One boto3 client per process and client settings: making one costs ~0.1-0.5 s of CPU, and a
    Spark executor opens a manager per partition. boto3 clients are thread-safe; refreshable
    credentials (roles, SSO) refresh inside the client."""
    style = options.addressing_style or ("path" if options.endpoint_url else "auto")
    key = (
        os.getpid(),
        options.endpoint_url,
        options.region_name,
        style,
        options.retry_mode,
        options.max_attempts,
        options.connect_timeout,
        options.read_timeout,
        options.max_pool_connections,
    )
    with _shared_lock:
        client = _clients.get(key)
        if client is not None:
            return client
        config = Config(
            retries=cast(Any, {"mode": options.retry_mode, "total_max_attempts": options.max_attempts}),
            connect_timeout=options.connect_timeout,
            read_timeout=options.read_timeout,
            max_pool_connections=options.max_pool_connections,
            s3=cast(Any, {"addressing_style": style}),
        )
        session = boto3.session.Session()
        region = options.region_name or session.region_name or "us-east-1"
        client = session.client("s3", endpoint_url=options.endpoint_url, region_name=region, config=config)
        _clients[key] = client
        # Endpoint and settings only: credentials are never logged.
        log.info(
            "new S3 client: endpoint %s, region %s, addressing %s, retries %s x%d",
            client.meta.endpoint_url,
            region,
            style,
            options.retry_mode,
            options.max_attempts,
        )
        return client


def _shared_upload_pool() -> ThreadPoolExecutor:
    global _upload_pool
    with _shared_lock:
        if _upload_pool is None or _upload_pool[0] != os.getpid():  # a forked child needs its own threads
            _upload_pool = (os.getpid(), ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="statekeeper-s3-upload"))
        return _upload_pool[1]


class S3FileManager:
    """Checkpoint files under `s3://bucket/prefix`; thread-safe and cheap to make (clients are shared)."""

    def __init__(self, root_uri: str, **options: Any) -> None:
        self._scheme, self.bucket, self.prefix = parse_s3_uri(root_uri)
        self._key_prefix = f"{self.prefix}/" if self.prefix else ""
        self.options = S3Options.resolve(options)
        self._client: S3Client | None = None
        self._bucket_verified = False

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def root_uri(self) -> str:
        return f"{self._scheme}://{self.bucket}/{self.prefix}" if self.prefix else f"{self._scheme}://{self.bucket}"

    def uri_of(self, path: str) -> str:
        return f"{self.root_uri}/{path}"

    @property
    def client(self) -> S3Client:
        """The boto3 client, looked up on first use (so a manager can be pickled to executors)."""
        client = self._client
        if client is None:
            client = _shared_client(self.options)
            self._client = client
            log.debug("S3 checkpoint root %s at endpoint %s", self.root_uri, client.meta.endpoint_url)
        return client

    def __getstate__(self) -> dict[str, Any]:
        return {"root_uri": self.root_uri, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._scheme, self.bucket, self.prefix = parse_s3_uri(state["root_uri"])
        self._key_prefix = f"{self.prefix}/" if self.prefix else ""
        self.options = state["options"]
        self._client = None
        self._bucket_verified = False

    def with_options(self, **options: Any) -> S3FileManager:
        """A manager on the same root with some settings changed (tests, tools)."""
        new = S3FileManager.__new__(S3FileManager)
        new.__setstate__({"root_uri": self.root_uri, "options": replace(self.options, **options)})
        new.options.validate()
        return new

    def _key(self, path: str) -> str:
        return self._key_prefix + validate_relative_path(path)

    def _translate(self, e: Exception, op: str, path: str | None) -> Exception:
        """A statekeeper error naming the bucket/key and what to do; never includes credentials."""
        where = self.uri_of(path) if path else self.root_uri
        if isinstance(e, bce.ClientError):
            code, status = _error_code(e)
            message = e.response.get("Error", {}).get("Message", "")
            if code == "NoSuchBucket":
                return self._missing_bucket()
            if code in _NOT_FOUND_CODES:
                return CheckpointFileNotFoundError("checkpoint file not found", where)
            if code in _CREDENTIAL_CODES or code == "SignatureDoesNotMatch":
                return ConfigurationError(
                    f"S3 rejected the credentials from the boto3 credential chain ({code}) during {op} on {where}"
                )
            if code in _DENIED_CODES or status == 403:
                return CheckpointError(
                    f"access denied by S3 ({code}) for {op} on bucket {self.bucket!r}: check the IAM / bucket "
                    "policy of the credentials in use",
                    where,
                )
            return CheckpointError(f"S3 {op} failed: {code} (HTTP {status}) {message}".rstrip(), where)
        if isinstance(e, bce.NoCredentialsError | bce.PartialCredentialsError):
            return ConfigurationError(
                f"no usable AWS credentials for {self.root_uri}: boto3 found none in the environment, shared "
                "config/credentials files or an instance/container role"
            )
        if isinstance(e, bce.EndpointConnectionError | bce.ConnectTimeoutError | bce.ConnectionClosedError):
            return CheckpointError(
                f"cannot reach the S3 endpoint {self.client.meta.endpoint_url} during {op} "
                f"after {self.options.max_attempts} attempts ({type(e).__name__})",
                where,
            )
        if isinstance(e, bce.ReadTimeoutError):
            return CheckpointError(
                f"S3 {op} timed out after {self.options.max_attempts} attempts "
                f"(read_timeout={self.options.read_timeout}s)",
                where,
            )
        return CheckpointError(f"S3 {op} failed: {type(e).__name__}: {e}", where)

    def _missing_bucket(self) -> ConfigurationError:
        return ConfigurationError(
            f"S3 bucket {self.bucket!r} of checkpoint root {self.root_uri} does not exist "
            f"(endpoint {self.client.meta.endpoint_url})"
        )

    @contextlib.contextmanager
    def _errors(self, op: str, path: str | None) -> Iterator[None]:
        try:
            yield
        except (bce.ClientError, bce.BotoCoreError) as e:
            raise self._translate(e, op, path) from e

    def _head(self, key: str, path: str) -> dict[str, Any] | None:
        """HeadObject, or None when absent. A HEAD 404 does not say whether the bucket exists: check once."""
        try:
            return cast(dict[str, Any], self.client.head_object(Bucket=self.bucket, Key=key))
        except bce.ClientError as e:
            code, status = _error_code(e)
            if code in _NOT_FOUND_CODES or status == 404:
                if not self._bucket_verified:
                    self._verify_bucket()
                return None
            raise self._translate(e, "HeadObject", path) from e
        except bce.BotoCoreError as e:
            raise self._translate(e, "HeadObject", path) from e

    def _written_by(self, key: str, write_id: str) -> bool:
        head = self._head(key, key[len(self._key_prefix) :])
        return head is not None and head.get("Metadata", {}).get(WRITE_ID_META) == write_id

    # -- CheckpointFileManager ------------------------------------------------------------------
    def create(self, path: str, *, exclusive: bool = True) -> _S3Output:
        return _S3Output(self, path, self._key(path), exclusive)

    def put_file(self, local_path: str, path: str, *, exclusive: bool = True) -> int:
        """Stream a local file through `create`: one PUT when small, else multipart with bounded memory."""
        out = self.create(path, exclusive=exclusive)
        with out, open(local_path, "rb") as src:
            chunk = max(MiB, min(self.options.multipart_part_size, 8 * MiB))
            while data := src.read(chunk):
                out.write(data)
        return out.size

    def open(self, path: str) -> BinaryIO:
        """A streaming, non-seekable reader (the store downloads to disk when it needs to seek)."""
        raw = _S3Reader(self, path, self._key(path))
        return cast(BinaryIO, io.BufferedReader(raw, buffer_size=256 * 1024))

    def read_bytes(self, path: str) -> bytes:
        with _S3Reader(self, path, self._key(path)) as raw:
            return raw.readall()

    def download(self, path: str, local_path: str) -> int:
        """Streamed GET into `local_path`; a failed download leaves no partial local file."""
        size = 0
        with _S3Reader(self, path, self._key(path)) as raw:
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

    def exists(self, path: str) -> bool:
        return self._head(self._key(path), path) is not None

    def info(self, path: str) -> FileInfo:
        head = self._head(self._key(path), path)
        if head is None:
            raise CheckpointFileNotFoundError("checkpoint file not found", self.uri_of(path))
        return FileInfo(path, int(head["ContentLength"]), head["LastModified"].timestamp())

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[FileInfo]:
        """ListObjectsV2 page by page (never assuming one page); S3 order is the lexicographic one."""
        validate_prefix(prefix)
        if start_after is not None and not isinstance(start_after, str):
            raise ConfigurationError(f"start_after must be a path string, got {start_after!r}")
        return self._list(prefix, start_after)

    def _list(self, prefix: str, start_after: str | None) -> Iterator[FileInfo]:
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": self._key_prefix + prefix,
            "MaxKeys": self.options.list_page_size,
        }
        if start_after is not None:
            kwargs["StartAfter"] = self._key_prefix + start_after
        strip = len(self._key_prefix)
        while True:
            with self._errors("ListObjectsV2", prefix or None):
                page = self.client.list_objects_v2(**kwargs)
            for obj in page.get("Contents", []):
                rel = obj["Key"][strip:]
                if rel and not rel.endswith("/"):  # skip "directory" marker objects
                    yield FileInfo(rel, int(obj.get("Size", 0)), obj["LastModified"].timestamp())
            if not page.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def delete_many(self, paths: Iterable[str]) -> DeleteResult:
        """DeleteObjects in batches of <= 1000 keys on a bounded pool; throttled keys are retried.

        Every path is validated before anything is deleted, so bad input deletes nothing.
        """
        unique: dict[str, str] = {}
        for path in paths:
            unique.setdefault(self._key(path), path)
        result = DeleteResult()
        if not unique:
            return result
        items = list(unique.items())
        size = self.options.delete_batch_size
        batches = (items[i : i + size] for i in range(0, len(items), size))
        pool = ThreadPoolExecutor(self.options.delete_parallelism, thread_name_prefix="statekeeper-s3-delete")
        inflight: set[Future[DeleteResult]] = set()
        try:
            for batch in batches:
                if len(inflight) >= 2 * self.options.delete_parallelism:
                    done, inflight = wait(inflight, return_when=FIRST_COMPLETED)
                    for f in done:
                        result.merge(f.result())
                inflight.add(pool.submit(self._delete_batch, dict(batch)))
            for f in inflight:
                result.merge(f.result())
        finally:
            for f in inflight:
                f.cancel()
            pool.shutdown(wait=True)
        log.info("deleted %d objects under %s (%d errors)", len(result.deleted), self.root_uri, len(result.errors))
        return result

    def _delete_batch(self, pending: dict[str, str]) -> DeleteResult:
        """One DeleteObjects batch; keys reported as throttled/5xx go again after a backoff."""
        result = DeleteResult()
        attempt = 0
        while pending:
            retry: dict[str, str] = {}
            try:
                resp = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in pending], "Quiet": True}
                )
            except (bce.ClientError, bce.BotoCoreError) as e:
                code = _error_code(e)[0] if isinstance(e, bce.ClientError) else type(e).__name__
                if code == "NoSuchBucket":
                    raise self._missing_bucket() from e
                retryable = code in _RETRYABLE_CODES or isinstance(e, bce.BotoCoreError)
                if retryable and attempt < self.options.delete_retries:
                    retry = pending
                else:
                    reason = str(self._translate(e, "DeleteObjects", None))
                    for p in pending.values():
                        result.errors[p] = reason
                    return result
            else:
                failed: set[str] = set()
                for err in resp.get("Errors", []):
                    key, code = err.get("Key", ""), err.get("Code", "")
                    if key not in pending:
                        continue
                    failed.add(key)
                    if code in _RETRYABLE_CODES and attempt < self.options.delete_retries:
                        retry[key] = pending[key]
                    else:
                        result.errors[pending[key]] = f"{code}: {err.get('Message', '')}".rstrip(": ")
                result.deleted.extend(p for k, p in pending.items() if k not in failed)
            if retry:
                log.debug("DeleteObjects: %d keys throttled, retry %d", len(retry), attempt + 1)
                time.sleep(_backoff(attempt))
                attempt += 1
            pending = retry
        return result

    # -- S3 only --------------------------------------------------------------------------------
    def check(self) -> None:
        """Fail fast with a clear error if the bucket is missing, unreachable or not listable."""
        self._verify_bucket()
        with self._errors("ListObjectsV2", None):
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key_prefix, MaxKeys=1)

    def _verify_bucket(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except bce.ClientError as e:
            code, status = _error_code(e)
            if code in ("NoSuchBucket", "404", "NotFound") or status == 404:
                raise self._missing_bucket() from e
            raise self._translate(e, "HeadBucket", None) from e
        except bce.BotoCoreError as e:
            raise self._translate(e, "HeadBucket", None) from e
        self._bucket_verified = True

    def probe_conditional_writes(self) -> bool:
        """Whether the store honours `If-None-Match: *` (two conditional PUTs of a probe object).

        Writes and deletes one object `_statekeeper_probe_<random>` under the root.
        """
        key = f"{self._key_prefix}_statekeeper_probe_{uuid.uuid4().hex}"
        try:
            with self._errors("PutObject", None):
                self.client.put_object(Bucket=self.bucket, Key=key, Body=b"1", IfNoneMatch="*")
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=b"2", IfNoneMatch="*")
            except bce.ClientError as e:
                code, status = _error_code(e)
                if code in _EXISTS_CODES or status in (409, 412):
                    return True
                raise self._translate(e, "PutObject", None) from e
            return False
        finally:
            with contextlib.suppress(Exception):
                self.client.delete_object(Bucket=self.bucket, Key=key)

    def list_incomplete_uploads(self, prefix: str = "") -> Iterator[IncompleteUpload]:
        """Multipart uploads started under `prefix` and not completed or aborted (paginated).

        Some are writes still in flight: maintenance aborts only those older than its grace period.
        """
        validate_prefix(prefix)
        return self._list_uploads(prefix)

    def _list_uploads(self, prefix: str) -> Iterator[IncompleteUpload]:
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": self._key_prefix + prefix,
            "MaxUploads": self.options.list_page_size,
        }
        strip = len(self._key_prefix)
        while True:
            with self._errors("ListMultipartUploads", prefix or None):
                page = self.client.list_multipart_uploads(**kwargs)
            for up in page.get("Uploads", []):
                yield IncompleteUpload(up["Key"][strip:], up["UploadId"], up["Initiated"].timestamp())
            if not page.get("IsTruncated"):
                return
            kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")

    def abort_incomplete_upload(self, path: str, upload_id: str) -> bool:
        """Abort one multipart upload; False if it was already gone (completed or aborted)."""
        if not isinstance(upload_id, str) or not upload_id:
            raise ConfigurationError(f"invalid multipart upload id {upload_id!r} for {self.uri_of(path)}")
        key = self._key(path)
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except bce.ClientError as e:
            if _error_code(e)[0] == "NoSuchUpload":
                return False
            raise self._translate(e, "AbortMultipartUpload", path) from e
        except bce.BotoCoreError as e:
            raise self._translate(e, "AbortMultipartUpload", path) from e
        return True


__all__ = ["IncompleteUpload", "S3FileManager", "S3Options", "parse_s3_uri"]
