"""Writing real checkpoints for the orchestration tests, with the store itself."""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any

from statekeeper.store import CommitLog, StateStore, StoreConfig


class CheckpointWriter:
    """A streaming job in miniature: `commit(n)` writes n batches over every partition of one operator."""

    def __init__(self, root: str, operator: str = "agg", partitions: int = 2, keys_per_batch: int = 5) -> None:
        self.root = root
        self.operator = operator
        self.keys_per_batch = keys_per_batch
        self._work = tempfile.TemporaryDirectory(prefix="sk-orch-writer-")
        self.stores = [
            StateStore(root, operator, p, config=StoreConfig(local_dir=os.path.join(self._work.name, f"p{p}")))
            for p in range(partitions)
        ]
        self.log = CommitLog(self.stores[0].fm)
        self.version = self.log.latest()

    def commit(self, batches: int = 1) -> int:
        """Commit `batches` versions; returns the newest committed version."""
        for _ in range(batches):
            ids = []
            for p, store in enumerate(self.stores):
                store.load(self.version)
                for i in range(self.keys_per_batch):
                    store.put(f"p{p}-k{(self.version * 7 + i) % 23}".encode(), f"v{self.version}-{i}".encode())
                ids.append(store.commit().checkpoint_id)
            self.version += 1
            self.log.commit(self.version, {self.operator: ids})
        return self.version

    def losing_attempt(self) -> str:
        """An attempt of the next version that will lose (its changelog stays as an orphan candidate)."""
        store = self.stores[0]
        store.load(self.version)
        store.put(b"loser", b"x")
        cid = store.commit().checkpoint_id
        return cid

    def close(self) -> None:
        for s in self.stores:
            s.close()
        self._work.cleanup()

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str]) -> int:
    """`python -m tests.orchestration.helpers ROOT BATCHES`: a tiny main job for run_local tests."""
    root, batches = argv[0], int(argv[1])
    with CheckpointWriter(root) as writer:
        version = writer.commit(batches)
    print(f"main job committed up to version {version} in {root}", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
