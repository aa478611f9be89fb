"""The one fault seam under every durable step: named points a test can kill, fail or count at.

Every step that makes something durable or removes it (a file manager's write, fsync, publish and
delete; a listing; an upload queued or run; a RocksDB flush or checkpoint; a catalog transaction)
calls `reached(point, subject)` just before it acts. Disarmed, that is one module-level `None`
check: production never installs a hook. Tests install one with `arm`: the crash-point sweep
(`tests/reliability/`) records the points a scenario reaches and then kills a child process with
SIGKILL at each; the disk-fault tests raise `OSError(ENOSPC)` or `OSError(EIO)` at a chosen point.

Point names are stable identifiers (`POINTS` lists them all), so a sweep's report can say which
instants were killed. `subject` names the file or key involved, relative to the root, for errors
and traces; it is never parsed.
"""

from __future__ import annotations

from collections.abc import Callable

FaultHook = Callable[[str, str], None]

POINTS: tuple[str, ...] = (
    "local.write",  # bytes written to a temp file (before each write)
    "local.fsync",  # the temp file complete, before its fsync
    "local.publish",  # before the link/rename that makes a file visible under its final name
    "local.published",  # visible, before the temp name is removed and the directory fsynced
    "local.put_file",  # before a complete local file is linked or copied under its final name
    "local.delete",  # before one file is unlinked
    "local.list",  # before a listing
    "s3.put",  # before a single PUT
    "s3.part",  # before one multipart part is uploaded
    "s3.complete",  # before CompleteMultipartUpload
    "s3.delete",  # before one DeleteObjects batch
    "s3.list",  # before a listing
    "upload.enqueue",  # a file staged, before its upload is queued (async commit)
    "upload.run",  # a queued upload, before it is sent
    "rocks.flush",  # before RocksDB memtables are flushed
    "rocks.checkpoint",  # before a RocksDB checkpoint (a snapshot's SST set) is taken
    "catalog.transaction",  # before a catalog transaction commits (sql/ may not import store: the
    # sweep reaches it from SQLAlchemy's commit event, tests/reliability/scenarios.py)
)

_hook: FaultHook | None = None


def reached(point: str, subject: str = "") -> None:
    """Called by the product just before a durable step; nothing happens unless a hook is armed."""
    if _hook is not None:
        _hook(point, subject)


def arm(hook: FaultHook | None) -> FaultHook | None:
    """Install `hook` (None disarms) for this process; returns the previous one."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def armed() -> bool:
    return _hook is not None
