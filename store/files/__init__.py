"""Checkpoint file managers, chosen by the scheme of the checkpoint root URI."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files.base import AtomicOutput, CheckpointFileManager, DeleteResult, FileInfo
from statekeeper.store.files.local import LocalFileManager

__all__ = [
    "AtomicOutput",
    "CheckpointFileManager",
    "DeleteResult",
    "FileInfo",
    "LocalFileManager",
    "normalize_root_uri",
    "open_file_manager",
]


def _scheme(root_uri: str) -> str:
    """The scheme of a checkpoint root URI: "file" for a local path or file://, "s3" or "s3a"."""
    if not isinstance(root_uri, str) or not root_uri.strip():
        raise ConfigurationError("checkpoint root URI is empty")
    scheme = urlparse(root_uri).scheme.lower()
    if scheme in ("", "file"):
        return "file"
    if scheme in ("s3", "s3a"):
        return scheme
    raise ConfigurationError(
        f"unsupported checkpoint root scheme {scheme!r} in {root_uri!r}: use a local path, file:// or s3://"
    )


def normalize_root_uri(root_uri: str) -> str:
    """The URI under which a file manager (and so the catalog) knows `root_uri`, without opening one:
    ``open_file_manager(root_uri).root_uri``, ``file:///abs/path`` or ``s3://bucket/prefix``, for the seams that only
    compare or record roots (no S3 settings resolved, no client)."""
    if _scheme(root_uri) == "file":
        return LocalFileManager(root_uri).root_uri  # no I/O beyond a stat: the path made absolute
    from statekeeper.store.files.s3.uri import parse_s3_uri

    scheme, bucket, prefix = parse_s3_uri(root_uri)
    return f"{scheme}://{bucket}/{prefix}" if prefix else f"{scheme}://{bucket}"


def open_file_manager(root_uri: str, **options: Any) -> CheckpointFileManager:
    """The file manager for `root_uri`: a local path, `file://...` or `s3://bucket/prefix`."""
    if _scheme(root_uri) == "file":
        if options:
            raise ConfigurationError(f"local checkpoint root {root_uri!r} takes no options, got {sorted(options)}")
        return LocalFileManager(root_uri)
    from statekeeper.store.files.s3 import S3FileManager  # boto3 is only imported when S3 is used

    return S3FileManager(root_uri, **options)
