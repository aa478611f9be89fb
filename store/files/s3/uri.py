"""Parsing and checking of S3 checkpoint root URIs (`s3://bucket/prefix`, also Spark's `s3a://`).

A root URI is the one piece of S3 configuration every executor receives, so it is checked here,
before any client exists: a bad bucket or prefix, a query, or embedded credentials are refused with
an error that names the URI (with any user-info redacted, so a secret never reaches a message).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlparse

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files.paths import validate_component

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")


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
