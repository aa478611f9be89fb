"""The exception hierarchy shared by every package.

Each error names the file, key or setting at fault so an operator can act on it without a debugger.
"""

from __future__ import annotations

from statekeeper.errors import StatekeeperError as StatekeeperError  # noqa: PLC0414 (the root, exported here too)


class ConfigurationError(StatekeeperError, ValueError):
    """A setting, argument or URI is invalid; nothing was read or written because of it."""


class CheckpointError(StatekeeperError):
    """A problem with a file in the checkpoint location."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(f"{message}: {path}" if path else message)
        self.path = path


class CheckpointFileExistsError(CheckpointError, FileExistsError):
    """An exclusive create found the name taken; the existing file was left untouched."""


class CheckpointFileNotFoundError(CheckpointError, FileNotFoundError):
    """A file the caller needs is not in the checkpoint location."""


class VersionExpiredError(CheckpointFileNotFoundError):
    """The version being loaded left retention while it loaded: maintenance deleted files the load had
    listed (its base snapshot) and nothing older is left to load it from. Load a newer version."""


class CheckpointWriteError(CheckpointError, OSError):
    """The operating system refused a write (ENOSPC, EIO ...); the attempt was aborted and nothing
    became visible under the file's name. `errno` is the system's error number."""

    def __init__(self, path: str, cause: OSError) -> None:
        super().__init__(f"writing failed ({cause.strerror or cause})", path)
        self.errno = cause.errno


class CorruptFileError(CheckpointError):
    """A file is truncated, fails its checksum or has the wrong magic; it is left as it is."""


class UnsupportedFormatError(CheckpointError):
    """A file was written in a format version this release cannot read."""


class LineageError(StatekeeperError):
    """A requested version is not committed, or its lineage cannot be followed to a base."""


class StoreStateError(StatekeeperError):
    """An operation was called in the wrong state (e.g. `put` before `load`, `commit` twice)."""
