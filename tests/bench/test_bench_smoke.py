"""Smoke test of the benchmarks: `python -m bench --quick store commit` runs and prints its tables."""

from __future__ import annotations

from pathlib import Path

from tests.bench.run import run_bench


def test_quick_benchmarks_run_and_print_tables(tmp_path: Path) -> None:
    out = run_bench(tmp_path, ["--quick", "store", "commit", "catalog"])  # the suites' scratch DBs go under tmp_path
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
