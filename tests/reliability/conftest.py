"""Fixtures of the reliability suites: a PostgreSQL server of their own, which they stop and restart,
and an S3 server in a child process behind a fault-injecting proxy (the soak).

The catalog suites elsewhere share one server (`tests/sql/conftest.py`, or STATEKEEPER_TEST_PG_URL);
the catalog fault tests stop theirs in the middle of maintenance runs, so they always start a private
one on 127.0.0.1 (scripts/ensure-postgres.sh) and drive it with `pg_ctl`. The soak measures this
process's RSS, so its S3 server (moto) runs in a child process, not in the suite's server thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.s3 import FaultProxy, moto_server, new_bucket_name, point_statekeeper_at, s3_client
from tests.postgres_support import ENV_URL, PostgresServer


class RestartablePostgres(PostgresServer):
    """A private server this process started, with `halt()` and `resume()` (pg_ctl stop / start)."""

    def _pg_ctl(self, *args: str) -> None:
        assert self._dir is not None, "only a server this process started can be stopped"
        pg_ctl = _pg_ctl_binary()
        cmd = [pg_ctl, "-D", os.path.join(self._dir, "data"), *args]
        if os.getuid() == 0:  # the cluster belongs to the postgres user (scripts/ensure-postgres.sh)
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def halt(self) -> None:
        """Stop the server now (fast shutdown: sessions are cut, open transactions roll back)."""
        self._pg_ctl("-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start it again with the options it ran with (`restart` reads postmaster.opts)."""
        assert self._dir is not None
        self._pg_ctl("-l", os.path.join(self._dir, "server.log"), "-w", "-t", "60", "restart")


def _pg_ctl_binary() -> str:
    for bindir in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (bindir / "pg_ctl").exists():
            return str(bindir / "pg_ctl")
    found = shutil.which("pg_ctl")
    if found is None:
        raise RuntimeError("pg_ctl not found: install PostgreSQL (scripts/ensure-postgres.sh does)")
    return found


@pytest.fixture(scope="module")
def restartable_postgres() -> Iterator[RestartablePostgres]:
    server = RestartablePostgres()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(ENV_URL, raising=False)  # never a shared server: this one is stopped on purpose
        server.start()
    yield server
    server.stop()


@dataclass(frozen=True)
class SoakS3:
    root: str
    proxy: FaultProxy


@pytest.fixture
def soak_s3() -> Iterator[SoakS3]:
    """An S3 root on moto (a child process on 127.0.0.1) reached through a `FaultProxy` (no faults
    until the test sets a rate); the store is pointed at the proxy through STATEKEEPER_S3_* variables."""
    with moto_server() as upstream, FaultProxy(upstream, seed=17) as proxy, pytest.MonkeyPatch.context() as mp:
        point_statekeeper_at(mp, proxy.endpoint_url)
        bucket = new_bucket_name()
        s3_client(upstream).create_bucket(Bucket=bucket)
        yield SoakS3(f"s3://{bucket}/soak", proxy)
