"""The fleet's versions as the sustain mode publishes them: written first, off the clock, then published into the
root at the rate asked by a process of its own (`Publisher`), each version hard-linked in when its time comes, its
changelogs first and its commit record last, as writers on other hosts commit all along."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fleet.writers import FleetWriters
from statekeeper.maintenance.progress import bar
from statekeeper.store.layout import COMMITS_DIR


def write_versions(stores: int, keys: int, updates: int, where: Path, versions: int, base: Path) -> list[Path]:
    """Every version of every store, in `where`/n (version n+1's files), written unless `where` has them (the same
    fleet, as many versions or more); `base`: scratch space on the same filesystem."""
    fleet = {"stores": stores, "keys": keys, "updates": updates}
    done = where / "fleet.json"
    stored = json.loads(done.read_text()) if done.exists() else {}
    if {k: stored.get(k) for k in fleet} == fleet and stored.get("versions", 0) >= versions:
        return [where / str(n) for n in range(versions + 1)]
    shutil.rmtree(where, ignore_errors=True)
    stage = base / "stage"
    stage.mkdir()
    with FleetWriters([stage.as_uri()], stores, 2, keys, updates, str(base / "writers")) as writers:
        progress = bar(True, "writing the versions", versions + 1, "version")
        for n in range(versions + 1):
            writers.commit_next()
            move_tree(stage, where / str(n))
            progress.update()
        progress.close()
    done.write_text(json.dumps({**fleet, "versions": versions}))
    return [where / str(n) for n in range(versions + 1)]


def move_tree(src: Path, dst: Path, *, link: bool = False) -> None:
    """Move (`link`: hard-link) every file under `src` to the same relative path under `dst`, the commit records
    last (a version is committed once its record is there: a listing meanwhile sees its changelogs in flight)."""
    walked = sorted(os.walk(src), key=lambda d: Path(d[0]).relative_to(src).parts[:1] == (COMMITS_DIR,))
    for dirpath, _, files in walked:
        if not files:
            continue
        target = dst / Path(dirpath).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if link:
                os.link(os.path.join(dirpath, name), target / name)
            else:
                os.rename(os.path.join(dirpath, name), target / name)


@dataclass(frozen=True)
class Shared:
    """What the publisher process and the maintainer's share: the versions published, the `perf_counter` time the
    versions' clock started (0 until the warm-up ends) and the seconds taken off it, and the lock a publishing step
    and a sample hold (the clock stops while a sample pauses the loop)."""

    published: Any
    t0: Any
    off_wall: Any
    pause: Any

    def due_by(self, t: float, per_store: float) -> int:
        """The versions due at `perf_counter` time `t` (never fewer than those published); `perf_counter` is the
        system's monotonic clock on Linux, the same in both processes."""
        return max(int(self.published.value), 1 + int((t - self.t0.value - self.off_wall.value) * per_store))


def publish_up_to(held: list[Path], root: Path, shared: Shared, end: int) -> None:
    """Hard-link the versions before `held[end]` not yet in the root, in order."""
    for n in range(shared.published.value, end):
        move_tree(held[n], root, link=True)
        shared.published.value = n + 1


def _publish(held: list[Path], root: Path, per_store: float, shared: Shared, stop: Any, ran_out: Any) -> None:
    """The publisher process: each version when its time comes, as writers commit all along, until `stop` or the
    versions run out (`ran_out`)."""
    while not stop.is_set():
        with shared.pause:
            due = shared.due_by(time.perf_counter(), per_store)
            if due > len(held):
                ran_out.set()
                return
            publish_up_to(held, root, shared, due)
            wait = shared.published.value / per_store - (time.perf_counter() - shared.t0.value - shared.off_wall.value)
        stop.wait(max(0.0, wait))


class Publisher:
    """The versions published from the end of the warm-up at the rate asked, by a process of its own (`_publish`);
    a thread of this process stops the maintainer (`stop`) once the versions run out."""

    _ctx = multiprocessing.get_context("spawn")

    def __init__(self, held: list[Path], root: Path, per_store: float, shared: Shared) -> None:
        self._stop, self.ran_out = self._ctx.Event(), self._ctx.Event()
        self._process = self._ctx.Process(
            target=_publish, args=(held, root, per_store, shared, self._stop, self.ran_out), name="publisher"
        )
        self._watch: threading.Thread | None = None
        self.pid: int | None = None

    @classmethod
    def shared(cls) -> Shared:
        return Shared(cls._ctx.Value("q", 1), cls._ctx.Value("d", 0.0), cls._ctx.Value("d", 0.0), cls._ctx.Lock())

    def start(self, maintainer_stop: threading.Event) -> None:
        self._process.start()
        self.pid = self._process.pid

        def watch() -> None:
            while not maintainer_stop.is_set() and self._process.is_alive():
                if self.ran_out.wait(0.2):
                    break
            maintainer_stop.set()

        self._watch = threading.Thread(target=watch, name="publisher-watch", daemon=True)
        self._watch.start()

    def stop(self) -> None:
        self._stop.set()
        if self.pid is not None:
            self._process.join()
        if self._watch is not None:
            self._watch.join()
