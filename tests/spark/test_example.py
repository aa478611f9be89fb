"""The example `make run` runs: a fresh run, then a resumed one, each checking exactly-once counts."""

from __future__ import annotations

from pathlib import Path

from tests.spark.example_runner import run_example


def test_example_runs_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    work = tmp_path / "sessions"
    _, first = run_example(work, 12)
    assert first and first[0] == 0
    out, second = run_example(work, 8)  # the same work dir: resumes the query and its state
    # the next batch; or the one after, if the stop came after a commit record but before Spark's own
    # commit (then the resumed run re-delivers that batch to the sink as a [replay] first)
    assert second and first[-1] < second[0] <= first[-1] + 2, f"resumed at batch {second[:1]} after {first[-1]}"
    assert "Exception" not in out
