"""The long-running maintainer: cycles of snapshot, expiry and orphan cleanup in one process."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from statekeeper.maintenance.loop import CycleResult, maintain
from statekeeper.maintenance.settings import MaintenanceSettings
from tests.maintenance.helpers import History, all_files
from tests.maintenance.test_cli import run_cli


def test_cycles_snapshot_expire_and_clean(make_history: Callable[..., History], settings: MaintenanceSettings) -> None:
    h = make_history()
    h.batches(9, losing=1)
    assert maintain(h.root, settings, every=0, cycles=1)[0].reports[0].files > 0  # snapshots at 9
    h.batches(4, losing=1)
    seen: list[CycleResult] = []
    results = maintain(h.root, settings, every=0, cycles=2, on_cycle=seen.append)
    assert [r.cycle for r in results] == [1, 2] and seen == results and all(r.ok for r in results)
    first = {r.kind: r for r in results[0].reports}
    assert first["snapshot"].files > 0 and first["expire"].files > 0 and first["clean-orphans"].files > 0
    assert all(r.files == 0 for r in results[1].reports), "a second cycle finds nothing to do"
    h.check_loadable(h.retained(settings))
    stop = threading.Event()
    stop.set()
    assert maintain(h.root, settings, every=60, stop=stop) == []


def test_the_maintain_command(make_local_history: Callable[..., History], tmp_path: Path) -> None:
    h = make_local_history()
    h.batches(9)
    ops = ["--retain", "3", "--threshold", "4", "--grace", "0", "--load-grace", "0"]
    proc = run_cli("maintain", h.root, *ops, "--every", "0", "--cycles", "2", "--json", home=tmp_path / "home")
    docs = [json.loads(chunk) for chunk in proc.stdout.replace("}\n{", "}\x00{").split("\x00")]
    assert [d["cycle"] for d in docs] == [1, 2]
    assert [r["kind"] for r in docs[0]["reports"]] == ["snapshot", "expire", "clean-orphans"]
    assert any(p.endswith(".manifest") for p in all_files(h.root))
