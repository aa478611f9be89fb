"""The same job against an S3 checkpoint root (moto's server over HTTP), with async checkpointing.

Runs in its own process: Spark's Python workers take the S3 settings from the environment the JVM
was started with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from statekeeper.store import CommitLog, StateStore, StoreConfig, open_file_manager
from statekeeper.store.spark.state_view import StateView
from testkit.spark import ROOT, spark_env
from tests.spark.helpers import reference, write_inputs


def test_async_job_on_an_s3_root(s3_bucket: str, tmp_path: Path) -> None:
    batches = write_inputs(tmp_path / "in", files=3, rows=200, keys=25, seed=31)
    root = f"s3://{s3_bucket}/sessions"
    log = tmp_path / "job.log"
    args = [str(tmp_path / "in"), root, str(tmp_path / "ckpt"), str(tmp_path / "out"), "0", "0", "async"]
    env = {**os.environ, **spark_env(), "STATEKEEPER_SPARK_LOCAL_DIR": str(tmp_path / "local")}
    with log.open("wb") as out:
        rc = subprocess.run(
            [sys.executable, "-m", "tests.spark.driver_job", *args],
            check=False,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
            timeout=300,
        ).returncode
    assert rc == 0, log.read_text()[-3000:]

    fm = open_file_manager(root)
    assert CommitLog(fm).latest() == 3
    got: dict[str, Any] = {}
    for p in range(3):
        store = StateStore(root, "counts", p, config=StoreConfig(local_dir=str(tmp_path / f"check{p}"))).load(3)
        for key, _, v, _ in StateView(store).rows("totals"):
            got[key[0]] = v
        store.close()
    assert got == reference(batches)
    assert '"async_checkpoint": true' in log.read_text()
    for b in range(3):
        assert json.loads((tmp_path / "out" / f"batch-{b:05d}.json").read_text())
