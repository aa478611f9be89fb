"""Which suite answers what: the suites `python -m bench` runs, by name, and the question each answers.

A suite is a module with `run(quick: bool) -> list[Table]`; the first line of its docstring is its question, which
`python -m bench --list` prints (read from the source: listing imports no suite). Its name is the name of its
results (bench/results/<name>.json) and section of docs/benchmarks.md. `fleet`, `sustain` and `ceiling` answer one
question three ways, and live together in `bench.fleet`.
"""

from __future__ import annotations

import ast
import importlib.util

SUITES = {
    "store": "bench.store",
    "commit": "bench.commit",
    "catalog": "bench.catalog",
    "maintenance": "bench.maintenance",
    "rescale": "bench.rescale",
    "s3": "bench.s3",
    "spark": "bench.spark",
    "quiet_timers": "bench.spark_quiet_timers",
    "spark_import": "bench.spark_import",
    "fleet": "bench.fleet.beside",
    "sustain": "bench.fleet.sustain_suite",
    "ceiling": "bench.fleet.ceiling",
    "reliability": "bench.reliability",
}
"""Suite name -> its module."""


def question(module: str) -> str:
    """The first line of `module`'s docstring, read from its source without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module)
    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.split("\n", 1)[0]


def listing(modules: dict[str, str]) -> str:
    """One line per entry: its name and the question its module answers."""
    width = max(map(len, modules), default=0)
    return "\n".join(f"{name.ljust(width)}  {question(module)}  ({module})" for name, module in modules.items())
