"""Fixtures shared by every suite.

`checkpoint_root` is parametrized over every checkpoint backend, so a suite written once runs
against local disk and against S3 through a real HTTP endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store.files import CheckpointFileManager, open_file_manager

BACKENDS = ["local"]


@pytest.fixture(params=BACKENDS)
def checkpoint_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh, empty checkpoint root URI on each backend."""
    if request.param == "local":
        yield tmp_path_factory.mktemp("ckpt").as_uri()
    else:  # pragma: no cover - every backend is listed above
        raise AssertionError(request.param)


@pytest.fixture
def file_manager(checkpoint_root: str) -> CheckpointFileManager:
    return open_file_manager(checkpoint_root)
