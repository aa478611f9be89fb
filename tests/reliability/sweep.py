"""The crash-point sweep: kill -9 a child at every point of `statekeeper.store.faults` a scenario reaches.

    python -m tests.reliability.sweep OUT.json [--scenario NAME ...] [--kinds local,s3]
        [--s3-bucket BUCKET] [--sample N] [--work DIR]

For each scenario and root kind: a template checkpoint is prepared once; a traced child runs the
scenario's `act` with a hook that records every point it reaches (`point#k`: the k-th time it
reached `point`). Then, for each recorded point (all of them, or `--sample N` spread evenly over the
trace), a fresh copy of the template is made, a child runs `act` with a hook that SIGKILLs its own
process at exactly that point, and a second child recovers (`recover`) and checks
(`scenarios.check`): every committed version loads with exactly the model's state, `verify_root`
reports nothing, the catalog equals a rebuild. A kill that loses anything is counted in `lost`.

This process stays single-threaded and never opens RocksDB itself, so forking it is safe: every
child starts with everything imported (a kill costs a fork, not an interpreter start). Results go
to OUT.json: distinct kills by scenario and root kind, points by name, problems (empty when nothing
was lost).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from statekeeper.store import faults
from tests.reliability import scenarios
from tests.reliability.scenarios import SCENARIOS, Scenario, check

CHILD_TIMEOUT_SECONDS = 120.0


@dataclass
class SweepResult:
    kills: dict[str, dict[str, int]] = field(default_factory=dict)  # scenario -> root kind -> kills
    seconds_by_scenario: dict[str, dict[str, float]] = field(default_factory=dict)
    points: dict[str, int] = field(default_factory=dict)  # point name -> kills at it
    traced: dict[str, dict[str, int]] = field(default_factory=dict)  # scenario -> kind -> trace length
    not_reached: int = 0  # kill runs whose child finished before the point (non-deterministic order)
    lost: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total_kills(self) -> int:
        return sum(n for kinds in self.kills.values() for n in kinds.values())

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total_kills": self.total_kills}


# -- children ---------------------------------------------------------------------------------------


def run_child(fn: Callable[[], None], error_file: str) -> int:
    """Fork; the child runs `fn` and exits 0 (or 3 with its traceback in `error_file`). Returns the
    wait status decoded: the exit code, or minus the signal that ended it."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            fn()
        except BaseException:
            with open(error_file, "w") as f:
                f.write(traceback.format_exc())
            code = 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + CHILD_TIMEOUT_SECONDS
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -999
        time.sleep(0.005)


def _trace_hook(trace: list[str]) -> faults.FaultHook:
    def hook(point: str, subject: str) -> None:
        trace.append(point)

    return hook


def _kill_hook(point: str, nth: int) -> faults.FaultHook:
    seen = 0

    def hook(reached: str, subject: str) -> None:
        nonlocal seen
        if reached == point:
            seen += 1
            if seen == nth:
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


def occurrences(trace: list[str]) -> list[tuple[str, int]]:
    """Each entry of a trace as (point, k): the k-th time the run reached that point."""
    counts: Counter[str] = Counter()
    out = []
    for point in trace:
        counts[point] += 1
        out.append((point, counts[point]))
    return out


def spread(items: list[Any], n: int | None) -> list[Any]:
    """`n` items spread evenly over `items` (first and last included), or all of them."""
    if n is None or n >= len(items):
        return list(items)
    if n <= 1:
        return items[:n]
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


# -- roots ----------------------------------------------------------------------------------------


class Roots:
    """Fresh copies of a template checkpoint root, on local disk or under an S3 bucket."""

    def __init__(self, kind: str, base: str, bucket: str | None) -> None:
        self.kind, self.base, self.bucket = kind, base, bucket
        self._client: Any = None
        if kind == "s3":
            if not bucket:
                raise SystemExit("--s3-bucket is needed for the s3 root kind")
            from testkit.s3 import s3_client

            self._client = s3_client(os.environ["STATEKEEPER_S3_ENDPOINT_URL"])

    def uri(self, name: str) -> str:
        if self.kind == "s3":
            return f"s3://{self.bucket}/{name}"
        return os.path.join(self.base, "roots", name)

    def copy(self, src: str, dst: str) -> str:
        if self.kind == "local":
            shutil.copytree(self.uri(src), self.uri(dst))
            return self.uri(dst)
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{src}/")
        for page in pages:
            for obj in page.get("Contents", []):
                key = obj["Key"]
                self._client.copy_object(
                    Bucket=self.bucket,
                    Key=f"{dst}/{key[len(src) + 1 :]}",
                    CopySource={"Bucket": self.bucket, "Key": key},
                )
        return self.uri(dst)

    def remove(self, name: str) -> None:
        if self.kind == "local":
            shutil.rmtree(self.uri(name), ignore_errors=True)
            return
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{name}/")
        for page in pages:
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})


# -- the sweep ------------------------------------------------------------------------------------


def _committed(root: str) -> int:
    from statekeeper.store import CommitLog
    from statekeeper.store.files import open_file_manager

    return CommitLog(open_file_manager(root)).latest()


