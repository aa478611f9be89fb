"""`python -m bench [--quick] [name ...]`: run benchmark suites, print, store and document them."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from bench.report import machine, render_doc, save


def available() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in Path(__file__).parent.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"suites to run (default: all of {available()})")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    names = args.names or available()
    unknown = set(names) - set(available())
    if unknown:
        parser.error(f"unknown suite(s) {sorted(unknown)}; available: {available()}")
    for name in names:
        module = importlib.import_module(f"bench.bench_{name}")
        measured_on = machine()
        tables = module.run(quick=args.quick)
        for t in tables:
            print(t.markdown())
        if not args.quick:
            path = save(name, tables, f"python -m bench {name}", measured_on)
            print(f"results: {path}")
    if not args.quick:
        render_doc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
