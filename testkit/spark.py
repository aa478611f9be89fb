"""Spark for tests and benchmarks: the Python workers' environment (`spark_env`), and a real standalone cluster
and Spark Connect server on 127.0.0.1, from the installed PySpark.

`StandaloneCluster` starts one master and two workers (``spark-class ...deploy.master.Master`` /
``...deploy.worker.Worker``; one core and a little memory each, since the machine is shared) and
stops them by their pids. `ConnectServer` starts ``SparkConnectServer`` (``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``) on a local master. Both bind 127.0.0.1 only,
write their logs under the given directory, and put this repository and interpreter on the Python
workers' environment so tasks can import ``statekeeper.store``,
``testkit`` and ``tests``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyspark

from testkit.s3 import free_port

ROOT = Path(__file__).resolve().parents[1]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
DAEMON_MEMORY = "256m"
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"


def spark_env() -> dict[str, str]:
    """Environment for Spark's Python workers: this interpreter, and the repository on the path (so that tasks
    import `testkit`, `tests` and `bench` modules)."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), path) if p),
    }


class ClusterStartError(RuntimeError):
    """A Spark daemon did not come up; the message carries the tail of its log."""


def spark_process_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for Spark daemons and their executors' Python workers."""
    env = {**os.environ, **spark_env(), **(extra or {})}
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_HOSTNAME="127.0.0.1",
        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        SPARK_NO_DAEMONIZE="1",
    )
    env.pop("SPARK_CONF_DIR", None)
    return env


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ClusterStartError(f"{proc.args!r} exited with {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise ClusterStartError(f"nothing listens on 127.0.0.1:{port} after {timeout}s:\n{_tail(log)}")


def _wait_for_log(text: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ClusterStartError(f"{proc.args!r} exited with {proc.returncode}:\n{_tail(log)}")
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise ClusterStartError(f"{text!r} not in {log} after {timeout}s:\n{_tail(log)}")


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """SIGTERM the process (and the children it started, e.g. executors), then SIGKILL what is left."""
    if proc.poll() is not None:
        return
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace_s)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


@dataclass
class StandaloneCluster:
    """A master and `workers` workers (one core each) on 127.0.0.1."""

    work_dir: Path
    workers: int = 2
    env_extra: dict[str, str] = field(default_factory=dict)
    master_port: int = 0
    master_proc: subprocess.Popen[bytes] | None = None
    worker_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def _spawn(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.work_dir / f"{name}.log"
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            cwd=self.work_dir,
            env=spark_process_env(self.env_extra),
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return proc, log

    def start(self) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.master_port = free_port()
        self.master_proc, log = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(self.master_port), "--webui-port", str(free_port())),
            ],
        )
        try:
            _wait_for_port(self.master_port, self.master_proc, log)
            for i in range(self.workers):
                worker_dir = self.work_dir / f"worker-{i}"
                worker_dir.mkdir(exist_ok=True)
                proc, wlog = self._spawn(
                    f"worker-{i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        *("--host", "127.0.0.1", "--cores", "1", "--memory", WORKER_MEMORY),
                        *("--webui-port", str(free_port()), "--work-dir", str(worker_dir), self.master_url),
                    ],
                )
                self.worker_procs.append(proc)
                _wait_for_log("Successfully registered with master", proc, wlog)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in self.worker_procs:
            _stop(proc)
        if self.master_proc is not None:
            _stop(self.master_proc)

    def executor_pids(self) -> list[int]:
        """The executor JVMs the workers run now (children of the worker processes)."""
        pids = []
        for proc in self.worker_procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                            pids.append(child.pid)
        return pids

    def session_conf(self, local_dir: Path) -> dict[str, str]:
        """Spark settings for an application on this cluster (small executors, Python env, local dirs)."""
        env = {**spark_env(), "STATEKEEPER_SPARK_LOCAL_DIR": str(local_dir), **self.env_extra}
        conf = {
            "spark.master": self.master_url,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": EXECUTOR_MEMORY,
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.executor.cores": "1",
            "spark.cores.max": str(self.workers),
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "4",
            "spark.locality.wait": "0s",
            "spark.ui.enabled": "false",
            "spark.python.worker.reuse": "true",
            "spark.python.unix.domain.socket.enabled": "true",  # as docs/deployment.md submits (the suite's own: TCP)
            "spark.pyspark.python": sys.executable,
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        }
        conf.update({f"spark.executorEnv.{k}": v for k, v in env.items()})
        return conf


@dataclass
class ConnectServer:
    """A Spark Connect server (local[2] inside) on 127.0.0.1."""

    work_dir: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> ConnectServer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        log = self.work_dir / "connect-server.log"
        env = spark_process_env({"STATEKEEPER_SPARK_LOCAL_DIR": str(self.work_dir / "local"), **self.env_extra})
        env["SPARK_DAEMON_MEMORY"] = "1g"  # the launcher sizes the Connect server (a driver) as a daemon
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "1g",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.python.worker.reuse": "true",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        }
        args = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[2,4]"]
        for k, v in conf.items():
            args += ["--conf", f"{k}={v}"]
        args += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "spark-internal"]
        self.proc = subprocess.Popen(
            args, cwd=self.work_dir, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            _wait_for_port(self.port, self.proc, log, timeout=120)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
