"""The maintainer process of the fleet benchmark (`bench.fleet.beside`), in each of its modes, and the
parameters of one run. It runs until a stop file exists, then writes its CPU seconds (its own and its
children's) and its cycles."""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from statekeeper.maintenance.settings import MaintenanceSettings

log = logging.getLogger("bench.fleet")


@dataclass(frozen=True)
class FleetParams:
    stores: int = 16
    keys: int = 10_000
    updates: int = 1_000
    interval: float = 1.0
    seconds: float = 120.0
    writers: int = 2
    mode: str = "cli"
    threshold: int = 10
    retain: int = 20
    load_grace: float = 0.0
    orphan_grace: float = 60.0
    cycle: float = 2.0
    schedule: float = 0.0
    """Seconds between the schedules' runs (expiry, verification, orphan cleanup; `dagster`; `daemon`: 60,
    every cron every minute, the finest a cron fires). 0: the product's default crons (hourly, hourly,
    daily), as deployed: none fires within a run; the sensor's expiry runs keep the checkpoint bounded."""
    sample_every: float = 5.0
    roots: int = 1
    """Checkpoint roots the stores are spread over: one streaming query each, with `stores / roots` state
    partitions, as a fleet of queries is; the maintainer is given all of them."""

    @property
    def label(self) -> str:
        """The maintainer as the tables name it: the mode, the roots when several, the schedules when not
        the defaults."""
        parts = [self.mode]
        if self.roots > 1:
            parts.append(f"{self.roots} roots")
        if self.schedule:
            parts.append(f"schedules every {self.schedule:g} s")
        return ", ".join(parts)

    def settings_args(self) -> list[str]:
        return [
            *("--threshold", str(self.threshold), "--retain", str(self.retain)),
            *("--grace", str(self.orphan_grace), "--load-grace", str(self.load_grace)),
        ]


MODES = ("cli", "maintain", "dagster", "daemon")


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _maintain_cli(p: FleetParams, roots: str, work: str, stop: Path, ready: Path) -> int:
    env = {**os.environ, "STATEKEEPER_HOME": os.path.join(work, "home")}
    env.pop("STATEKEEPER_DB_URL", None)
    common = [*p.settings_args(), "--work-dir", os.path.join(work, "replicas"), "--no-progress"]
    cycles = 0
    ready.touch()
    while not stop.exists():
        t0 = time.monotonic()
        for root, command in product(roots.split(","), ("snapshot", "expire", "clean-orphans")):
            done = subprocess.run(
                [sys.executable, "-m", "statekeeper.maintenance", command, root, *common, "--json"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                log.warning("statekeeper %s exited %d: %s", command, done.returncode, done.stderr[-500:])
        cycles += 1
        time.sleep(max(0.0, p.cycle - (time.monotonic() - t0)))
    return cycles


def _maintain_loop(p: FleetParams, roots: str, work: str, stop: Path, ready: Path) -> int:
    env = {**os.environ, "STATEKEEPER_HOME": os.path.join(work, "home")}
    env.pop("STATEKEEPER_DB_URL", None)
    args = [*p.settings_args(), "--work-dir", os.path.join(work, "replicas"), "--every", str(p.cycle)]
    # Its report of every cycle goes to a file: a pipe read only at the end fills (64 KiB; a cycle's line
    # names every root) and blocks the loop in its next write.
    report = Path(work, "maintain.out")
    with report.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "statekeeper.maintenance", "maintain", *roots.split(","), *args],
            env=env,
            stdout=out,
        )
        while "cycle " not in report.read_text() and proc.poll() is None and not stop.exists():
            time.sleep(0.05)  # ready after its first cycle (over the bulk load): its imports are no longer the clock's
        ready.touch()
        while not stop.exists():
            time.sleep(0.2)
        proc.terminate()  # SIGTERM between or within a cycle: a maintainer may die at any point (invariant 4)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:  # seen once on a machine loaded 5x over its cores
            log.warning("statekeeper maintain still running 120 s after SIGTERM; killing it")
            proc.kill()
            proc.wait(timeout=120)
    return report.read_text().count("cycle ")


def _settings(p: FleetParams, work: str) -> MaintenanceSettings:
    from statekeeper.maintenance.settings import MaintenanceSettings

    return MaintenanceSettings(
        snapshot_threshold=p.threshold,
        min_versions_to_retain=p.retain,
        orphan_grace_seconds=p.orphan_grace,
        load_grace_seconds=p.load_grace,
        work_dir=os.path.join(work, "replicas"),
    )


def catalog_url(work: str | Path) -> str:
    """The maintainer's SQLite catalog in its work directory."""
    return f"sqlite:///{os.path.join(work, 'catalog.db')}"


def _maintain_dagster(p: FleetParams, roots: str, work: str, stop: Path, ready: Path) -> int:
    from bench.fleet.dagster_runs import DagsterMaintainer

    dagster = DagsterMaintainer(roots, _settings(p, work), catalog_url(work))
    ready.touch()
    cycles = 0
    last_schedule = time.monotonic()
    try:
        while not stop.exists():
            t0 = time.monotonic()
            dagster.tick()
            if p.schedule and time.monotonic() - last_schedule >= p.schedule:
                last_schedule = time.monotonic()
                dagster.schedules()
            cycles += 1
            time.sleep(max(0.0, p.cycle - (time.monotonic() - t0)))
    finally:
        dagster.close()
    return cycles


def _maintain_daemon(p: FleetParams, roots: str, work: str, stop: Path, ready: Path) -> int:
    from bench.fleet.dagster_runs import run_daemon
    from statekeeper.orchestration.sensors import SENSOR_NAME

    ready.touch()
    outcome = run_daemon(
        roots,
        work,
        stop,
        _settings(p, work),
        catalog_url(work),
        cycle=p.cycle,
        schedules_every_minute=bool(p.schedule),
    )
    log.info("dagster-daemon: %s", outcome)
    return outcome.ticks.get(SENSOR_NAME, 0)


def maintain(p: FleetParams, roots: str, work: str, stop: Path, out: Path, ready: Path) -> None:
    """The maintainer process of `roots` (comma-separated, as STATEKEEPER_CHECKPOINT_ROOTS takes them): touches
    `ready` once set up (its imports, Dagster's instance), runs until `stop` exists, then writes its CPU seconds and
    cycles to `out`."""
    os.makedirs(work, exist_ok=True)
    cpu0 = _cpu_seconds()
    modes = {"cli": _maintain_cli, "maintain": _maintain_loop, "dagster": _maintain_dagster, "daemon": _maintain_daemon}
    cycles = modes[p.mode](p, roots, work, stop, ready)
    out.write_text(json.dumps({"cpu_seconds": _cpu_seconds() - cpu0, "cycles": cycles}))
