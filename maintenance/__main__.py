"""`python -m statekeeper.maintenance ...` is the `statekeeper` command line."""

import sys

from statekeeper.maintenance.cli import main

sys.exit(main())
