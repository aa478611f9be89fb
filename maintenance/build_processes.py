"""Snapshot builds in worker processes, so that one maintainer keeps more than one core busy.

A maintainer's snapshot builds (replaying changelogs into a store's replica, writing its SSTs and
manifest) are most of its CPU, and on threads they share Python's GIL with the listing, planning and
expiry: one process keeps about 1.3 cores busy. With ``build_processes`` N > 0 the builds run in N
worker processes instead. Each store's replica lives in one of them (the one with the fewest stores
when the store is first built, then always that one), so it stays warm from one cycle to the next; the
maintainer keeps everything else (listings, plans, leases, expiry, orphans, the catalog) and asks the
worker, under the store's lease, to build and write a snapshot. Between the build and the write the
worker asks the maintainer whether the lease is still held, as the in-process build checks it (invariant 5).

Requests and replies are JSON over a pipe (nothing executable crosses). A worker that dies (killed, out
of memory) fails the build it was doing, naming the store, and is started again for the next one; the
replica's directory tells the new worker what it holds. Workers exit when the maintainer closes
their pipe or dies; they ignore SIGINT and SIGTERM (sent to the whole group, they would otherwise fail
the builds of the cycle the maintainer is finishing).
"""

from __future__ import annotations

import base64
import json
import logging
import multiprocessing
import multiprocessing.util
import signal
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from statekeeper.maintenance.replica import BuildStats
from statekeeper.maintenance.replica_pool import checkout, close_replicas
from statekeeper.store.errors import CheckpointFileExistsError, StatekeeperError
from statekeeper.store.files import CheckpointFileManager, open_file_manager
from statekeeper.store.formats.snapshot import SnapshotManifest
from statekeeper.store.layout import StoreId
from statekeeper.store.snapshot import SnapshotResult, read_manifest

log = logging.getLogger(__name__)


class BuildProcessError(StatekeeperError):
    """A snapshot build in a worker process failed (its message names the store and the cause)."""


@dataclass(frozen=True)
class BuildRequest:
    """What a replica must hold and what the snapshot may reuse: `Replica.ensure` and `Replica.snapshot`'s
    arguments, plus where the copy lives (`work`) and whether to drop it first (`reset`, a repair)."""

    work: str
    store: StoreId
    version: int
    checkpoint_id: str
    committed: Mapping[int, str]
    snapshots: Mapping[int, SnapshotManifest]
    full_state: Collection[int]
    existing_ssts: Collection[str]
    corrupt_ssts: Collection[str]
    reset: bool = False

    def to_json(self, root_uri: str) -> bytes:
        return json.dumps(
            {
                "root": root_uri,
                "work": self.work,
                "store": [self.store.operator, self.store.partition],
                "version": self.version,
                "checkpoint_id": self.checkpoint_id,
                "committed": sorted(self.committed.items()),
                "snapshots": {v: m.checkpoint_id for v, m in self.snapshots.items()},  # read by a cold build only
                "full_state": sorted(self.full_state),
                "existing_ssts": sorted(self.existing_ssts),
                "corrupt_ssts": sorted(self.corrupt_ssts),
                "reset": self.reset,
            }
        ).encode()

    @classmethod
    def from_json(cls, req: Mapping[str, Any], fm: CheckpointFileManager) -> BuildRequest:
        """The request `to_json` sent, on the worker: its snapshots are read from `fm` only if asked for."""
        store = StoreId(req["store"][0], int(req["store"][1]))
        return cls(
            work=req["work"],
            store=store,
            version=req["version"],
            checkpoint_id=req["checkpoint_id"],
            committed={int(v): c for v, c in req["committed"]},
            snapshots=_ManifestsOnDemand(fm, store, {int(v): cid for v, cid in req["snapshots"].items()}),
            full_state=req["full_state"],
            existing_ssts=req["existing_ssts"],
            corrupt_ssts=req["corrupt_ssts"],
            reset=req["reset"],
        )

    def build_and_write(
        self, fm: CheckpointFileManager, may_write: Callable[[], None]
    ) -> tuple[BuildStats, SnapshotResult]:
        """Build the version in the store's replica here and write its snapshot; `may_write` runs between
        the two and raises to stop the write (the lease was lost). The one build, on a thread or a worker."""
        with checkout(fm, self.store, self.work) as replica:
            if self.reset:
                replica.reset()
            stats = replica.ensure(self.version, self.checkpoint_id, self.committed, self.snapshots, self.full_state)
            may_write()
            return stats, replica.snapshot(set(self.existing_ssts), frozenset(self.corrupt_ssts))


