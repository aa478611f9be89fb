"""Event-time timers across kill -9 of the driver and restarts: every timer fires exactly once, and each
batch's output is what the same processor gives in TwsTester (whose semantics the parity test pins to
PySpark's own transformWithState). Kills: after tasks committed but before the commit record (the batch
is re-run from its committed version), and after the commit record but before Spark's own commit (the
re-run must not fire the batch's timers again)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.spark.testing import TwsTester
from tests.spark.test_driver_kill import KillPoints, _kill_when, _start
from tests.spark.tws_processors import OUTPUT, Sessions

pytestmark = pytest.mark.slow

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def _files(directory: Path, n: int) -> list[list[dict[str, Any]]]:
    """File f: users u0..u5 with events around 10 s * f, so each batch's watermark fires earlier timers."""
    directory.mkdir(parents=True)
    batches = []
    for f in range(n):
        rows = [
            {"user": f"u{(f + i) % 6}", "page": f"p{i % 3}", "ts": T0 + dt.timedelta(seconds=10 * f + i)}
            for i in range(4)
        ]
        path = directory / f"part-{f:05d}.parquet"
        pq.write_table(
            pa.Table.from_pylist(rows).cast(
                pa.schema([("user", pa.string()), ("page", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
            ),
            path,
        )
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
        batches.append(rows)
    return batches


def test_event_time_timers_fire_exactly_once_across_driver_kills(spark: Any, tmp_path: Path) -> None:
    batches = _files(tmp_path / "in", 8)
    root = (tmp_path / "state").as_uri()
    ckpt = tmp_path / "spark-ckpt"
    out = tmp_path / "out"
    log = tmp_path / "job.log"
    fm = open_file_manager(root)
    commits = CommitLog(fm)
    args = [str(tmp_path / "in"), root, str(ckpt), str(out)]

    points = KillPoints(fm, "sessions", 2, out, ckpt)
    _kill_when(_start_job(args, "1.0", "0.0", log), points.tasks_committed_but_no_record)
    killed_at_1 = commits.latest()
    _kill_when(_start_job(args, "0.0", "1.5", log), lambda: points.record_but_no_spark_commit(killed_at_1 + 1))
    killed_at_2 = commits.latest()
    proc = _start_job(args, "0.0", "0.0", log)
    assert proc.wait(240) == 0, log.read_text()[-3000:]
    assert commits.latest() == len(batches)
    assert points.delivered(killed_at_2 - 1) == 2, "the batch committed before the second kill is delivered again"

    with TwsTester(
        Sessions(), "user", OUTPUT, time_mode="EventTime", event_time_column="ts", watermark_delay="5 seconds"
    ) as t:
        expected = [sorted(list(r) for r in t.run(rows)) for rows in batches]
    got = [json.loads((out / f"batch-{b:05d}.json").read_text()) for b in range(len(batches))]
    assert got == expected
    fired = [(r[0], r[5]) for rows in got for r in rows if r[1] == "timer"]
    assert fired and len(fired) == len(set(fired)), "a timer fired twice"


def _start_job(args: list[str], task_sleep: str, sink_sleep: str, log: Path) -> Any:
    return _start([*args, task_sleep, sink_sleep], log, module="tests.spark.tws_driver_job")
