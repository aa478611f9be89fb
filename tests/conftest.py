"""Fixtures shared by every suite.

`checkpoint_root` is parametrized over every checkpoint backend, so a suite written once runs
against local disk and against S3 through real HTTP endpoints on 127.0.0.1: moto's server ("s3") and
s3rver ("s3rver", a second implementation, `tests/s3rver/`), a fresh bucket per test, listings
paginated 7 keys per page. The s3rver variants of the suites outside `S3RVER_DEFAULT_SUITES` are
marked slow, so the default run stays lean.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statekeeper.store.files import CheckpointFileManager, open_file_manager
from testkit.jvm_classes import jvm_options
from testkit.s3 import (
    MotoServer,
    empty_and_delete_bucket,
    new_bucket_name,
    point_statekeeper_at,
    s3_client,
)
from tests.s3rver.server import S3RVER_CREDENTIALS, S3rverServer

BACKENDS = ["local", "s3", "s3rver"]
"""Checkpoint backends: local disk, S3 on moto's server, S3 on s3rver."""

S3RVER_DEFAULT_SUITES = (
    "tests/store/test_file_manager.py",  # the file-manager contract
    "tests/store/test_model.py",  # commit / load / recovery against a model
    "tests/maintenance/test_expiry.py",  # one maintenance suite
)
"""Suites whose s3rver variants run by default; elsewhere they are marked slow (`make test-all`)."""

LONG_SUITES = (
    "tests/reliability/test_crash_sweep.py",
    "tests/spark/test_example_maintenance.py",
    "tests/spark/test_connect.py",
    "tests/spark/test_cluster.py",
    "tests/maintenance/test_crash.py",
    "tests/spark/test_rescale.py",
    "tests/store/test_model.py",
    "tests/reliability/test_soak.py",
    "tests/maintenance/test_concurrency.py",
    "tests/test_doc_snippets.py",
    "tests/bench/",
    "tests/spark/test_quiet_timers.py",
    "tests/spark/test_e2e.py",
    "tests/orchestration/test_ui.py",
    "tests/store/test_s3_store.py",
    "tests/spark/",
    "tests/reliability/",
    "tests/maintenance/test_properties.py",
    "tests/store/test_crash.py",
)
"""Suites of a minute or more a file, longest first (`--durations` of a default run on 2 cores): collected first
(a run without xdist meets a failure of theirs early; xdist hands files out by their number of tests, these
first among equals)."""

S3_TEST_PAGE_SIZE = 7

HANDED_OUT_FIRST = (
    "tests/reliability/test_crash_sweep.py",
    "tests/reliability/test_soak.py",
    "tests/spark/test_example_maintenance.py",
    "tests/spark/test_connect.py",
)
"""Files of one or two tests that each take a minute or more: under `--dist loadfile` the workers get these first,
then the rest in xdist's order (most tests first). xdist alone hands them out last, so the run ended with one of
them on one core and the other core idle."""

SPARK_SUITE = "tests/spark/"
SPARK_WORKERS = ("gw0", "gw1")
"""The workers that take the files of `SPARK_SUITE` while any other file is left: each worker running one starts a
Spark session and a JVM warmed by its first streaming query (~15 CPU-s), kept to the end of the run."""


TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Java options of every JVM a test starts (Spark sessions, the standalone cluster and its executors, the Connect
server, Spark jobs run as subprocesses): they live seconds to minutes, so the C1 compiler alone and the serial
collector spend about a fifth less CPU than the defaults for the same results; the class archive made at setup
(`testkit.jvm_classes`, `make test`) saves a third of each start-up's CPU again (JDK_JAVA_OPTIONS, if set, wins).
Benchmarks do not set them."""

JVM_CLASS_ARCHIVE = Path(sys.prefix) / "spark-classes.jsa"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("JDK_JAVA_OPTIONS", f"{TEST_JVM_OPTIONS} {jvm_options(JVM_CLASS_ARCHIVE)}".strip())


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server over real HTTP, and the environment that points statekeeper at it.

    `open_file_manager("s3://...")` without options then reaches moto, as a Spark executor configured
    through STATEKEEPER_S3_* variables would; fake credentials keep any real AWS account out of reach.
    """
    server = MotoServer().start()
    with pytest.MonkeyPatch.context() as mp:
        point_statekeeper_at(mp, server.endpoint_url)
        mp.setenv("STATEKEEPER_S3_LIST_PAGE_SIZE", str(S3_TEST_PAGE_SIZE))
        yield server.endpoint_url
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Iterator[str]:
    """A fresh, empty bucket on the moto server, emptied and removed afterwards."""
    client = s3_client(s3_endpoint)
    name = new_bucket_name()
    client.create_bucket(Bucket=name)
    yield name
    empty_and_delete_bucket(client, name)


