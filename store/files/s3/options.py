"""Settings of an S3 checkpoint root, and the limits S3 itself puts on them.

Kept apart from the client and the transfers so that configuration can be resolved and checked
(keyword options, else `STATEKEEPER_S3_*` environment variables, else defaults; docs/s3.md) before
any network code runs, and every bad value is refused naming the setting and where it came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, NoReturn
from urllib.parse import urlparse

from statekeeper.store.errors import ConfigurationError

MiB = 1 << 20
MIN_PART_SIZE = 5 * MiB
"""S3's minimum size of every part but the last."""
MAX_PART_SIZE = 5 * 1024 * MiB
MAX_PARTS = 10_000
MAX_DELETE_BATCH = 1000
"""DeleteObjects takes at most this many keys per request."""
ENV_PREFIX = "STATEKEEPER_S3_"


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
    conditional_writes: str = "auto"
    """trust | probe | auto: whether to check once per endpoint and bucket that the store honours
    If-None-Match before the first exclusive publish (refusing if not); auto probes custom endpoints only."""
    verify_published: bool = False
    """Treat an object as published only when it carries statekeeper's write-id metadata, for stores
    that show an object while its upload is still being written (s3rver); costs a HEAD per listed key."""
    listing: str = "flat"
    """flat | unordered: page through ListObjectsV2 in the store's (binary key) order, or, for a store
    that does not list in that order (s3rver), one page of <= 1000 keys sorted by statekeeper."""

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
        if self.conditional_writes not in ("trust", "probe", "auto"):
            bad("conditional_writes", "expected trust, probe or auto")
        if self.listing not in ("flat", "unordered"):
            bad("listing", "expected flat or unordered")

    @property
    def probes_conditional_writes(self) -> bool:
        """Whether exclusive publishes first check (once) that the store honours If-None-Match."""
        if self.head_before_create or self.conditional_writes == "trust":
            return False
        return self.conditional_writes == "probe" or self.endpoint_url is not None
