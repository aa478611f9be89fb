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
    "open_file_manager",
]


def open_file_manager(root_uri: str, **options: Any) -> CheckpointFileManager:
    """The file manager for `root_uri`: a local path, `file://...` or `s3://bucket/prefix`."""
    if not isinstance(root_uri, str) or not root_uri.strip():
        raise ConfigurationError("checkpoint root URI is empty")
    scheme = urlparse(root_uri).scheme.lower()
    if scheme in ("", "file"):
        if options:
            raise ConfigurationError(f"local checkpoint root {root_uri!r} takes no options, got {sorted(options)}")
        return LocalFileManager(root_uri)
    if scheme in ("s3", "s3a"):
        from statekeeper.store.files.s3 import S3FileManager  # boto3 is only imported when S3 is used

        return S3FileManager(root_uri, **options)
    raise ConfigurationError(
        f"unsupported checkpoint root scheme {scheme!r} in {root_uri!r}: use a local path, file:// or s3://"
    )
