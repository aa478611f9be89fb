"""The example `make run` runs: a fresh run, then a resumed one, each checking exactly-once counts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.spark.conftest import ROOT, spark_env


def _run_example(work: Path, seconds: int) -> tuple[str, list[int]]:
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


def test_example_runs_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    work = tmp_path / "sessions"
    _, first = _run_example(work, 12)
    assert first and first[0] == 0
    out, second = _run_example(work, 8)  # the same work dir: resumes the query and its state
    # the next batch; or the one after, if the stop came after a commit record but before Spark's own
    # commit (then the resumed run re-delivers that batch to the sink as a [replay] first)
    assert second and first[-1] < second[0] <= first[-1] + 2, f"resumed at batch {second[:1]} after {first[-1]}"
    assert "Exception" not in out
