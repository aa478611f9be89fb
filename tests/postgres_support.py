"""A throwaway PostgreSQL server for tests (scripts/ensure-postgres.sh), and per-test databases.

`PostgresServer.start()` uses ``STATEKEEPER_TEST_PG_URL`` when it is set (its user needs CREATEDB),
else runs scripts/ensure-postgres.sh, which installs PostgreSQL with apt-get if needed and starts a
server on 127.0.0.1 in a temp directory; `stop()` shuts down only a server it started.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

ENV_URL = "STATEKEEPER_TEST_PG_URL"
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ensure-postgres.sh"


class PostgresServer:
    def __init__(self) -> None:
        self.url: str | None = None
        self._dir: str | None = None

    def start(self) -> str:
        given = os.environ.get(ENV_URL)
        if given:
            self.url = given
            return given
        self._dir = tempfile.mkdtemp(prefix="statekeeper-pg-", dir="/tmp")
        os.rmdir(self._dir)  # the script creates it and hands it to the postgres user
        proc = subprocess.run(
            ["bash", str(SCRIPT), "--dir", self._dir],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{SCRIPT} failed ({proc.returncode}):\n{proc.stderr}")
        self.url = proc.stdout.strip().splitlines()[-1]
        return self.url

    def stop(self) -> None:
        if self._dir is not None:
            subprocess.run(["bash", str(SCRIPT), "--stop", self._dir], capture_output=True, timeout=120, check=False)
            self._dir = None

    def _admin(self) -> sa.Engine:
        assert self.url is not None
        return sa.create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)

    def new_database(self) -> str:
        """A new empty database on the server; returns its URL."""
        assert self.url is not None
        name = f"sk_test_{uuid.uuid4().hex[:12]}"
        engine = self._admin()
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        finally:
            engine.dispose()
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def drop_database(self, url: str) -> None:
        name = make_url(url).database
        engine = self._admin()
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            engine.dispose()
