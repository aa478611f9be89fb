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


def test_the_list_says_which_suite_answers_what(tmp_path: Path) -> None:
    """`python -m bench --list`: a line per suite, its name and its question (its module docstring's first line)."""
    from bench.suites import SUITES

    lines = run_bench(tmp_path, ["--list"]).splitlines()
    assert [line.split()[0] for line in lines] == list(SUITES)
    assert all(line.rstrip(")").endswith(f"({SUITES[line.split()[0]]}") and "?" in line for line in lines), lines
    fleet = run_bench(tmp_path, ["--list"], module="bench.fleet")
    for mode in ("beside", "sustain", "lockstep", "caches"):
        assert f"\n{mode} " in fleet, fleet
