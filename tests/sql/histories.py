"""Real checkpoint histories written by the store, with a model of every committed version's state.

`History.run()` commits batches on every partition of every operator, with retried attempts whose
ids lose (the commit record names another attempt), snapshots written by `statekeeper.store.snapshot`, and
optionally a pending attempt of the next version. `on_step` is called between every write, so a
test can sync the catalog at any interleaving.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from statekeeper.store import CommitLog, StateStore, StoreConfig, open_file_manager
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import StoreId, commit_path
from statekeeper.store.snapshot import write_snapshot

State = dict[bytes, bytes]


@dataclass
class History:
    root: str
    operators: dict[str, int] = field(default_factory=lambda: {"agg": 2, "join": 1})
    seed: int = 7
    on_step: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.fm: CheckpointFileManager = open_file_manager(self.root)
        self.log = CommitLog(self.fm)
        self.rng = random.Random(self.seed)
        self.work = tempfile.mkdtemp(prefix="sk-history-")
        self.stores: dict[tuple[str, int], StateStore] = {}
        for op, n in self.operators.items():
            for p in range(n):
                cfg = StoreConfig(local_dir=f"{self.work}/{op}-{p}")
                self.stores[(op, p)] = StateStore(self.fm, op, p, config=cfg)
        # model: committed states, committed ids, losing ids, snapshots
        self.states: dict[tuple[str, int], dict[int, State]] = {k: {0: {}} for k in self.stores}
        self.committed: dict[int, dict[str, list[str]]] = {}
        self.losing: list[tuple[str, int, int, str]] = []
        self.snapshots: dict[tuple[str, int], list[int]] = {k: [] for k in self.stores}
        self.pending: list[tuple[str, int, int, str]] = []
        self.version = 0

    def _step(self, what: str) -> None:
        if self.on_step is not None:
            self.on_step(what)

    def close(self) -> None:
        for s in self.stores.values():
            s.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def _updates(self, version: int) -> tuple[State, list[bytes]]:
        puts = {
            f"k{self.rng.randrange(40):03d}".encode(): f"v{version}-{self.rng.random():.6f}".encode() for _ in range(6)
        }
        dels = [f"k{self.rng.randrange(40):03d}".encode() for _ in range(2)]
        return puts, [d for d in dels if d not in puts]

    def _attempt(self, key: tuple[str, int], version: int) -> tuple[str, State]:
        """One commit attempt of `version + 1` on top of committed `version`; returns (id, new state)."""
        store = self.stores[key]
        store.load(version, self.committed_id(key, version))
        state = dict(self.states[key][version])
        puts, dels = self._updates(version)
        for k, v in puts.items():
            store.put(k, v)
            state[k] = v
        for k in dels:
            store.delete(k)
            state.pop(k, None)
        result = store.commit()
        assert result.version == version + 1
        self._step(f"changelog {key} v{version + 1}")
        return result.checkpoint_id, state

    def committed_id(self, key: tuple[str, int], version: int) -> str | None:
        if version == 0:
            return None
        return self.committed[version][key[0]][key[1]]

    def batch(self, *, retry: bool = False, snapshot: bool = False) -> int:
        """Commit version `self.version + 1` on every store; `retry` adds a losing attempt per store."""
        v = self.version
        ids: dict[str, list[str]] = {op: [""] * n for op, n in self.operators.items()}
        for key in self.stores:
            cid, state = self._attempt(key, v)
            if retry:
                other, other_state = self._attempt(key, v)
                # The winner is picked at random, so the store's local DB sometimes holds the loser.
                if self.rng.random() < 0.5:
                    self.losing.append((*key, v + 1, other))
                else:
                    self.losing.append((*key, v + 1, cid))
                    cid, state = other, other_state
            ids[key[0]][key[1]] = cid
            self.states[key][v + 1] = state
        self.log.commit(v + 1, ids)
        self.committed[v + 1] = ids
        self.version = v + 1
        self._step(f"commit v{v + 1}")
        if snapshot:
            for key in self.stores:
                self.snapshot(key)
        return self.version

    def snapshot(self, key: tuple[str, int], version: int | None = None) -> None:
        version = self.version if version is None else version
        store = self.stores[key]
        cid = self.committed_id(key, version)
        assert cid is not None
        store.load(version, cid)  # the local DB holds exactly (version, cid); the attempt is aborted below
        write_snapshot(self.fm, StoreId(*key), version, cid, store.db, self.work)
        store.abort()
        self.snapshots[key].append(version)
        self._step(f"snapshot {key} v{version}")

    def pending_attempt(self, key: tuple[str, int]) -> str:
        """A changelog of the next version that is not committed (yet)."""
        cid, _ = self._attempt(key, self.version)
        self.pending.append((*key, self.version + 1, cid))
        return cid

    def run(self, batches: int = 8, *, retry_every: int = 3, snapshot_every: int = 4) -> History:
        for i in range(1, batches + 1):
            self.batch(
                retry=retry_every > 0 and i % retry_every == 0, snapshot=snapshot_every > 0 and i % snapshot_every == 0
            )
        return self

    def store_keys(self) -> list[tuple[str, int]]:
        return sorted(self.stores)

    def commit_file(self, version: int) -> str:
        return commit_path(version)
