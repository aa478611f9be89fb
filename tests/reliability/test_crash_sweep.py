"""The crash-point sweep (DESIGN invariants 1, 3, 4, 6, 8): kill -9 at the points of `statekeeper.store.faults`
every scenario reaches, on local disk and on S3 (moto on 127.0.0.1), then recover and check that
nothing committed was lost (`tests/reliability/sweep.py`).

The default run kills a sample spread evenly over each scenario's trace, locally (>= 100 distinct
kills); the slow run kills at every point of every scenario with 8 partitions per scenario (more
stores, more points), local and S3 (>= 1,000, as `make reliability` reports in docs/reliability.md).
The sweep runs in its own single-threaded process that forks a child per kill, so that the S3
server thread of this process is never forked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.scenarios import SCENARIOS

REPO = Path(__file__).resolve().parents[2]
SWEEP_TIMEOUT_SECONDS = 4 * 3600
"""The whole sweep (>= 1,000 kills) takes 1-2 hours on 2 cores."""
SAMPLE = 10
"""Kill points per scenario in the default run (spread evenly over each trace): 11 scenarios, >= 100 kills."""


def run_sweep(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, "-m", "tests.reliability.sweep", str(out), "--work", str(tmp_path / "work"), *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_SECONDS, check=False)
    assert out.exists(), f"the sweep did not finish: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-5000:]}"
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["problems"] == [], "\n\n".join(result["problems"])
    assert result["lost"] == 0
    assert proc.returncode == 0, proc.stderr[-5000:]
    return result


@pytest.mark.timeout(1200)  # ~6 minutes on a loaded 2-core machine
def test_crash_point_sweep_sample(tmp_path: Path) -> None:
    result = run_sweep(tmp_path, "--kinds", "local", "--sample", str(SAMPLE))
    assert set(result["kills"]) == set(SCENARIOS)
    assert result["total_kills"] >= 100, result["kills"]
    # expiry really deletes (load_grace_seconds=0 in scenarios.settings): it reaches a full sample
    assert result["traced"]["expiry"]["local"] >= SAMPLE and result["kills"]["expiry"]["local"] == SAMPLE
    assert {"local.publish", "local.published", "local.delete", "catalog.transaction"} <= set(result["points"])


@pytest.mark.slow
@pytest.mark.timeout(SWEEP_TIMEOUT_SECONDS + 60)
def test_crash_point_sweep_every_point(tmp_path: Path, s3_bucket: str) -> None:
    result = run_sweep(tmp_path, "--kinds", "local,s3", "--s3-bucket", s3_bucket, "--partitions", "8")
    traced = sum(n for kinds in result["traced"].values() for n in kinds.values())
    assert result["total_kills"] + result["not_reached"] == traced
    assert result["total_kills"] >= 1000, result["kills"]
    assert {"s3.put", "s3.delete", "upload.run", "rocks.checkpoint"} <= set(result["points"])
