"""Benchmarks, one suite per question: `make bench` (or `python -m bench [name ...]`); `python -m bench --list`
says which suite answers what (`bench.suites`).

Each suite defines `run(quick: bool) -> list[Table]`; every table compares statekeeper with a baseline measured
in the same run. Results go to bench/results/<name>.json and docs/benchmarks.md is regenerated from all result
files (`bench.report`). The fleet's suites live in `bench.fleet`; what benchmarks share with the tests (local S3,
Spark's environment and processors) is in `testkit`, never imported from `tests`.
"""
