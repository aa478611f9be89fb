"""Benchmarks: `make bench` (or `python -m bench [name ...]`).

Each `bench/bench_<name>.py` defines `run(quick: bool) -> list[Table]`; every table compares
statekeeper with a baseline measured in the same run. Results go to bench/results/<name>.json and
docs/benchmarks.md is regenerated from all result files.
"""
