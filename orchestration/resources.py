"""Dagster resources: the checkpoint storage, the catalog database and the maintenance settings.

Each is a `ConfigurableResource`, so its configuration shows on the code location's resource page
and can be overridden per run from the launchpad. `build_resources` fills them from the
environment (`statekeeper.orchestration.config`); the catalog URL is passed through `EnvVar` when it comes
from STATEKEEPER_DB_URL, so a password in it is never shown in the UI.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from statekeeper.orchestration.config import ENV_DB_URL, OrchestrationConfig, normalize_root
from statekeeper.sql import Catalog
from statekeeper.sql.db import default_url, normalize_url
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager, open_file_manager

if TYPE_CHECKING:
    from statekeeper.maintenance.settings import MaintenanceSettings

ENV_ENGINE = "STATEKEEPER_MAINTENANCE_ENGINE"
ENV_SPARK_MASTER = "STATEKEEPER_SPARK_MASTER"

_CATALOGS: OrderedDict[tuple[int, str], Catalog] = OrderedDict()
"""The open catalog of each database URL in this process (and pid: a forked child opens its own)."""
_CATALOGS_LOCK = threading.Lock()
MAX_OPEN_CATALOGS = 8
"""Databases a process keeps open at once; the least recently used beyond this is closed."""


class CheckpointStorage(ConfigurableResource):  # type: ignore[type-arg]
    """Where the checkpoints are: one or several root URIs (local path, file:// or s3://bucket/prefix)."""

    roots: list[str] = Field(description="Checkpoint root URIs; each is one partition of every asset.")
    s3_endpoint_url: str | None = Field(
        default=None, description="S3-compatible endpoint for s3:// roots (MinIO, moto...); None: AWS."
    )
    s3_region: str | None = Field(default=None, description="Region of the S3 buckets.")

    def root_uris(self) -> list[str]:
        return [normalize_root(r, "CheckpointStorage.roots") for r in self.roots]

    def s3_options(self, root: str) -> dict[str, Any]:
        if not root.startswith(("s3://", "s3a://")):
            return {}
        opts: dict[str, Any] = {}
        if self.s3_endpoint_url:
            opts["endpoint_url"] = self.s3_endpoint_url
        if self.s3_region:
            opts["region_name"] = self.s3_region
        return opts

    def root_uri(self, root: str) -> str:
        """The normalised URI of `root`, which must be one of the configured roots (no file manager opened)."""
        uri = normalize_root(root, "the partition key")
        configured = self.root_uris()
        if uri not in configured:
            raise ConfigurationError(f"checkpoint root {root!r} is not configured; configured: {configured}")
        return uri

    def file_manager(self, root: str) -> CheckpointFileManager:
        """The file manager of `root`, which must be one of the configured roots."""
        uri = self.root_uri(root)
        return open_file_manager(uri, **self.s3_options(uri))


class CatalogDatabase(ConfigurableResource):  # type: ignore[type-arg]
    """The lineage catalog (SQLite file or PostgreSQL); migrated to this release on first use."""

    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the catalog; None: STATEKEEPER_DB_URL, else ~/.statekeeper/catalog.db.",
    )

    def resolved_url(self) -> str:
        return self.url or default_url()

    def open(self) -> Catalog:
        """This process's catalog of the URL, migrated to this release when first opened.

        One engine per database per process, as SQLAlchemy advises: its connection pool and compiled
        statements outlive a run or a sensor tick (an engine each time compiled every statement again and
        read the schema revision on every tick and run: a tenth of the fleet's maintenance CPU)."""
        url = self.resolved_url()
        key = (os.getpid(), normalize_url(url).render_as_string(hide_password=False))
        with _CATALOGS_LOCK:
            catalog = _CATALOGS.get(key)
            if catalog is not None:
                _CATALOGS.move_to_end(key)
                return catalog
            catalog = _CATALOGS[key] = Catalog.open(url, upgrade=True)
            while len(_CATALOGS) > MAX_OPEN_CATALOGS:
                _, old = _CATALOGS.popitem(last=False)
                old.close()  # connections in use elsewhere are closed when returned
            return catalog

    @contextmanager
    def session(self) -> Iterator[Catalog]:
        """The open catalog (see `open`), for a block."""
        yield self.open()


