"""What the code location is configured with: environment variables, with defaults for a fresh machine.

Everything is read once, when Dagster loads the code location (`dagster dev` reloads it on
"Reload definitions"). The checkpoint roots become the partitions of every asset, so each root
has its own materialization history, its own plots and its own run queue.

| variable | default | meaning |
|---|---|---|
| STATEKEEPER_CHECKPOINT_ROOTS | ``<repo>/run/demo-checkpoint`` | root URIs, comma or newline separated |
| STATEKEEPER_S3_ENDPOINT_URL / STATEKEEPER_S3_REGION | unset (AWS) | S3-compatible endpoint and region |
| STATEKEEPER_DB_URL | ``sqlite:///~/.statekeeper/catalog.db`` | the catalog database (see `statekeeper.sql.db`) |
| STATEKEEPER_EXPIRY_SCHEDULE | ``0 * * * *`` (hourly) | cron of the expiry schedule, or ``off`` |
| STATEKEEPER_ORPHAN_SCHEDULE | ``30 3 * * *`` (daily) | cron of the orphan-cleanup schedule, or ``off`` |
| STATEKEEPER_VERIFY_SCHEDULE | ``30 * * * *`` (hourly) | cron of the loadability-check schedule, or ``off`` |
| STATEKEEPER_SCHEDULE_TIMEZONE | ``UTC`` | time zone of the crons |
| STATEKEEPER_CHECKPOINT_SENSOR | ``on`` | ``off`` stops the checkpoint-location sensor |
| STATEKEEPER_SENSOR_INTERVAL_SECONDS | ``30`` | minimum seconds between two sensor ticks |
| STATEKEEPER_SENSOR_MAX_NAMES | ``10000`` | commit names one tick lists at most per root (the rest next tick) |
| STATEKEEPER_SENSOR_LISTING_SECONDS | ``300`` | seconds between two ticks that list every store's directories |
| STATEKEEPER_SENSOR_FLEET_ROOTS | ``2`` | one run for a tick's roots if this many have work (``off``: a run each) |
| STATEKEEPER_FAILURE_SENSOR | ``on`` | ``off`` stops recording failed runs in the catalog |
| STATEKEEPER_EXTERNAL_RUNS_SENSOR | ``on`` | ``off`` stops reporting the runs of maintainers outside Dagster |

Maintenance settings (snapshot threshold, retention, grace period, parallelism...) come from
`statekeeper.maintenance.settings.MaintenanceSettings.from_env()`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import normalize_root_uri

ENV_ROOTS = "STATEKEEPER_CHECKPOINT_ROOTS"
ENV_DB_URL = "STATEKEEPER_DB_URL"
ENV_S3_ENDPOINT = "STATEKEEPER_S3_ENDPOINT_URL"
ENV_S3_REGION = "STATEKEEPER_S3_REGION"
ENV_EXPIRY_SCHEDULE = "STATEKEEPER_EXPIRY_SCHEDULE"
ENV_ORPHAN_SCHEDULE = "STATEKEEPER_ORPHAN_SCHEDULE"
ENV_VERIFY_SCHEDULE = "STATEKEEPER_VERIFY_SCHEDULE"
ENV_TIMEZONE = "STATEKEEPER_SCHEDULE_TIMEZONE"
ENV_SENSOR = "STATEKEEPER_CHECKPOINT_SENSOR"
ENV_SENSOR_INTERVAL = "STATEKEEPER_SENSOR_INTERVAL_SECONDS"
ENV_SENSOR_MAX_NAMES = "STATEKEEPER_SENSOR_MAX_NAMES"
ENV_SENSOR_LISTING = "STATEKEEPER_SENSOR_LISTING_SECONDS"
ENV_SENSOR_FLEET_ROOTS = "STATEKEEPER_SENSOR_FLEET_ROOTS"
ENV_FAILURE_SENSOR = "STATEKEEPER_FAILURE_SENSOR"
ENV_EXTERNAL_RUNS_SENSOR = "STATEKEEPER_EXTERNAL_RUNS_SENSOR"

DEFAULT_EXPIRY_CRON = "0 * * * *"
DEFAULT_ORPHAN_CRON = "30 3 * * *"
DEFAULT_VERIFY_CRON = "30 * * * *"
DEFAULT_SENSOR_INTERVAL = 30
DEFAULT_SENSOR_MAX_NAMES = 10_000
DEFAULT_SENSOR_LISTING = 300
DEFAULT_SENSOR_FLEET_ROOTS = 2

_OFF = frozenset({"off", "false", "no", "0", "disabled", "none"})
_ON = frozenset({"on", "true", "yes", "1", "enabled"})
_CRON_FIELD = re.compile(r"^[0-9*/,\-A-Za-z?LW#]+\Z")


def repo_dir() -> Path:
    """The source checkout this package lives in (its `run/` holds the demo's checkpoint), else the cwd."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


def default_roots() -> tuple[str, ...]:
    """The checkpoint `make run`'s demo job writes."""
    return (str(repo_dir() / "run" / "demo-checkpoint"),)


def normalize_root(root: str, source: str = ENV_ROOTS) -> str:
    """The URI under which the file manager (and so the catalog) knows `root`: file:///abs or s3://b/p."""
    try:
        return normalize_root_uri(root.strip())
    except ConfigurationError as e:
        raise ConfigurationError(f"invalid checkpoint root {root!r} in {source}: {e}") from None


def parse_roots(text: str, source: str = ENV_ROOTS) -> tuple[str, ...]:
    """Comma- or newline-separated root URIs, normalised, duplicates dropped, order kept."""
    roots: list[str] = []
    for raw in re.split(r"[,\n]", text):
        if raw.strip():
            uri = normalize_root(raw, source)
            if "..." in uri:
                raise ConfigurationError(f"checkpoint root {raw!r} in {source} contains '...'")
            if uri not in roots:
                roots.append(uri)
    if not roots:
        raise ConfigurationError(f"{source} names no checkpoint root")
    return tuple(roots)


def parse_switch(value: str | None, name: str, default: bool) -> bool:
    if value is None or not value.strip():
        return default
    low = value.strip().lower()
    if low in _ON:
        return True
    if low in _OFF:
        return False
    raise ConfigurationError(f"invalid {name}={value!r}: expected on or off")


def parse_cron(value: str | None, name: str, default: str) -> str | None:
    """A five-field cron string, or None when the schedule is turned off."""
    if value is None or not value.strip():
        return default
    text = value.strip()
    if text.lower() in _OFF:
        return None
    fields = text.split()
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        raise ConfigurationError(f"invalid {name}={value!r}: expected a five-field cron string or 'off'")
    return " ".join(fields)


def parse_positive_int(value: str | None, name: str, default: int) -> int:
    if value is None or not value.strip():
        return default
    try:
        n = int(value.strip())
    except ValueError:
        raise ConfigurationError(f"invalid {name}={value!r}: expected a positive integer") from None
    if n < 1:
        raise ConfigurationError(f"invalid {name}={value!r}: expected a positive integer")
    return n


def parse_count_or_off(value: str | None, name: str, default: int) -> int:
    """A positive integer, or 0 for ``off``."""
    if value is not None and value.strip().lower() in _OFF:
        return 0
    try:
        return parse_positive_int(value, name, default)
    except ConfigurationError:
        raise ConfigurationError(f"invalid {name}={value!r}: expected a positive integer or 'off'") from None


@dataclass(frozen=True)
class OrchestrationConfig:
    """Load-time configuration of the code location (see the module docstring for the variables)."""

    roots: tuple[str, ...]
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    db_url_from_env: bool = False
    """True when STATEKEEPER_DB_URL is set: the resource then reads it through EnvVar (never shown)."""
    db_url: str | None = None
    expiry_cron: str | None = DEFAULT_EXPIRY_CRON
    orphan_cron: str | None = DEFAULT_ORPHAN_CRON
    verify_cron: str | None = DEFAULT_VERIFY_CRON
    timezone: str = "UTC"
    sensor_enabled: bool = True
    sensor_interval_seconds: int = DEFAULT_SENSOR_INTERVAL
    sensor_max_names: int = DEFAULT_SENSOR_MAX_NAMES
    sensor_listing_seconds: int = DEFAULT_SENSOR_LISTING
    sensor_fleet_roots: int = DEFAULT_SENSOR_FLEET_ROOTS
    """One run for the roots of a tick when at least this many have work (0: a run per root)."""
    failure_sensor_enabled: bool = True
    external_runs_sensor_enabled: bool = True
    """Report the maintenance runs the catalog recorded outside Dagster (`statekeeper maintain`) as materializations."""

    def __post_init__(self) -> None:
        if not self.roots:
            raise ConfigurationError("no checkpoint root configured")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OrchestrationConfig:
        env = os.environ if environ is None else environ
        roots_text = env.get(ENV_ROOTS, "")
        roots = parse_roots(roots_text) if roots_text.strip() else tuple(normalize_root(r) for r in default_roots())
        db_url = env.get(ENV_DB_URL, "").strip() or None
        return cls(
            roots=roots,
            s3_endpoint_url=env.get(ENV_S3_ENDPOINT, "").strip() or None,
            s3_region=env.get(ENV_S3_REGION, "").strip() or None,
            db_url_from_env=db_url is not None,
            db_url=db_url,
            expiry_cron=parse_cron(env.get(ENV_EXPIRY_SCHEDULE), ENV_EXPIRY_SCHEDULE, DEFAULT_EXPIRY_CRON),
            orphan_cron=parse_cron(env.get(ENV_ORPHAN_SCHEDULE), ENV_ORPHAN_SCHEDULE, DEFAULT_ORPHAN_CRON),
            verify_cron=parse_cron(env.get(ENV_VERIFY_SCHEDULE), ENV_VERIFY_SCHEDULE, DEFAULT_VERIFY_CRON),
            timezone=env.get(ENV_TIMEZONE, "").strip() or "UTC",
            sensor_enabled=parse_switch(env.get(ENV_SENSOR), ENV_SENSOR, True),
            sensor_interval_seconds=parse_positive_int(
                env.get(ENV_SENSOR_INTERVAL), ENV_SENSOR_INTERVAL, DEFAULT_SENSOR_INTERVAL
            ),
            sensor_max_names=parse_positive_int(
                env.get(ENV_SENSOR_MAX_NAMES), ENV_SENSOR_MAX_NAMES, DEFAULT_SENSOR_MAX_NAMES
            ),
            sensor_listing_seconds=parse_positive_int(
                env.get(ENV_SENSOR_LISTING), ENV_SENSOR_LISTING, DEFAULT_SENSOR_LISTING
            ),
            sensor_fleet_roots=parse_count_or_off(
                env.get(ENV_SENSOR_FLEET_ROOTS), ENV_SENSOR_FLEET_ROOTS, DEFAULT_SENSOR_FLEET_ROOTS
            ),
            failure_sensor_enabled=parse_switch(env.get(ENV_FAILURE_SENSOR), ENV_FAILURE_SENSOR, True),
            external_runs_sensor_enabled=parse_switch(
                env.get(ENV_EXTERNAL_RUNS_SENSOR), ENV_EXTERNAL_RUNS_SENSOR, True
            ),
        )


__all__ = [
    "ENV_DB_URL",
    "ENV_EXPIRY_SCHEDULE",
    "ENV_EXTERNAL_RUNS_SENSOR",
    "ENV_FAILURE_SENSOR",
    "ENV_ORPHAN_SCHEDULE",
    "ENV_ROOTS",
    "ENV_S3_ENDPOINT",
    "ENV_S3_REGION",
    "ENV_SENSOR",
    "ENV_SENSOR_FLEET_ROOTS",
    "ENV_SENSOR_INTERVAL",
    "ENV_SENSOR_LISTING",
    "ENV_SENSOR_MAX_NAMES",
    "ENV_TIMEZONE",
    "ENV_VERIFY_SCHEDULE",
    "OrchestrationConfig",
    "default_roots",
    "normalize_root",
    "parse_cron",
    "parse_roots",
    "repo_dir",
]
