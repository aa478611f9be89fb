"""A streaming job in its own process, for the concurrency test: `python -m tests.maintenance.writer_proc
ROOT BATCHES OUT_JSON PAUSE_SECONDS`. Each batch every store commits the scripted updates (sometimes after a losing
retry), the driver writes the commit record; every few batches the job "restarts" (wipes its local
state) so the next load rebuilds from the checkpoint, i.e. from whatever maintenance left there.
It checks every state it loads against the script and exits 1 on any difference or error."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from statekeeper.store import CommitLog, StateStore, StoreConfig
from statekeeper.store.files import open_file_manager
from tests.maintenance.helpers import content, scripted_state, scripted_updates

PARTITIONS = 2


def main(root: str, batches: int, out: str, pause: float) -> int:
    fm = open_file_manager(root)
    log = CommitLog(fm)
    work = tempfile.mkdtemp(prefix="sk-writer-")
    rng = random.Random(7)
    config = StoreConfig(block_bytes=1024, snapshot_check_interval=2)

    def instance(p: int) -> StateStore:
        return StateStore(
            fm, "agg", p, config=StoreConfig(**{**config.__dict__, "local_dir": tempfile.mkdtemp(dir=work)})
        )

    stores = [instance(p) for p in range(PARTITIONS)]
    ids: list[list[str]] = [["", ""]]
    rebuilds = 0
    try:
        for v in range(batches):
            winners = []
            for p in range(PARTITIONS):
                if rng.random() < 0.3:  # a task attempt that loses (retried)
                    loser = instance(p).load(v, ids[v][p] or None)
                    loser.put(b"loser", b"x")
                    loser.commit()
                    loser.close()
                s = stores[p].load(v, ids[v][p] or None)
                if s.last_load is not None and not s.last_load.reused_local:
                    rebuilds += 1
                    if content(s) != scripted_state(p, v):
                        print(f"version {v} of partition {p} loaded wrong state", file=sys.stderr)
                        return 1
                for cf, k, val in scripted_updates(p, v + 1):
                    if val is None:
                        s.delete(k, cf=cf)
                    else:
                        s.put(k, val, cf=cf)
                winners.append(s.commit().checkpoint_id)
            log.commit(v + 1, {"agg": winners})
            ids.append(winners)
            time.sleep(pause)
            if v % 6 == 5:  # a restart: the next load rebuilds from the checkpoint
                for s in stores:
                    s.close()
                shutil.rmtree(work, ignore_errors=True)
                os.makedirs(work)
                stores = [instance(p) for p in range(PARTITIONS)]
    finally:
        for s in stores:
            s.close()
        shutil.rmtree(work, ignore_errors=True)
    with open(out, "w") as f:
        json.dump({"ids": ids, "rebuilds": rebuilds}, f)
    return 0


def spawn(root: str, batches: int, out: Path, pause: float) -> subprocess.Popen[str]:
    """This job in its own process (stderr piped, for the test's failure message)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.maintenance.writer_proc", root, str(batches), str(out), str(pause)],
        cwd=Path(__file__).resolve().parents[2],
        env=dict(os.environ),
        stderr=subprocess.PIPE,
        text=True,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])))
