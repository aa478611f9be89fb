"""Smoke test of the maintenance benchmark: `python -m bench --quick maintenance` runs and prints its tables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_maintenance_benchmark(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "maintenance"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for title in ("### Recovery time of a", "### Snapshot creation", "### Expiry throughput"):
        assert title in proc.stdout, proc.stdout
    assert "results:" not in proc.stdout, "--quick must not overwrite bench/results"
    leftover = [p for p in tmp_path.iterdir() if not p.name.startswith("statekeeper-maintenance-")]
    assert leftover == [], "the benchmark left scratch files behind"
