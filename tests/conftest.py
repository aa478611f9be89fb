"""Fixtures shared by every suite.

`checkpoint_root` is parametrized over every checkpoint backend, so a suite written once runs
against local disk and against S3 through a real HTTP endpoint (moto's server on 127.0.0.1, a
fresh bucket per test, listings paginated 7 keys per page).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from statekeeper.store.files import CheckpointFileManager, open_file_manager
from tests.s3_support import TEST_CREDENTIALS, MotoServer, empty_and_delete_bucket, new_bucket_name, s3_client

BACKENDS = ["local", "s3"]

S3_TEST_PAGE_SIZE = 7


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server over real HTTP, and the environment that points statekeeper at it.

    `open_file_manager("s3://...")` without options then reaches moto, as a Spark executor configured
    through STATEKEEPER_S3_* variables would; fake credentials keep any real AWS account out of reach.
    """
    server = MotoServer().start()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in TEST_CREDENTIALS.items():
            mp.setenv(k, v)
        for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(k, raising=False)
        mp.setenv("AWS_CONFIG_FILE", "/dev/null")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("STATEKEEPER_S3_ENDPOINT_URL", server.endpoint_url)
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


@pytest.fixture(params=BACKENDS)
def checkpoint_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh, empty checkpoint root URI on each backend."""
    if request.param == "local":
        yield tmp_path_factory.mktemp("ckpt").as_uri()
    elif request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        yield f"s3://{bucket}/ckpt"
    else:  # pragma: no cover - every backend is listed above
        raise AssertionError(request.param)


@pytest.fixture
def file_manager(checkpoint_root: str) -> CheckpointFileManager:
    return open_file_manager(checkpoint_root)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report how many steps the hypothesis state machines ran (`tests/model_steps.py`)."""
    from tests.model_steps import FUZZED, INJECTED, STEPS, summary, write_report

    if STEPS or FUZZED or INJECTED:
        for line in summary().splitlines():
            terminalreporter.write_line(line)
        write_report()
