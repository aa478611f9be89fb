"""Running the example `make run` runs (examples/session_count.py) in its own process, as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from testkit.spark import ROOT, spark_env


def run_example(work: Path, seconds: int) -> tuple[str, list[int]]:
    """Run the example on `work` for `seconds`; returns its output and the batches it committed.

    Fails unless it exits 0 and its exactly-once check (over this run and the ones before it) passes.
    """
    env = {
        **os.environ,
        **spark_env(),
        "WORK_DIR": str(work),
        "RUN_SECONDS": str(seconds),
        "ROWS_PER_SECOND": "300",
        "STATEKEEPER_SPARK_LOCAL_DIR": str(work.parent / "spark-local"),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "session_count.py")],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 0, f"example failed ({done.returncode}):\n{out[-3000:]}\n{done.stderr[-3000:]}"
    assert re.search(r"exactly-once check: \d+ events in state vs \d+ input rows committed: OK", out), out[-3000:]
    return out, [int(b) for b in re.findall(r"^batch\s+(\d+) \[commit\]", out, flags=re.MULTILINE)]
