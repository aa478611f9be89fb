"""Run the Dagster webserver and daemon (``dagster dev``) beside the main job, on 127.0.0.1.

    python -m statekeeper.orchestration.run_local [--port 3000] [--seconds N] [-- MAIN JOB COMMAND...]

What `make run` calls, with the main job ``python examples/session_count.py`` (a Spark streaming query whose
checkpoint root, ``run/sessions/state``, it names in STATEKEEPER_CHECKPOINT_ROOTS). It

- prepares ``DAGSTER_HOME`` (default ``run/dagster_home``) with orchestration/dagster.yaml (one
  maintenance run per checkpoint root at a time), and points the code location at the checkpoint roots
  of STATEKEEPER_CHECKPOINT_ROOTS (default ``run/demo-checkpoint``) and a catalog in ``run/`` unless
  STATEKEEPER_DB_URL says otherwise;
- starts ``dagster dev -w workspace.yaml -h 127.0.0.1 -p PORT`` (webserver, daemon, code server;
  its output goes to ``<DAGSTER_HOME>/dagster-dev.log``) and the main job, each in its own process
  group;
- prints the UI address once the webserver answers;
- stops everything cleanly (main job, then Dagster with SIGINT as a terminal's Ctrl-C would, SIGKILL
  for anything still alive after a timeout) on Ctrl-C, SIGTERM, after ``--seconds`` /
  ``RUN_SECONDS``, or when ``dagster dev`` dies. When the main job ends first, Dagster keeps running.

Exit status: the main job's, else 1 when Dagster failed to start or died, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import IO

from statekeeper.orchestration.config import (
    ENV_DB_URL,
    ENV_ORPHAN_SCHEDULE,
    ENV_ROOTS,
    ENV_SENSOR_INTERVAL,
    ENV_VERIFY_SCHEDULE,
    default_roots,
    repo_dir,
)

DEFAULT_PORT = 3000
READY_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0
DAGSTER_YAML = Path(__file__).resolve().with_name("dagster.yaml")


class StopRequestedError(Exception):
    """Raised by the signal handlers to leave the wait loop."""


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str, wanted: int) -> int:
    if port_free(host, wanted):
        return wanted
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def prepare_home(home: Path) -> Path:
    """DAGSTER_HOME with statekeeper's dagster.yaml (an existing one is left as it is)."""
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if not target.exists():
        shutil.copyfile(DAGSTER_YAML, target)
    return home


DEMO_DEFAULTS = {
    "STATEKEEPER_SNAPSHOT_THRESHOLD": "30",
    ENV_SENSOR_INTERVAL: "10",
    ENV_ORPHAN_SCHEDULE: "*/15 * * * *",
    ENV_VERIFY_SCHEDULE: "*/5 * * * *",
}
"""What the demo runs with unless the environment says otherwise. The demo's query commits every 2 s; with the
code location's defaults (threshold 10, a sensor tick every 30 s: 15 commits) a store crossed the threshold
long before a tick saw it, and its snapshot landed at chains of 25-30, past twice the threshold. At 30 and a tick
every 10 s, a snapshot lands about 5 (the tick) + 5 (the run's start) commits after its crossing: within the
bound, with one snapshot run a minute on the 2 cores the query shares. Orphan cleanup and verification run every
15 and 5 minutes, so that they are seen in a demo (daily and hourly by default)."""


def child_env(home: Path, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["DAGSTER_HOME"] = str(home)
    env.setdefault(ENV_ROOTS, ",".join(default_roots()))
    env.setdefault(ENV_DB_URL, f"sqlite:///{run_dir / 'catalog.db'}")
    env.setdefault("PYTHONUNBUFFERED", "1")
    for name, value in DEMO_DEFAULTS.items():
        env.setdefault(name, value)
    return env


def ui_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop_group(proc: subprocess.Popen[bytes], first: signal.Signals, timeout: float) -> None:
    """Signal `proc`'s process group, wait, then SIGKILL whatever of the group is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, first)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    # children of the leader (webserver, daemon, code server, run workers) may outlive it briefly
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    main_cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, main_cmd = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m statekeeper.orchestration.run_local", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("DAGSTER_PORT", DEFAULT_PORT)), help="default 3000 (or free)"
    )
    parser.add_argument("--dagster-home", type=Path, default=None, help="default: run/dagster_home")
    parser.add_argument(
        "--seconds",
        type=float,
        default=float(os.environ.get("RUN_SECONDS") or 0),
        help="stop after this many seconds (default: RUN_SECONDS, else until Ctrl-C)",
    )
    args = parser.parse_args(argv)

    repo = repo_dir()
    run_dir = repo / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    home = prepare_home((args.dagster_home or run_dir / "dagster_home").resolve())
    env = child_env(home, run_dir)
    port = pick_port(args.host, args.port)
    url = f"http://{args.host}:{port}"
    dagster = shutil.which("dagster", path=str(Path(sys.executable).parent)) or "dagster"

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise StopRequestedError(signal.Signals(signum).name)

    old_int = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    log_path = home / "dagster-dev.log"
    log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in the finally below
    dev: subprocess.Popen[bytes] | None = None
    job: subprocess.Popen[bytes] | None = None
    status = 0
    job_status: int | None = None
    started = time.monotonic()
    try:
        dev = subprocess.Popen(
            [dagster, "dev", "-w", str(repo / "workspace.yaml"), "-h", args.host, "-p", str(port)],
            cwd=repo,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        print(f"starting Dagster (webserver + daemon) on {url}; log: {log_path}", flush=True)
        print(f"checkpoint roots: {env[ENV_ROOTS]}; catalog: {env[ENV_DB_URL]}", flush=True)
        if main_cmd:
            job = subprocess.Popen(main_cmd, cwd=repo, env=env, start_new_session=True)
            print(f"main job started: {' '.join(main_cmd)} (pid {job.pid})", flush=True)
        ready = False
        while True:
            if not ready and ui_ready(url):
                ready = True
                waited = time.monotonic() - started
                print(f"Dagster UI: {url}  (ready in {waited:.0f}s; Ctrl-C stops everything)", flush=True)
            if not ready and time.monotonic() - started > READY_TIMEOUT_S:
                print(f"Dagster did not answer on {url} within {READY_TIMEOUT_S:.0f}s; see {log_path}", flush=True)
                status = 1
                break
            if dev.poll() is not None:
                print(f"dagster dev exited with status {dev.returncode}; see {log_path}", flush=True)
                status = 1
                break
            if job is not None and job_status is None and job.poll() is not None:
                job_status = job.returncode
                print(f"main job finished with status {job_status}; Dagster keeps running", flush=True)
            if args.seconds and time.monotonic() - started >= args.seconds:
                print(f"RUN_SECONDS={args.seconds:g} elapsed: stopping", flush=True)
                break
            time.sleep(0.5)
    except StopRequestedError as e:
        print(f"{e}: stopping", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if job is not None:
            stop_group(job, signal.SIGINT, STOP_TIMEOUT_S)
            if job_status is None:
                job_status = job.returncode
        if dev is not None:
            stop_group(dev, signal.SIGINT, STOP_TIMEOUT_S)
        log.close()
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        print("stopped", flush=True)
    if job_status not in (None, 0, -signal.SIGINT, 130):
        return int(job_status) if job_status > 0 else 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
