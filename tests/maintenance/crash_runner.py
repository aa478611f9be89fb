"""Run the `statekeeper` CLI and kill -9 it at its Nth write or delete: `python -m
tests.maintenance.crash_runner N [--mid] -- <statekeeper arguments>`.

Every publish (an atomic output's close), delete batch and upload abort of the checkpoint file
managers counts. At the Nth the process sends itself SIGKILL: before the call, or with `--mid` in the
middle of it (a local temp file written but not published; half of a delete batch done). A run that
finishes before the Nth call exits as the CLI does.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any

from statekeeper.store.files import local
from statekeeper.store.files.s3 import S3FileManager
from statekeeper.store.files.s3.upload import S3Output

_count = 0
_kill_at = 0
_mid = False


def _die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _tick() -> bool:
    """True when this call is the one to die in."""
    global _count
    _count += 1
    return _count == _kill_at


def _wrap_close(cls: Any) -> None:
    original: Callable[..., Any] = cls.close

    def close(self: Any) -> None:
        if getattr(self, "_crash_counted", False) or not _tick():
            self._crash_counted = True
            original(self)
            return
        if _mid and isinstance(self, local._LocalOutput) and self._file is not None:
            self._file.flush()  # the temp file is on disk, never published
        _die()

    cls.close = close


def _wrap_delete(cls: Any) -> None:
    original: Callable[..., Any] = cls.delete_many

    def delete_many(self: Any, paths: Iterable[str]) -> Any:
        paths = list(paths)
        if not _tick():
            return original(self, paths)
        if _mid and len(paths) > 1:
            original(self, paths[: len(paths) // 2])
        _die()

    cls.delete_many = delete_many


def _wrap_abort(cls: Any) -> None:
    original: Callable[..., Any] = cls.abort_incomplete_upload

    def abort(self: Any, path: str, upload_id: str) -> Any:
        if _tick():
            _die()
        return original(self, path, upload_id)

    cls.abort_incomplete_upload = abort


def main(argv: list[str]) -> int:
    global _kill_at, _mid
    sep = argv.index("--")
    opts, cli_args = argv[:sep], argv[sep + 1 :]
    _kill_at = int(opts[0])
    _mid = "--mid" in opts
    for output in (local._LocalOutput, S3Output):
        _wrap_close(output)
    for manager in (local.LocalFileManager, S3FileManager):
        _wrap_delete(manager)
    _wrap_abort(S3FileManager)
    from statekeeper.maintenance.cli import main as cli_main

    return cli_main(cli_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
