"""The fleet's writers: writer processes committing every store of a fleet in lock step on the store API,
and each root's commit record as its query's driver writes it once every partition committed.

Stores are numbered 0..S-1 over the roots in order (store i is partition ``i % (S / R)`` of root
``i // (S / R)``) and dealt round-robin to the writer processes. `bench.fleet.beside` paces the versions on
a cadence beside a maintainer; `bench.fleet lockstep` runs a maintainer cycle between them.
"""

from __future__ import annotations

import multiprocessing
import os
import random
from multiprocessing.connection import Connection
from types import TracebackType

from bench.baselines import VALUE_BYTES

OPERATOR = "fleet"


def _writer_main(conn: Connection, stores: dict[int, tuple[str, int]], keys: int, updates: int, work: str) -> None:
    """One writer process: per message (version, committed ids), load, update and commit its stores
    (fleet index -> root and partition); version 0 writes every key (the bulk load)."""
    from statekeeper.store.state_store import StateStore, StoreConfig

    rng = random.Random(min(stores, default=0))
    keyspace = [b"k%015d" % i for i in range(keys)]
    opened = {
        i: StateStore(root, OPERATOR, part, config=StoreConfig(local_dir=os.path.join(work, f"s{i:05d}")))
        for i, (root, part) in stores.items()
    }
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            version, ids = msg
            out = {}
            for i, store_ in opened.items():
                store = store_.load(version, ids.get(i) or None)
                chosen = keyspace if version == 0 else rng.sample(keyspace, updates)
                raw = rng.randbytes(VALUE_BYTES * len(chosen))
                store.put_batch(chosen, [raw[j : j + VALUE_BYTES] for j in range(0, len(raw), VALUE_BYTES)])
                out[i] = store.commit().checkpoint_id
            conn.send(out)
    finally:
        for s in opened.values():
            s.close()


class FleetWriters:
    """`stores` stores spread evenly over the roots `uris`, committed by `writers` processes (spawned, so
    they hold no state of the caller); use as a context manager, which stops them."""

    def __init__(self, uris: list[str], stores: int, writers: int, keys: int, updates: int, work: str) -> None:
        from statekeeper.store.commit_log import CommitLog
        from statekeeper.store.files import open_file_manager

        if stores % len(uris):
            raise ValueError(f"{stores} stores do not spread evenly over {len(uris)} roots")
        self.per_root = stores // len(uris)
        self.version = 0
        """The version the next `commit_next` writes (0: the bulk load)."""
        self._ids: dict[int, str] = {}
        self._logs = [CommitLog(open_file_manager(uri)) for uri in uris]
        self._parts = [list(range(w, stores, writers)) for w in range(min(writers, stores))]
        ctx = multiprocessing.get_context("spawn")
        self._pipes: list[Connection] = []
        self._procs: list[multiprocessing.process.BaseProcess] = []
        for w, mine in enumerate(self._parts):
            parent, child = ctx.Pipe()
            assigned = {i: (uris[i // self.per_root], i % self.per_root) for i in mine}
            proc = ctx.Process(
                target=_writer_main,
                args=(child, assigned, keys, updates, os.path.join(work, f"writer{w}")),
                daemon=True,
            )
            proc.start()
            self._pipes.append(parent)
            self._procs.append(proc)

    def commit_next(self) -> None:
        """The next version of every store of every root: the writers' changelogs, then each root's record."""
        for conn, mine in zip(self._pipes, self._parts, strict=True):
            conn.send((self.version, {q: self._ids[q] for q in mine if q in self._ids}))
        new: dict[int, str] = {}
        for conn in self._pipes:
            new.update(conn.recv())
        for r, log_ in enumerate(self._logs):  # one streaming query per root, each its own driver's commit record
            log_.commit(self.version + 1, {OPERATOR: [new[r * self.per_root + q] for q in range(self.per_root)]})
        self._ids = new
        self.version += 1

    def close(self) -> None:
        for conn in self._pipes:
            conn.send(None)
        for proc in self._procs:
            proc.join(timeout=60)

    def __enter__(self) -> FleetWriters:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


__all__ = ["OPERATOR", "FleetWriters"]