class _Worker:
    """One worker process and its pipe; one conversation at a time (`lock`)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.lock = threading.Lock()
        self.process: BaseProcess | None = None
        self.conn: Connection | None = None

    def started(self) -> Connection:
        if self.conn is None or self.process is None or not self.process.is_alive():
            self.stop()
            ctx = multiprocessing.get_context("spawn")  # never fork a process that runs threads
            parent, child = ctx.Pipe()
            levels = {name: logging.getLogger(name).getEffectiveLevel() for name in ("", "statekeeper.maintenance")}
            name = f"statekeeper-build-{self.index}"
            process = ctx.Process(target=serve, args=(child, levels), name=name, daemon=True)
            process.start()
            child.close()
            self.process, self.conn = process, parent
            log.info("snapshot build process %d started (pid %s)", self.index, process.pid)
        return self.conn

    def stop(self, timeout: float = 10.0) -> None:
        if self.conn is not None:
            self.conn.close()  # the worker sees the end of its pipe and exits
        if self.process is not None:
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        self.process = self.conn = None


class BuildProcesses:
    """N worker processes, each owning the replicas of the stores assigned to it (`worker_of`)."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError("build processes must be >= 1")
        self._workers = [_Worker(i) for i in range(processes)]
        self._lock = threading.Lock()
        self._owner: dict[tuple[str, StoreId], int] = {}
        self._owned = [0] * processes

    def __len__(self) -> int:
        return len(self._workers)

    def pids(self) -> list[int]:
        """The workers running now (for measuring their CPU)."""
        return [w.process.pid for w in self._workers if w.process is not None and w.process.pid is not None]

    def worker_of(self, root_uri: str, store: StoreId) -> int:
        """The worker that holds `store`'s replica: the one holding the fewest stores when the store is first
        built, then always that one (its copy stays warm; the stores of a fleet spread evenly)."""
        key = (root_uri, store)
        with self._lock:
            index = self._owner.get(key)
            if index is None:
                index = self._owner[key] = min(range(len(self._workers)), key=self._owned.__getitem__)
                self._owned[index] += 1
            return index

    def build(
        self, fm: CheckpointFileManager, request: BuildRequest, may_write: Callable[[], None]
    ) -> tuple[BuildStats, SnapshotResult]:
        """Build `request.store`'s version in its worker and write its snapshot; `may_write` is called
        between the two and raises to stop the write (the lease was lost). Raises what the build raised:
        `CheckpointFileExistsError` as such, anything else as `BuildProcessError` naming the store."""
        worker = self._workers[self.worker_of(fm.root_uri, request.store)]
        with worker.lock:
            conn = worker.started()
            try:
                conn.send_bytes(request.to_json(fm.root_uri))
                reply = json.loads(conn.recv_bytes())
                if reply.get("built"):
                    try:
                        may_write()
                    except BaseException:
                        conn.send_bytes(b'{"write": false}')
                        conn.recv_bytes()
                        raise
                    conn.send_bytes(b'{"write": true}')
                    reply = json.loads(conn.recv_bytes())
            except (EOFError, OSError) as e:
                process = worker.process
                worker.stop(timeout=1.0)
                code = None if process is None else process.exitcode
                raise BuildProcessError(
                    f"the snapshot build process of store {request.store} (pid "
                    f"{None if process is None else process.pid}) ended (exit code {code}): {type(e).__name__} {e}"
                ) from None
        return _result(request.store, reply)

    def close(self) -> None:
        for worker in self._workers:
            with worker.lock:
                worker.stop()


def _result(store: StoreId, reply: dict[str, Any]) -> tuple[BuildStats, SnapshotResult]:
    error = reply.get("error")
    if error is not None:
        if error == CheckpointFileExistsError.__name__:
            raise CheckpointFileExistsError(reply["message"])
        raise BuildProcessError(f"snapshot build of store {store}: {error}: {reply['message']}")
    s, r = reply["stats"], reply["result"]
    manifest = SnapshotManifest.from_bytes(base64.b64decode(r["manifest"]), r["manifest_path"])
    stats = BuildStats(**s)
    result = SnapshotResult(
        r["manifest_path"], manifest, r["uploaded_files"], r["uploaded_bytes"], r["reused_files"], r["seconds"]
    )
    return stats, result


