"""Smoke test of the maintenance benchmark: `python -m bench --quick maintenance` runs and prints its tables."""

from __future__ import annotations

from pathlib import Path

from tests.bench.run import run_bench


def test_quick_maintenance_benchmark(tmp_path: Path) -> None:
    out = run_bench(tmp_path, ["--quick", "maintenance"])
    for title in ("### Recovery time of a", "### Snapshot creation", "### Expiry throughput"):
        assert title in out, out
    assert "results:" not in out, "--quick must not overwrite bench/results"
    leftover = [p for p in tmp_path.iterdir() if not p.name.startswith("statekeeper-maintenance-")]
    assert leftover == [], "the benchmark left scratch files behind"
