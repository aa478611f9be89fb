"""Running a benchmark as the smoke tests do: ``python -m MODULE ARGS`` in a child process, its scratch
files under the test's tmp dir, failing the test with the child's stderr when it fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(tmp_path: Path, args: list[str], *, module: str = "bench", timeout: float = 300) -> str:
    """`python -m MODULE ARGS` from the repository root with ``TMPDIR`` = `tmp_path`; its stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout
