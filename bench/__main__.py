"""`python -m bench [--list] [--quick] [name ...]`: run benchmark suites, print, store and document them."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from bench.report import machine, render_doc, save
from bench.suites import SUITES, listing


def available() -> list[str]:
    return sorted(SUITES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"suites to run (default: all of {available()})")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--list", action="store_true", help="list the suites and the question each answers")
    args = parser.parse_args(argv)
    if args.list:
        print(listing(SUITES))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    names = args.names or available()
    unknown = set(names) - set(available())
    if unknown:
        parser.error(f"unknown suite(s) {sorted(unknown)}; available: {available()}")
    for name in names:
        module = importlib.import_module(SUITES[name])
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
