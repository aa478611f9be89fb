"""`python -m bench.fleet MODE [flags]`: one configuration of the fleet suite in one of its modes, printed."""

from __future__ import annotations

import importlib
import sys

from bench.suites import listing

MODES = {
    "beside": "bench.fleet.beside",
    "sustain": "bench.fleet.sustain",
    "lockstep": "bench.fleet.lockstep",
    "caches": "bench.fleet.caches",
}
"""Mode -> the module whose `main(argv)` runs it."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in MODES:
        out = sys.stdout if argv and argv[0] in ("--list", "-h", "--help") else sys.stderr
        print(f"{__doc__}\n\nmodes (`python -m bench.fleet MODE --help` for its flags):\n{listing(MODES)}", file=out)
        return 0 if out is sys.stdout else 2
    result: int | None = importlib.import_module(MODES[argv[0]]).main(argv[1:])
    return result or 0


if __name__ == "__main__":
    sys.exit(main())
