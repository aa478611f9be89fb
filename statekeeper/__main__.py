"""The `statekeeper` console script (and ``python -m statekeeper``): the maintenance command line.

Its own module outside ``statekeeper.maintenance``, whose import fails on a core-only install (the extra
``statekeeper[maintenance]`` is missing): the script then prints that error's one line naming the ``pip install``
that brings the extra, not a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from statekeeper.store.extras import MissingExtraError

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from statekeeper.maintenance.cli import main as cli_main
    except MissingExtraError as e:
        sys.stderr.write(f"statekeeper: {e}\n")
        return EXIT_USAGE
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