def sweep_one(scenario: Scenario, roots: Roots, work_base: str, sample: int | None, result: SweepResult) -> None:
    t0 = time.monotonic()
    tag = f"{scenario.name}-{roots.kind}"
    tmpl_work = os.path.join(work_base, f"{tag}-template")
    os.makedirs(tmpl_work, exist_ok=True)
    err = os.path.join(work_base, f"{tag}.err")

    def fail(what: str) -> None:
        text = Path(err).read_text() if os.path.exists(err) else ""
        result.problems.append(f"{tag}: {what}\n{text}")

    status = run_child(lambda: scenario.prepare(roots.uri(f"{tag}-tmpl"), tmpl_work), err)
    if status != 0:
        return fail(f"prepare failed ({status})")
    trace_file = os.path.join(work_base, f"{tag}.trace")

    def traced() -> None:
        trace: list[str] = []
        faults.arm(_trace_hook(trace))
        try:
            scenario.act(root, work)
        finally:
            faults.arm(None)
            with open(trace_file, "w") as f:
                json.dump(trace, f)

    root = roots.copy(f"{tag}-tmpl", f"{tag}-trace")
    work = _fresh_work(work_base, tmpl_work, f"{tag}-trace")
    if (status := run_child(traced, err)) != 0:
        return fail(f"the traced run failed ({status})")
    with open(trace_file) as f:
        points = occurrences(json.load(f))
    result.traced.setdefault(scenario.name, {})[roots.kind] = len(points)
    roots.remove(f"{tag}-trace")
    committed_before = _committed_in_child(roots.uri(f"{tag}-tmpl"), work_base, err)
    kills = result.kills.setdefault(scenario.name, {}).setdefault(roots.kind, 0)
    for n, (point, nth) in enumerate(spread(points, sample)):
        name = f"{tag}-{n}"
        root = roots.copy(f"{tag}-tmpl", name)
        work = _fresh_work(work_base, tmpl_work, name)
        hook = _kill_hook(point, nth)

        def act(root: str = root, work: str = work, hook: faults.FaultHook = hook) -> None:
            faults.arm(hook)
            scenario.act(root, work)

        status = run_child(act, err)
        if status == -signal.SIGKILL:
            kills += 1
            result.points[point] = result.points.get(point, 0) + 1
        elif status == 0:
            result.not_reached += 1
        else:
            fail(f"killed at {point}#{nth}: the child failed instead ({status})")
            continue
        problems_file = os.path.join(work, "problems.json")

        def recover_and_check(root: str = root, work: str = work, out: str = problems_file) -> None:
            scenario.recover(root, work)
            with open(out, "w") as f:
                json.dump(check(root, work, scenario, committed_before), f)

        status = run_child(recover_and_check, err)
        if status != 0:
            result.lost += 1
            fail(f"killed at {point}#{nth}: recovery failed ({status})")
        else:
            with open(problems_file) as f:
                problems = json.load(f)
            if problems:
                result.lost += 1
                result.problems.append(f"{tag}: killed at {point}#{nth}: " + "; ".join(problems))
        roots.remove(name)
        shutil.rmtree(work, ignore_errors=True)
    result.kills[scenario.name][roots.kind] = kills
    result.seconds_by_scenario.setdefault(scenario.name, {})[roots.kind] = round(time.monotonic() - t0, 1)
    print(f"{tag}: {kills} kills of {len(points)} traced points, {result.lost} lost so far", flush=True)
    roots.remove(f"{tag}-tmpl")


def _fresh_work(base: str, template: str, name: str) -> str:
    """A per-run work directory holding a copy of the template's catalog (if it has one)."""
    work = os.path.join(base, name)
    os.makedirs(work, exist_ok=True)
    db = os.path.join(template, "catalog.db")
    if os.path.exists(db):
        shutil.copy2(db, os.path.join(work, "catalog.db"))
    return work


def _committed_in_child(root: str, work_base: str, err: str) -> int:
    out = os.path.join(work_base, "committed.json")

    def probe() -> None:
        with open(out, "w") as f:
            json.dump(_committed(root), f)

    if run_child(probe, err) != 0:
        raise RuntimeError(f"cannot read the commit log of {root}: {Path(err).read_text()}")
    with open(out) as f:
        return int(json.load(f))


def _preload() -> None:
    """Import (and work out) here, once, what every forked child would otherwise import or parse again: the catalog's
    migration tooling and the checks' helpers were two fifths of a local sweep's CPU."""
    import alembic.runtime.migration  # noqa: F401

    import tests.maintenance.helpers
    import tests.maintenance.test_crash  # noqa: F401
    from statekeeper.sql.db import head_revision

    head_revision()


def sweep(scenarios: list[str], kinds: list[str], *, bucket: str | None, sample: int | None, work: str) -> SweepResult:
    _preload()
    result = SweepResult()
    t0 = time.monotonic()
    for kind in kinds:
        roots = Roots(kind, work, bucket)
        for name in scenarios:
            sweep_one(SCENARIOS[name], roots, work, sample, result)
    result.seconds = round(time.monotonic() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.reliability.sweep", description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    ap.add_argument("--kinds", default="local")
    ap.add_argument("--s3-bucket")
    ap.add_argument("--sample", type=int, help="kill points per (scenario, root kind), spread over the trace")
    ap.add_argument(
        "--partitions", type=int, default=scenarios.PARTITIONS, help="stores per scenario (more: more points)"
    )
    ap.add_argument("--work", help="scratch directory (default: a new temp dir, removed at the end)")
    args = ap.parse_args(argv)
    scenarios.PARTITIONS = args.partitions  # read at call time by every scenario and check
    work = args.work or tempfile.mkdtemp(prefix="sk-sweep-")
    try:
        result = sweep(
            args.scenario or list(SCENARIOS),
            args.kinds.split(","),
            bucket=args.s3_bucket,
            sample=args.sample,
            work=work,
        )
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump(result.to_json(), f, indent=1)
    print(f"{result.total_kills} kills, {result.lost} lost, {result.not_reached} not reached, {result.seconds}s")
    return 1 if result.lost or result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
