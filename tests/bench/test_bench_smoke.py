"""Smoke test of the benchmarks: `python -m bench --quick store commit` runs and prints its tables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_benchmarks_run_and_print_tables(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the suites' scratch DBs go under pytest's tmp dir
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "store", "commit"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    for title in (
        "### Store vs raw rocksdict: throughput",
        "### Where a batch put's time goes",
        "### Typed state codec vs pickle",
        "### Commit latency vs state size",
        "### Commit latency at a steady",
        "### Commit latency vs batch size",
    ):
        assert title in out, f"missing table {title!r} in:\n{out}"
    for op in ("| put |", "| get |", "| delete |", "| multi-get |", "| batch put (random keys) |"):
        assert op in out, f"missing row {op!r}"
    assert "results:" not in out, "--quick must not overwrite bench/results"
    assert list(tmp_path.iterdir()) == [], "benchmarks left scratch files behind"