@pytest.fixture(scope="session")
def s3rver_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """s3rver over real HTTP on 127.0.0.1 (a free port, its own data directory), stopped at the end."""
    server = S3rverServer(Path(tmp_path_factory.mktemp("s3rver"))).start()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


@pytest.fixture
def s3rver_bucket(s3_endpoint: str, s3rver_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh bucket on s3rver, with the environment pointing statekeeper at s3rver for this test.

    s3rver ignores `If-None-Match`, does not list in key order and shows objects while they upload, so
    the test runs with the settings statekeeper requires on such a store (the HEAD check, unordered
    listing, verified publishes: docs/s3.md).
    Child processes inherit the environment.
    """
    for k, v in S3RVER_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("STATEKEEPER_S3_ENDPOINT_URL", s3rver_endpoint)
    monkeypatch.setenv("STATEKEEPER_S3_HEAD_BEFORE_CREATE", "true")
    monkeypatch.setenv("STATEKEEPER_S3_LISTING", "unordered")
    monkeypatch.setenv("STATEKEEPER_S3_VERIFY_PUBLISHED", "true")
    client = s3_client(s3rver_endpoint)
    name = new_bucket_name()
    client.create_bucket(Bucket=name)
    yield name
    empty_and_delete_bucket(client, name)


@pytest.fixture(params=BACKENDS)
def checkpoint_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh, empty checkpoint root URI on each backend."""
    if request.param == "local":
        yield tmp_path_factory.mktemp("ckpt").as_uri()
    elif request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        yield f"s3://{bucket}/ckpt"
    elif request.param == "s3rver":
        bucket = request.getfixturevalue("s3rver_bucket")
        yield f"s3://{bucket}/ckpt"
    else:  # pragma: no cover - every backend is listed above
        raise AssertionError(request.param)


@pytest.fixture
def file_manager(checkpoint_root: str) -> CheckpointFileManager:
    return open_file_manager(checkpoint_root)


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The s3rver variants outside `S3RVER_DEFAULT_SUITES` run only with the slow suites; the suites that take
    minutes (`LONG_SUITES`) are collected first."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("checkpoint_root") != "s3rver":
            continue
        if not item.nodeid.startswith(S3RVER_DEFAULT_SUITES):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_suite_rank)  # stable: files keep their order, a file's tests stay together


def _suite_rank(item: pytest.Item) -> int:
    return next((i for i, suite in enumerate(LONG_SUITES) if item.nodeid.startswith(suite)), len(LONG_SUITES))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands what it counted (`tests/model_steps.py`) to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from tests.model_steps import figures

        workeroutput["model_figures"] = json.dumps(figures())


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: the controller picks how files reach the workers
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class LongFilesFirst(LoadFileScheduling):  # type: ignore[misc]
        """xdist's file scheduling with `HANDED_OUT_FIRST` moved to the front of its queue, and each worker
        taking the first file on its side of `SPARK_WORKERS` (any file when its side has none left)."""

        def _assign_work_unit(self, node: Any) -> None:
            for scope in reversed(HANDED_OUT_FIRST):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            spark_side = node.gateway.id in SPARK_WORKERS
            mine = next((s for s in self.workqueue if s.startswith(SPARK_SUITE) == spark_side), None)
            if mine is not None:
                self.workqueue.move_to_end(mine, last=False)
            super()._assign_work_unit(node)

    return LongFilesFirst(config, log)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: the controller hears of a worker's end
def pytest_testnodedown(node: Any, error: object) -> None:
    from tests.model_steps import merge

    counted = getattr(node, "workeroutput", {}).get("model_figures")
    if counted:
        merge(json.loads(counted))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report how many steps the hypothesis state machines ran (`tests/model_steps.py`), the workers' added up."""
    from tests.model_steps import FUZZED, INJECTED, STEPS, summary, write_report

    if STEPS or FUZZED or INJECTED:
        for line in summary().splitlines():
            terminalreporter.write_line(line)
        write_report()
