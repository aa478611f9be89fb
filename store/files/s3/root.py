"""One S3 checkpoint root: the bucket and key prefix, the shared client that reaches them, and how
their failures read.

The transfers, listings and deletions of the S3 backend all work on an `S3Root`: it maps a
validated relative path to its key (so nothing can address a key outside the prefix), runs HEAD and
bucket checks, and turns every botocore failure into a statekeeper error naming the bucket/key and
what to do, never the credentials.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import botocore.exceptions as bce

from statekeeper.store.errors import CheckpointError, ConfigurationError
from statekeeper.store.files.base import file_not_found
from statekeeper.store.files.paths import validate_relative_path
from statekeeper.store.files.s3.client import shared_client
from statekeeper.store.files.s3.errors import CREDENTIAL_CODES, DENIED_CODES, NOT_FOUND_CODES, error_code
from statekeeper.store.files.s3.options import S3Options
from statekeeper.store.files.s3.uri import parse_s3_uri

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

log = logging.getLogger(__name__)

WRITE_ID_META = "statekeeper-write-id"
"""Object metadata holding the random id of the write that published it (see `upload.py`)."""


def write_id_of(answer: Mapping[str, Any]) -> str | None:
    """The write id in a HEAD/GET answer's metadata. Its name comes back spelled as the store sends the header
    (S3 in lower case; servers that canonicalise header names, as Go's does, capitalised): compared without case."""
    for name, value in answer.get("Metadata", {}).items():
        if name.lower() == WRITE_ID_META:
            return cast(str, value)
    return None


class S3Root:
    """`s3://bucket/prefix` with its settings; the client is looked up on first use."""

    def __init__(self, root_uri: str, options: S3Options | Mapping[str, Any]) -> None:
        """`options` are resolved settings, or keyword options to resolve (after the URI is checked)."""
        self.scheme, self.bucket, self.prefix = parse_s3_uri(root_uri)
        self.key_prefix = f"{self.prefix}/" if self.prefix else ""
        self.options = options if isinstance(options, S3Options) else S3Options.resolve(options)
        self._client: S3Client | None = None
        self._bucket_verified = False

    @property
    def root_uri(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}" if self.prefix else f"{self.scheme}://{self.bucket}"

    def uri_of(self, path: str) -> str:
        return f"{self.root_uri}/{path}"

    def key(self, path: str) -> str:
        """The object key of a relative path, which is validated first."""
        return self.key_prefix + validate_relative_path(path)

    @property
    def client(self) -> S3Client:
        client = self._client
        if client is None:
            client = shared_client(self.options)
            self._client = client
            log.debug("S3 checkpoint root %s at endpoint %s", self.root_uri, client.meta.endpoint_url)
        return client

    # -- failures --------------------------------------------------------------------------------
    def translate(self, e: Exception, op: str, path: str | None) -> Exception:
        """A statekeeper error naming the bucket/key and what to do; never includes credentials."""
        where = self.uri_of(path) if path else self.root_uri
        if isinstance(e, bce.ClientError):
            code, status = error_code(e)
            message = e.response.get("Error", {}).get("Message", "")
            if code == "NoSuchBucket":
                return self.missing_bucket()
            if code in NOT_FOUND_CODES:
                return file_not_found(where)
            if code in CREDENTIAL_CODES or code == "SignatureDoesNotMatch":
                return ConfigurationError(
                    f"S3 rejected the credentials from the boto3 credential chain ({code}) during {op} on {where}"
                )
            if code in DENIED_CODES or status == 403:
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

    def missing_bucket(self) -> ConfigurationError:
        return ConfigurationError(
            f"S3 bucket {self.bucket!r} of checkpoint root {self.root_uri} does not exist "
            f"(endpoint {self.client.meta.endpoint_url})"
        )

    @contextlib.contextmanager
    def errors(self, op: str, path: str | None) -> Iterator[None]:
        """Raise any botocore failure inside the block as the error `translate` makes of it."""
        try:
            yield
        except (bce.ClientError, bce.BotoCoreError) as e:
            raise self.translate(e, op, path) from e

    # -- objects and the bucket -------------------------------------------------------------------
    def published(self, answer: Mapping[str, Any]) -> bool:
        """Whether a HEAD/GET answer shows a finished publish: always on S3; with `verify_published`
        (a store that shows objects while they upload) only when the write-id metadata, which such a
        store writes last, is there."""
        return not self.options.verify_published or write_id_of(answer) is not None

    def head(self, key: str, path: str) -> dict[str, Any] | None:
        """HeadObject, or None when absent (or not yet published). A HEAD 404 does not say whether the
        bucket exists: check once."""
        try:
            answer = cast(dict[str, Any], self.client.head_object(Bucket=self.bucket, Key=key))
            return answer if self.published(answer) else None
        except bce.ClientError as e:
            code, status = error_code(e)
            if code in NOT_FOUND_CODES or status == 404:
                if not self._bucket_verified:
                    self.verify_bucket()
                return None
            raise self.translate(e, "HeadObject", path) from e
        except bce.BotoCoreError as e:
            raise self.translate(e, "HeadObject", path) from e

    def written_by(self, key: str, write_id: str) -> bool:
        """Whether the object at `key` was published by the write with id `write_id`."""
        head = self.head(key, key[len(self.key_prefix) :])
        return head is not None and write_id_of(head) == write_id

    def verify_bucket(self) -> None:
        """HeadBucket: a missing bucket is a configuration error naming it and the endpoint."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except bce.ClientError as e:
            code, status = error_code(e)
            if code in ("NoSuchBucket", "404", "NotFound") or status == 404:
                raise self.missing_bucket() from e
            raise self.translate(e, "HeadBucket", None) from e
        except bce.BotoCoreError as e:
            raise self.translate(e, "HeadBucket", None) from e
        self._bucket_verified = True
