"""`python -m maintenance ...` is the `statekeeper` command line."""

import sys

from maintenance.cli import main

sys.exit(main())
