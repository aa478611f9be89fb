"""A small streaming "job" for maintenance tests: batches over a few stores, with losing attempts,
pending attempts and a dict model of every committed version, plus checks against the model."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.plan import plan_root
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.files import open_file_manager
from statekeeper.store.layout import StoreId

State = dict[str, dict[bytes, bytes]]
CFS = ("default", "counts")


def normalise(s: State) -> State:
    return {cf: dict(kv) for cf, kv in s.items() if kv}


def content(store: StateStore) -> State:
    return normalise({cf: dict(store.items(cf=cf)) for cf in store.column_families()})


@dataclass
class History:
    """Writes batches to `root` like a streaming query, remembering every committed state."""

    root: str
    operators: dict[str, int] = field(default_factory=lambda: {"agg": 2})
    seed: int = 0
    keys: int = 30
    config: StoreConfig = field(default_factory=lambda: StoreConfig(block_bytes=1024, snapshot_check_interval=3))

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.work = tempfile.mkdtemp(prefix="sk-history-")
        self.fm = open_file_manager(self.root)
        self.commit_log = CommitLog(self.fm)
        self.stores = [StoreId(op, p) for op, n in sorted(self.operators.items()) for p in range(n)]
        self.instances: dict[StoreId, StateStore] = {s: self._instance(s, "w") for s in self.stores}
        # committed[v][store] = (checkpoint id, state); version 0 is empty
        self.committed: list[dict[StoreId, tuple[str, State]]] = [{s: ("", {}) for s in self.stores}]
        self.pending: list[tuple[StoreId, int, str]] = []

    def _instance(self, s: StoreId, tag: str) -> StateStore:
        local = tempfile.mkdtemp(prefix=f"{s.operator}-{s.partition}-{tag}-", dir=self.work)
        return StateStore(
            self.fm, s.operator, s.partition, config=StoreConfig(**{**self.config.__dict__, "local_dir": local})
        )

    @property
    def latest(self) -> int:
        return len(self.committed) - 1

    def _updates(self) -> list[tuple[str, bytes, bytes | None]]:
        out: list[tuple[str, bytes, bytes | None]] = []
        for _ in range(self.rng.randint(1, 8)):
            cf = self.rng.choice(CFS)
            k = b"k%d" % self.rng.randrange(self.keys)
            v = None if self.rng.random() < 0.2 else os.urandom(self.rng.randint(0, 24))
            out.append((cf, k, v))
        return out

    def _attempt(self, inst: StateStore, s: StoreId, v: int) -> tuple[str, State]:
        ckpt, state = self.committed[v][s]
        inst.load(v, ckpt or None)
        model = {cf: dict(kv) for cf, kv in state.items()}
        for cf, k, val in self._updates():
            if val is None:
                inst.delete(k, cf=cf)
                model.setdefault(cf, {}).pop(k, None)
            else:
                inst.put(k, val, cf=cf)
                model.setdefault(cf, {})[k] = val
        return inst.commit().checkpoint_id, normalise(model)

    def batch(self, *, losing: int = 0, commit: bool = True) -> int:
        """One batch: `losing` extra attempts per store that lose, then the winners (committed if `commit`)."""
        v = self.latest
        for s in self.stores:
            for _ in range(losing):
                probe = self._instance(s, "lose")
                try:
                    self._attempt(probe, s, v)
                finally:
                    probe.close()
                    shutil.rmtree(probe.local_dir, ignore_errors=True)
        winners = {s: self._attempt(self.instances[s], s, v) for s in self.stores}
        if not commit:
            for s, (ckpt, _) in winners.items():
                self.pending.append((s, v + 1, ckpt))
                self.instances[s].close()
                shutil.rmtree(self.instances[s].local_dir, ignore_errors=True)
                self.instances[s] = self._instance(s, "w")
            return v
        ids: dict[str, list[str]] = {}
        for s in self.stores:
            ids.setdefault(s.operator, []).append(winners[s][0])
        self.commit_log.commit(v + 1, ids)
        self.committed.append(winners)
        self.pending = [p for p in self.pending if p[1] > v + 1]
        return v + 1

    def batches(self, n: int, **kw: object) -> None:
        for _ in range(n):
            self.batch(**kw)  # type: ignore[arg-type]

    def retained(self, settings: MaintenanceSettings) -> list[int]:
        return list(range(max(1, self.latest - settings.min_versions_to_retain + 1), self.latest + 1))

    def check_loadable(self, versions: Iterable[int], stores: Iterable[StoreId] | None = None) -> None:
        """Every given version of every store loads, in a fresh instance, to the model's state."""
        for s in stores or self.stores:
            probe = self._instance(s, "check")
            try:
                for v in versions:
                    ckpt, state = self.committed[v][s]
                    probe.load(v, ckpt)
                    got = content(probe)
                    assert got == state, f"version {v} of store {s} differs from the model"
                    probe.abort()
            finally:
                probe.close()
                shutil.rmtree(probe.local_dir, ignore_errors=True)

    def close(self) -> None:
        for inst in self.instances.values():
            inst.close()
        shutil.rmtree(self.work, ignore_errors=True)


