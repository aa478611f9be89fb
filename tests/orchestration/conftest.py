"""Fixtures of the orchestration tests: configuration, resources and definitions over temp roots."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, Definitions

from statekeeper.orchestration.config import OrchestrationConfig, parse_roots
from statekeeper.orchestration.definitions import build_definitions
from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig
from statekeeper.sql import Catalog
from tests.orchestration.helpers import CheckpointWriter

THRESHOLD = 4
RETAIN = 3


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'catalog.db'}"


@pytest.fixture
def make_config() -> Callable[..., OrchestrationConfig]:
    def make(roots: list[str], **kw: Any) -> OrchestrationConfig:
        return OrchestrationConfig(roots=parse_roots(",".join(roots)), **kw)

    return make


def make_resources(config: OrchestrationConfig, db_url: str, **settings: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "snapshot_threshold": THRESHOLD,
        "min_versions_to_retain": RETAIN,
        "orphan_grace_seconds": 0.0,
        "load_grace_seconds": 0.0,
    }
    values.update(settings)
    return {
        "storage": CheckpointStorage(roots=list(config.roots)),
        "catalog": CatalogDatabase(url=db_url),
        "maintenance": MaintenanceConfig(**values),
    }


@pytest.fixture
def orch(checkpoint_root: str, db_url: str) -> Iterator[Orch]:
    """Definitions over one fresh checkpoint root (local or S3), a SQLite catalog and a writer."""
    o = Orch([checkpoint_root], db_url)
    yield o
    o.close()


class Orch:
    def __init__(self, roots: list[str], db_url: str, **config: Any) -> None:
        self.config = OrchestrationConfig(roots=parse_roots(",".join(roots)), **config)
        self.root = self.config.roots[0]
        self.db_url = db_url
        self.resources = make_resources(self.config, db_url)
        self.defs: Definitions = build_definitions(self.config, self.resources)
        self.instance = DagsterInstance.ephemeral()
        self.writer = CheckpointWriter(roots[0])
        self._catalog: Catalog | None = None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = self.resources["catalog"].open()
        return self._catalog

    def close(self) -> None:
        self.writer.close()
        if self._catalog is not None:
            self._catalog.close()
        self.instance.dispose()
