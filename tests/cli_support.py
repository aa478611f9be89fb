"""Running the `statekeeper` command line in a child process, as its users do.

The child gets its own ``STATEKEEPER_HOME`` (so its embedded catalog is the test's) and never the
developer's ``STATEKEEPER_DB_URL``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str,
    home: Path,
    check: int | None = 0,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m statekeeper.maintenance ARGS``; with `check`, the exit code it must end with."""
    full_env = {**os.environ, "STATEKEEPER_HOME": str(home), **(env or {})}
    full_env.pop("STATEKEEPER_DB_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "statekeeper.maintenance", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check is not None:
        assert proc.returncode == check, (
            f"statekeeper {' '.join(args)}: exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
            f"stderr:\n{proc.stderr[-4000:]}"
        )
    return proc
