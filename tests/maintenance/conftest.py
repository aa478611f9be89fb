"""Fixtures of the maintenance suites: histories on every checkpoint backend, settings, a catalog."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statekeeper.maintenance.build_processes import close_build_processes
from statekeeper.maintenance.inventory import clear_caches
from statekeeper.maintenance.replica_pool import close_replicas
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.sql import Catalog
from tests.maintenance.helpers import History, small_settings


def _histories(root: str) -> Iterator[Callable[..., History]]:
    made: list[History] = []

    def make(**kw: object) -> History:
        h = History(f"{root.rstrip('/')}/{uuid.uuid4().hex[:10]}", **kw)  # type: ignore[arg-type]
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
    close_build_processes()
    close_replicas()
    clear_caches()


@pytest.fixture
def make_history(checkpoint_root: str) -> Iterator[Callable[..., History]]:
    """Histories on fresh roots under the backend's checkpoint root (local disk and S3)."""
    yield from _histories(checkpoint_root)


@pytest.fixture
def make_local_history(tmp_path: Path) -> Iterator[Callable[..., History]]:
    """Histories on local disk only, for behaviour that does not depend on the backend."""
    yield from _histories((tmp_path / "ckpt").as_uri())


@pytest.fixture
def settings(tmp_path: Path) -> MaintenanceSettings:
    """Small numbers so a few batches exercise every rule; no grace period."""
    return small_settings(str(tmp_path / "work"))


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    cat = Catalog.open(f"sqlite:///{tmp_path / 'catalog.db'}", upgrade=True)
    yield cat
    cat.close()