class MaintenanceConfig(ConfigurableResource):  # type: ignore[type-arg]
    """Maintenance settings (`statekeeper.maintenance.settings.MaintenanceSettings`), defaults from its `from_env()`."""

    snapshot_threshold: int = Field(default=10, description="Snapshot a store once its changelog chain is this long.")
    snapshot_spread: float = Field(
        default=0.0,
        description="Snapshot each store up to this fraction of the threshold early, at a point drawn per store: "
        "the partitions of an operator, which commit in lock step, are then not all due in the same run.",
    )
    snapshot_schedule: str = Field(
        default="threshold",
        description="When a store is due: 'threshold' (at the threshold, less the spread's draw) or 'phase' (at its "
        "own phase of the versions, one in every threshold: each run builds a steady share of the stores).",
    )
    snapshot_round_seconds: float = Field(
        default=0,
        description="A run starts the builds of stores due early (by the spread) for this long; later ones wait "
        "for the next run (0: no bound). Stores at the threshold or needing a repair are always built.",
    )
    min_versions_to_retain: int = Field(default=20, description="Newest committed versions kept loadable.")
    orphan_grace_seconds: float = Field(
        default=3600, description="Orphan candidates younger than this may be in flight: kept."
    )
    load_grace_seconds: float = Field(
        default=0, description="A new snapshot becomes the expiry base when older than this (loads start over)."
    )
    parallelism: int = Field(default=4, description="Stores / delete batches worked on in parallel.")
    build_processes: int = Field(
        default=0,
        description="Snapshot builds in this many worker processes (0: on the run's threads); each run starts its "
        "own, about a second each: worth it for a long-running `statekeeper maintain`, rarely for a run.",
    )
    lease_ttl_seconds: float = Field(default=600, description="Expiry of the catalog lease a maintainer holds.")
    lease_timeout_seconds: float = Field(default=0, description="How long to wait for a store's lease.")
    work_dir: str | None = Field(default=None, description="Warm local copies of stores for snapshots.")
    delete_batch_size: int = Field(default=1000, description="Keys per delete request (S3 takes at most 1000).")
    catalog_history_seconds: float = Field(
        default=86400, description="The catalog's rows of what is gone, and its run records, are kept this long."
    )
    engine: str = Field(
        default="local",
        description="Where snapshots and verification run: 'local' (the run's process) or 'spark' (the stores "
        "fanned out over Spark executors, see maintenance.fanout).",
    )
    spark_master: str | None = Field(
        default=None,
        description="With engine 'spark': spark://host:7077, local[N] or sc://host:15002 (Spark Connect).",
    )

    def snapshot_operation(self) -> Callable[..., Any]:
        """`create_snapshots`, or its Spark fan-out when `engine` is 'spark'."""
        from statekeeper.maintenance.fanout import snapshot_operation

        return snapshot_operation(self.engine, self.spark_master)

    def verify_operation(self) -> Callable[..., Any]:
        """`verify_root`, or its Spark fan-out when `engine` is 'spark'."""
        from statekeeper.maintenance.fanout import verify_operation

        return verify_operation(self.engine, self.spark_master)

    def settings(self) -> MaintenanceSettings:
        from statekeeper.maintenance.settings import MaintenanceSettings

        return MaintenanceSettings(**{f.name: getattr(self, f.name) for f in fields(MaintenanceSettings)})

    @classmethod
    def from_settings(cls, settings: MaintenanceSettings) -> MaintenanceConfig:
        return cls(**settings.to_json())

    @classmethod
    def from_env(cls) -> MaintenanceConfig:
        from statekeeper.maintenance.settings import MaintenanceSettings

        engine = os.environ.get(ENV_ENGINE, "local")
        master = os.environ.get(ENV_SPARK_MASTER) or None
        return cls.from_settings(MaintenanceSettings.from_env()).model_copy(
            update={"engine": engine, "spark_master": master}
        )


def build_resources(config: OrchestrationConfig) -> dict[str, Any]:
    """The resources of the code location, keyed as the assets, checks and sensors ask for them."""
    storage = CheckpointStorage(
        roots=list(config.roots), s3_endpoint_url=config.s3_endpoint_url, s3_region=config.s3_region
    )
    catalog = CatalogDatabase(url=EnvVar(ENV_DB_URL) if config.db_url_from_env else config.db_url or default_url())
    return {"storage": storage, "catalog": catalog, "maintenance": MaintenanceConfig.from_env()}


__all__ = ["CatalogDatabase", "CheckpointStorage", "MaintenanceConfig", "build_resources"]