_pool_lock = threading.Lock()
_pool: BuildProcesses | None = None


def build_processes(processes: int) -> BuildProcesses:
    """This process's workers (started on first use, `processes` of them; closed at exit)."""
    global _pool
    with _pool_lock:
        if _pool is None or len(_pool) != processes:
            if _pool is not None:
                _pool.close()
            else:
                # Closed at exit by multiprocessing's exit function (atexit runs it in a main process; a process
                # that multiprocessing started, as Dagster's code server starts each run, runs it instead of
                # atexit). It terminates its daemonic children, which these workers ignore, then joins them without
                # a timeout, while their pipes are still open; a finalizer with an exit priority runs before that,
                # so the workers see their pipes close and exit, releasing their replicas' locks.
                multiprocessing.util.Finalize(None, close_build_processes, exitpriority=100)
            _pool = BuildProcesses(processes)
        return _pool


def running_build_processes() -> list[int]:
    """The process ids of this process's build workers now (none when builds run on threads)."""
    with _pool_lock:
        return [] if _pool is None else _pool.pids()


def close_build_processes() -> None:
    """Stop this process's build workers (they close their replicas; the directories stay)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close()
            _pool = None


# -- the worker side ------------------------------------------------------------------------------


def serve(conn: Connection, levels: Mapping[str, int]) -> None:
    """A worker's loop: one build request at a time until its pipe closes. `levels`: the maintainer's
    logging levels (root, and this package's), so the worker logs what the maintainer would, to its stderr."""
    # Ctrl-C, or a service manager's SIGTERM to the whole group, stops the maintainer, which finishes its
    # root's cycle (these builds included) and then closes the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        level=levels.get("", logging.WARNING), format="%(levelname)s %(name)s [%(processName)s]: %(message)s"
    )
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    fms: dict[str, CheckpointFileManager] = {}
    try:
        while True:
            try:
                raw = conn.recv_bytes()
            except (EOFError, OSError):
                return
            try:
                reply = _build(json.loads(raw), fms, conn)
            except Exception as e:
                log.debug("snapshot build failed", exc_info=True)
                reply = {"error": type(e).__name__, "message": str(e)}
            conn.send_bytes(json.dumps(reply).encode())
    finally:
        close_replicas()


def _build(req: dict[str, Any], fms: dict[str, CheckpointFileManager], conn: Connection) -> dict[str, Any]:
    fm = fms.get(req["root"])
    if fm is None:
        fm = fms[req["root"]] = open_file_manager(req["root"])

    def ask_maintainer() -> None:
        conn.send_bytes(b'{"built": true}')
        if not json.loads(conn.recv_bytes())["write"]:
            raise BuildProcessError("not written: the maintainer lost the lease")

    stats, result = BuildRequest.from_json(req, fm).build_and_write(fm, ask_maintainer)
    return {
        "stats": asdict(stats),
        "result": {
            "manifest_path": result.manifest_path,
            "manifest": base64.b64encode(result.manifest.to_bytes()).decode(),
            "uploaded_files": result.uploaded_files,
            "uploaded_bytes": result.uploaded_bytes,
            "reused_files": result.reused_files,
            "seconds": result.seconds,
        },
    }


class _ManifestsOnDemand(Mapping[int, SnapshotManifest]):
    """The intact snapshots a build may start from, each read from the root when a cold build asks for it:
    a warm build (nearly all of them) reads none, and the maintainer sends only their names."""

    def __init__(self, fm: CheckpointFileManager, store: StoreId, ids: Mapping[int, str]) -> None:
        self._fm, self._store, self._ids = fm, store, ids
        self._read: dict[int, SnapshotManifest] = {}

    def __getitem__(self, version: int) -> SnapshotManifest:
        manifest = self._read.get(version)
        if manifest is None:
            manifest = self._read[version] = read_manifest(self._fm, self._store, version, self._ids[version])
        return manifest

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)


__all__ = [
    "BuildProcessError",
    "BuildProcesses",
    "BuildRequest",
    "build_processes",
    "close_build_processes",
    "running_build_processes",
    "serve",
]