def small_settings(work_dir: str) -> MaintenanceSettings:
    """Small numbers so a few batches exercise every rule; no grace period (the maintenance suites' settings)."""
    return MaintenanceSettings(
        snapshot_threshold=4,
        min_versions_to_retain=3,
        orphan_grace_seconds=0,
        load_grace_seconds=0,
        parallelism=2,
        lease_ttl_seconds=30,
        work_dir=work_dir,
    )


def snapshotted_history(make_history: Callable[..., History], settings: MaintenanceSettings) -> History:
    """Two stores with expirable history, losing attempts (orphans) and snapshots at versions 5 and 9."""
    h = make_history()
    h.batches(5, losing=1)
    create_snapshots(h.fm, settings)
    h.batches(4)
    create_snapshots(h.fm, settings)
    h.batches(2)
    return h


def leftovers(root: str, settings: MaintenanceSettings) -> list[str]:
    """Files that are neither needed by a retained version nor possibly in flight (should be none
    after expiry and orphan cleanup with a grace period of 0)."""
    inv = Inventory.scan(open_file_manager(root))
    rp = plan_root(inv, settings)
    out = [e.path for e in rp.expired_commits] + [e.path for e, _ in rp.orphans]
    for p in rp.stores.values():
        out += [e.path for e in p.expired] + [e.path for e, _ in p.orphans]
    return sorted(out)


def all_files(root: str) -> dict[str, int]:
    return {i.path: i.size for i in open_file_manager(root).list("")}


def clobber(root: str, path: str, data: bytes | None) -> None:
    """Replace (or with None delete) a file behind the file manager's back: what corruption looks like.

    Clears the maintenance caches of parsed files: they are keyed by (path, size, mtime), and S3's
    one-second mtime cannot tell a file damaged within a second of its creation.
    """
    from statekeeper.maintenance.inventory import clear_caches
    from statekeeper.store.files import LocalFileManager
    from statekeeper.store.files.s3 import WRITE_ID_META, S3FileManager

    clear_caches()
    fm = open_file_manager(root)
    if isinstance(fm, LocalFileManager):
        full = os.path.join(fm.root_path, path)
        if data is None:
            os.unlink(full)
        else:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(data)
        return
    assert isinstance(fm, S3FileManager)
    key = fm.key_prefix + path  # no validation: foreign names too
    if data is None:
        fm.client.delete_object(Bucket=fm.bucket, Key=key)
    else:
        # a finished publish, as it appears on every store (verify_published looks for the write id)
        fm.client.put_object(Bucket=fm.bucket, Key=key, Body=data, Metadata={WRITE_ID_META: "test"})


def scripted_updates(store_index: int, version: int) -> list[tuple[str, bytes, bytes | None]]:
    """The updates batch `version - 1` makes to a store, a pure function so another process can replay it."""
    rng = random.Random(store_index * 1_000_003 + version)
    out: list[tuple[str, bytes, bytes | None]] = []
    for _ in range(rng.randint(1, 12)):
        key = b"k%d" % rng.randrange(60)
        value = None if rng.random() < 0.15 else b"v%d-%d-" % (version, store_index)
        out.append((rng.choice(CFS), key, value))
    return out


def scripted_state(store_index: int, version: int) -> State:
    """The state of a store at `version` under `scripted_updates`."""
    state: State = {}
    for v in range(1, version + 1):
        for cf, k, val in scripted_updates(store_index, v):
            if val is None:
                state.setdefault(cf, {}).pop(k, None)
            else:
                state.setdefault(cf, {})[k] = val
    return normalise(state)
