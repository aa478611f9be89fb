"""`run_each` with lanes (the build processes of snapshot builds): every item runs once and its result comes back in
its place, each lane takes its items in order on its own share of the threads, and a lane whose items wait does not
hold up the others (a plain pool would give all its threads to the first items)."""

from __future__ import annotations

import contextvars
import threading
import time

from statekeeper.maintenance.workers import run_each

CALLER = contextvars.ContextVar("caller", default="")


def test_lanes_run_every_item_once_in_order_and_return_results_in_place() -> None:
    items = list(range(30))
    started: dict[int, list[int]] = {0: [], 1: [], 2: []}
    running = dict.fromkeys(started, 0)
    most = dict.fromkeys(started, 0)
    lock = threading.Lock()
    CALLER.set("cycle")

    def step(i: int) -> str:
        with lock:
            started[i % 3].append(i)
            running[i % 3] += 1
            most[i % 3] = max(most[i % 3], running[i % 3])
        time.sleep(0.002)
        with lock:
            running[i % 3] -= 1
        if i == 7:
            raise ValueError("seven")
        return f"{CALLER.get()}:{i}"

    results = run_each(items, step, parallelism=6, lane=lambda i: i % 3)
    assert [str(r) for r in results] == [f"cycle:{i}" if i != 7 else "seven" for i in items]
    assert isinstance(results[7], ValueError)
    for lane, seen in started.items():
        assert sorted(seen) == [i for i in items if i % 3 == lane]
        assert most[lane] <= 2, "a lane's share of 6 threads over 3 lanes is 2"
    # the two threads of a lane take its items in order: each item starts no later than two places after
    assert all(abs(seen.index(i) - n) <= 1 for seen in started.values() for n, i in enumerate(sorted(seen)))


def test_a_lane_whose_items_wait_does_not_hold_up_another() -> None:
    release = threading.Event()
    done: list[str] = []

    def step(item: str) -> str:
        if item.startswith("slow"):
            assert release.wait(10), "the other lane never finished while this one waited"
        else:
            done.append(item)
            if len(done) == 3:
                release.set()  # only once the fast lane is through: it did not wait behind the slow one
        return item

    items = ["slow-1", "slow-2", "fast-1", "fast-2", "fast-3"]
    assert run_each(items, step, parallelism=2, lane=lambda s: s.startswith("slow")) == items
    assert done == ["fast-1", "fast-2", "fast-3"]


def test_at_least_one_thread_a_lane() -> None:
    assert run_each(list(range(5)), lambda i: i * i, parallelism=2, lane=lambda i: i) == [0, 1, 4, 9, 16]
