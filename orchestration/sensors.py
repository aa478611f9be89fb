"""Sensors: the checkpoint-location sensor and the run-failure sensor.

**checkpoint_sensor** watches every configured root (local directory or S3 bucket). Its cursor keeps,
per root, the last commit record name it listed; a tick lists only names after it (``start_after``,
S3 ``StartAfter``, paginated), at most ``STATEKEEPER_SENSOR_MAX_NAMES`` of them, so an idle root
costs one short LIST per tick and a huge ``commits/`` prefix is never listed again from the start.
When new commits appeared (or the root is not yet in the catalog) it syncs the lineage catalog
incrementally (catalog sync keeps its own per-prefix cursors): the new commit records at every tick, and
every store's changelog and snapshot directories only at a tick ``STATEKEEPER_SENSOR_LISTING_SECONDS``
(default 300) or more after the last one that listed them. Chain lengths and bases come from the commit
records and the snapshots, which the snapshot runs sync for the stores they write, so a tick needs no
per-store listing (which costs 2 LIST requests per store on S3); the catalog's rows of the newest changelog
files lag by at most that period (or until the store's next snapshot). It then asks the catalog for stores whose
chain since their last snapshot reached the threshold and requests one snapshot run per root for the
stores that newly crossed it. A store "crosses" at version ``snapshot_version + point + k * threshold``
(`statekeeper.maintenance.snapshot_policy`, the policy `statekeeper maintain` shares), its point being the
threshold, or with ``snapshot_spread`` a point drawn per store and snapshot between
``(1 - spread) x threshold`` and the threshold, the same as `statekeeper maintain` draws: the partitions of
an operator commit in lock step, and without the spread every one of them crosses at the same tick, whose
run then builds them all while their chains grow; with ``snapshot_schedule`` ``phase``, the point is the
distance to the store's next phase version (each partition its own phase, a threshold apart). The run key
names each ``operator/partition@version`` it was requested for, and the cursor remembers them, so a crossing
is requested once (Dagster also drops a repeated run key); a store whose chain keeps growing without a
snapshot is requested again every threshold more changelogs.
**Ahead of the threshold:** a snapshot lands some commits after the version it was requested at (the
tick's wait, the run's process start, the stores snapshotted before it in the run). The cursor keeps that
lag per root, as the landed snapshots show it; when it exceeds about 3/4 of the threshold, stores are
requested that much earlier (`snapshot_lead`, at ``threshold - lead``), so a chain stays under 2 x threshold
at the cost of a snapshot every ``2 x threshold - threshold // 4`` commits instead of every ``threshold +
lag``. The run snapshots a store named ``@version`` once it committed that version.
It also requests expiry of the root (without the loadability check, which the verification schedule's
runs do) when a commit moved a store's *base* (the snapshot the oldest retained version loads from; the
catalog's `expiry_bases`): the old base and the changelogs up to the new one go within a tick or two,
not at the next hourly schedule. The cursor remembers the bases requested for.

A tick requests at most one run per root: a `snapshot_job` run, an `expiry_job` run, or, when it finds
both crossings and moved bases, one `snapshot_and_expiry_job` run. When ``STATEKEEPER_SENSOR_FLEET_ROOTS``
(default 2) or more roots have work in one tick, or the sensor's last fleet run is in progress, it requests
instead one `fleet_maintenance_job` run for all of them (`statekeeper.orchestration.fleet`): a run's
process start is paid once per tick, not once per root. While a run the sensor requested for a root (or
any fleet run) is still queued (the root's slot is busy), the tick requests nothing more for it and keeps
what it found for a later tick, which asks for all of it in one run: a run costs about 2 s of process
start, in the root's slot and on the cores, whatever it does, and a queue of small runs only adds those.

**The catalog sync as materializations.** Every tick that synced a root's catalog reports it as the root's
partition of ``lineage_catalog`` (an `AssetMaterialization`, ``synced_by: checkpoint_sensor``; an
`AssetObservation` naming the errors when the sync had some): the sync's counts, the root's chains and size,
the snapshot lag percentiles and the ``worst_stores`` table (`sync_event`), so the catalog the sensor keeps
current does not read "Never materialized" and its plots have a point per synced tick.

**maintenance_failure_sensor** records every failed maintenance run in the catalog: a catalog run
row that the failed run left ``running`` (a killed process) is marked failed; a run that failed
before its operation recorded anything (a resource, a lease, a crash) gets a failed row of its own.
"""

import datetime as dt
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    MetadataValue,
    RunFailureSensorContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    run_failure_sensor,
    sensor,
)
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition
from dagster._core.storage.tags import PARTITION_NAME_TAG, PRIORITY_TAG

from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_policy import crossing_version, landed_lag, snapshot_lead
from statekeeper.orchestration.assets import KIND_TAG, KINDS, LINEAGE, ROOT_TAG, lineage_metadata
from statekeeper.orchestration.config import (
    DEFAULT_SENSOR_LISTING,
    ENV_FAILURE_SENSOR,
    ENV_SENSOR,
    OrchestrationConfig,
    normalize_root,
)
from statekeeper.orchestration.fleet import FLEET_TAG, fleet_request, fleet_roots
from statekeeper.orchestration.jobs import SNAPSHOT_AND_EXPIRY_KIND, expiry_request, snapshot_request
from statekeeper.orchestration.resources import CatalogDatabase, CheckpointStorage, MaintenanceConfig
from statekeeper.sql import Catalog
from statekeeper.sql.errors import CatalogError
from statekeeper.sql.models import RUN_FAILED, RUN_RUNNING
from statekeeper.store.errors import StatekeeperError
from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.layout import COMMITS_DIR, StoreId
from statekeeper.store.rocks import release_free_heap

SENSOR_NAME = "checkpoint_sensor"
FAILURE_SENSOR_NAME = "maintenance_failure_sensor"
TRIGGER_TAG = "statekeeper/trigger"
COMMITS_PREFIX = f"{COMMITS_DIR}/"
CURSOR_VERSION = 1
RUN_KEY_LISTED_STORES = 8
"""Run keys name up to this many store@version crossings; more are named by a digest."""


# -- cursor --------------------------------------------------------------------------------------


@dataclass
class RootCursor:
    listed: dict[str, str] = field(default_factory=dict)
    """prefix -> the last name listed under it."""
    requested: dict[str, int] = field(default_factory=dict)
    """'operator/partition' -> the crossing version a snapshot run was requested for."""
    bases: dict[str, int] = field(default_factory=dict)
    """'operator/partition' -> the base an expiry run was requested for."""
    stores_listed_at: float = 0.0
    """When (epoch seconds) a tick last listed every store's directories."""
    waiting: dict[str, int] = field(default_factory=dict)
    """'operator/partition' -> the version its oldest unanswered snapshot request was made at (a store asked for
    again before a snapshot landed keeps its first), for the snapshot lag."""
    snapshot_lag: int = 0
    """Commits a store made between the version its snapshot was first requested at and the snapshot that answered:
    the most the root's latest snapshots showed (it falls halfway towards smaller lags as they land)."""


@dataclass
class SensorCursor:
    roots: dict[str, RootCursor] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None) -> "SensorCursor":
        if not text:
            return cls()
        try:
            raw = json.loads(text)
            if raw.get("v") != CURSOR_VERSION:
                return cls()
            return cls(
                {
                    root: RootCursor(
                        dict(rc.get("listed", {})),
                        {k: int(v) for k, v in rc.get("requested", {}).items()},
                        {k: int(v) for k, v in rc.get("bases", {}).items()},
                        float(rc.get("stores_listed_at", 0.0)),
                        {k: int(v) for k, v in rc.get("waiting", {}).items()},
                        int(rc.get("snapshot_lag", 0)),
                    )
                    for root, rc in raw.get("roots", {}).items()
                }
            )
        except (ValueError, AttributeError, TypeError):
            return cls()  # an unreadable cursor: start over (listing is idempotent, run keys dedupe)

    def dump(self) -> str:
        return json.dumps(
            {
                "v": CURSOR_VERSION,
                "roots": {
                    r: {
                        "listed": c.listed,
                        "requested": c.requested,
                        "bases": c.bases,
                        "stores_listed_at": c.stores_listed_at,
                        "waiting": c.waiting,
                        "snapshot_lag": c.snapshot_lag,
                    }
                    for r, c in sorted(self.roots.items())
                },
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    def root(self, uri: str) -> RootCursor:
        return self.roots.setdefault(uri, RootCursor())


# -- one root per tick ---------------------------------------------------------------------------


def list_new(fm: CheckpointFileManager, prefix: str, start_after: str | None, limit: int) -> list[str]:
    """Names under `prefix` after `start_after`, ascending, at most `limit` (the rest next tick)."""
    names: list[str] = []
    for info in fm.list(prefix, start_after=start_after):
        names.append(info.path)
        if len(names) >= limit:
            break
    return names


def run_key(kind: str, root: str, events: list[str]) -> str:
    """`kind:root:` and the store@version events the run is requested for (a digest when many)."""
    if len(events) <= RUN_KEY_LISTED_STORES:
        return f"{kind}:{root}:{','.join(events)}"
    digest = hashlib.sha256("\n".join(events).encode()).hexdigest()[:24]
    return f"{kind}:{root}:{len(events)}-stores-{digest}"


@dataclass
class RootTick:
    root: str
    new_names: list[str] = field(default_factory=list)
    synced: bool = False
    sync_errors: list[str] = field(default_factory=list)
    sync: Any = None
    """The tick's `CatalogSyncResult`, when it synced (reported as ``lineage_catalog``: `sync_event`)."""
    crossings: list[str] = field(default_factory=list)
    """New store@version crossings (those a run is requested for this tick, unless held)."""
    moved_bases: list[str] = field(default_factory=list)
    """Stores whose base moved (store@base), those expiry is requested for this tick, unless held."""
    lead: int = 0
    """Commits before the threshold the tick requested snapshots at (`snapshot_lead`)."""
    request: RunRequest | None = None
    """The tick's one run for the root: snapshots, expiry, or both."""
    held: bool = False
    """A run requested earlier is still queued: the crossings and moved bases wait for a later tick."""


SENSOR_RUN_TAGS = {TRIGGER_TAG: SENSOR_NAME, PRIORITY_TAG: "1"}
"""Tags of the runs the sensor requests. A root runs one maintenance run at a time; its queued runs start
by priority (``dagster/priority``, 0 when unset), then in the order they were requested. The sensor's
snapshot and expiry runs bound the chains and the checkpoint, so they go before a schedule's runs (an
expiry, an orphan cleanup listing the whole root) that are still queued."""


def evaluate_root(
    catalog: Catalog,
    fm: CheckpointFileManager,
    rc: RootCursor,
    *,
    settings: MaintenanceSettings,
    max_names: int,
    listing_seconds: float = DEFAULT_SENSOR_LISTING,
    now: float | None = None,
    hold: bool = False,
) -> RootTick:
    """One tick for one root: list what is new, sync lineage, request snapshots and expiry. Updates `rc`.

    Every store's directories are listed when the root is new to the catalog or `listing_seconds` have
    passed since a tick last listed them; other ticks sync the new commit records alone. With `hold` (a run
    the sensor requested for the root is still queued) nothing is requested and the cursor does not record
    the crossings and moved bases, so a later tick requests them. `settings`: the snapshot threshold and points,
    and the versions retained."""
    from statekeeper.maintenance.catalog_sync import sync_catalog

    root = fm.root_uri
    tick = RootTick(root)
    tick.new_names = list_new(fm, COMMITS_PREFIX, rc.listed.get(COMMITS_PREFIX), max_names)
    known = catalog.find_root(root) is not None
    now = time.time() if now is None else now
    list_stores = not known or not 0 <= now - rc.stores_listed_at < listing_seconds  # a clock set back lists too
    if tick.new_names or list_stores:
        result = sync_catalog(catalog, fm, raise_on_error=False, stores=None if list_stores else ())
        tick.synced = True
        tick.sync = result
        tick.sync_errors = list(result.errors)
        if list_stores and not result.errors:
            rc.stores_listed_at = now
    if tick.new_names and not tick.sync_errors:
        rc.listed[COMMITS_PREFIX] = tick.new_names[-1]  # unreadable files: list them again next tick
    if catalog.find_root(root) is None:
        return tick
    chains = catalog.chain_lengths(root)
    threshold = settings.snapshot_threshold
    lag, landed = landed_lag(chains, rc.waiting, rc.snapshot_lag, threshold)
    tick.lead = snapshot_lead(lag, threshold)
    crossed: dict[str, int] = {}
    for c in chains:
        store = StoreId(c.operator, c.partition)
        if (v := crossing_version(settings, store, c.latest_version, c.chain_length, tick.lead)) is not None:
            crossed[str(store)] = v
    fresh = {store: v for store, v in crossed.items() if rc.requested.get(store, -1) < v}
    tick.crossings = sorted(f"{store}@{v}" for store, v in fresh.items())
    bases = catalog.expiry_bases(root, retain=settings.min_versions_to_retain)
    tick.moved_bases = sorted(f"{store}@{v}" for store, v in bases.items() if rc.bases.get(store, 0) < v)
    if hold:
        tick.held = bool(tick.crossings or tick.moved_bases)
        return tick
    rc.requested = {store: v for store, v in rc.requested.items() if store in crossed} | fresh
    stores = {f"{c.operator}/{c.partition}" for c in chains}
    rc.waiting = fresh | {store: v for store, v in rc.waiting.items() if store in stores and store not in landed}
    rc.snapshot_lag = lag
    rc.bases = bases
    tick.request = _request(root, tick.crossings, tick.moved_bases)
    return tick


def _events(crossings: list[str], moved_bases: list[str]) -> list[str]:
    """What a run is requested for, as its run key names it: the store@version crossings, then the moved bases."""
    return [*crossings, *(f"base:{b}" for b in moved_bases)]


def _request(root: str, crossings: list[str], moved_bases: list[str]) -> RunRequest | None:
    """One run for the tick's crossings and moved bases of `root` (None when there are neither)."""
    if crossings and moved_bases:
        events = _events(crossings, moved_bases)
        return snapshot_request(root, run_key("maintain", root, events), crossings, SENSOR_RUN_TAGS, expire=True)
    if crossings:
        return snapshot_request(root, run_key("snapshot", root, crossings), crossings, SENSOR_RUN_TAGS)
    if moved_bases:
        return expiry_request(root, run_key("expire", root, moved_bases), SENSOR_RUN_TAGS)
    return None


def sync_event(catalog: Catalog, root: str, result: Any, threshold: int) -> AssetMaterialization | AssetObservation:
    """A tick's catalog sync of `root` as the root's partition of ``lineage_catalog``: the asset's own metadata
    (`lineage_metadata`) without its table of every store's chain (a tick's event stays small: the
    ``worst_stores`` table has them at their worst); an observation naming the errors when the sync had some."""
    md = lineage_metadata(catalog, root, result, threshold)
    del md["details"]
    md["synced_by"] = MetadataValue.text(SENSOR_NAME)
    if result.errors:
        md["errors_text"] = MetadataValue.text("\n".join(str(e) for e in result.errors)[:4000])
        return AssetObservation(asset_key=LINEAGE, partition=root, metadata=md)
    return AssetMaterialization(asset_key=LINEAGE, partition=root, metadata=md)


PENDING = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING]


def run_roots(run: DagsterRun) -> list[str]:
    """The roots a maintenance run works on: its partition, or the roots a fleet run names."""
    if FLEET_TAG in run.tags:
        return fleet_roots(run.run_config)
    partition = run.tags.get(PARTITION_NAME_TAG) or run.tags.get(ROOT_TAG)  # verification runs: the tag
    return [partition] if partition else []


def pending_sensor_runs(instance: DagsterInstance) -> dict[str, str]:
    """Root -> the id of a run this sensor requested for it that has not started its work yet: queued, or its
    process still starting (seconds on a busy machine; it reads the chains once it runs). A pending fleet run
    is also under the key `FLEET_TAG`."""
    pending: dict[str, str] = {}
    for run in instance.get_runs(RunsFilter(statuses=PENDING, tags={TRIGGER_TAG: SENSOR_NAME})):
        for key in [*run_roots(run), *([FLEET_TAG] if FLEET_TAG in run.tags else [])]:
            pending.setdefault(key, run.run_id)
    return pending


def fleet_run_started(instance: DagsterInstance) -> bool:
    """Whether a fleet run of this sensor is doing its work now."""
    tags = {TRIGGER_TAG: SENSOR_NAME, FLEET_TAG: "true"}
    return bool(instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED], tags=tags), limit=1))


def tick_requests(due: list[RootTick], fleet_roots_min: int, fleet_started: bool) -> list[RunRequest]:
    """The tick's runs for the roots `due` (those with a request): one fleet run when at least `fleet_roots_min`
    (0: never) have one, or while the last fleet run is in progress (a root's run would wait for its leases);
    else their own runs."""
    if fleet_roots_min and due and (len(due) >= fleet_roots_min or fleet_started):
        work = {t.root: (t.crossings, t.moved_bases) for t in due}
        events = [f"{root}|{e}" for root, (crossings, bases) in sorted(work.items()) for e in _events(crossings, bases)]
        return [fleet_request(work, run_key("fleet", f"{len(work)}-roots", events), SENSOR_RUN_TAGS)]
    return [t.request for t in due if t.request is not None]


def build_checkpoint_sensor(
    config: OrchestrationConfig, jobs: list[UnresolvedAssetJobDefinition | JobDefinition]
) -> SensorDefinition:
    """The checkpoint sensor, requesting runs of `jobs` (the snapshot, expiry, snapshot-and-expiry and fleet jobs)."""

    @sensor(
        name=SENSOR_NAME,
        jobs=jobs,
        minimum_interval_seconds=config.sensor_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING if config.sensor_enabled else DefaultSensorStatus.STOPPED,
        description=(
            "Lists new commit records of every checkpoint root after its cursor, syncs the lineage catalog and "
            "requests a run that snapshots the stores whose chain crossed the threshold and expires what a "
            "moved base left behind ("
            + (
                f"one run for all the roots with work when {config.sensor_fleet_roots} or more have some, else "
                if config.sensor_fleet_roots
                else ""
            )
            + "one run per root; none while the sensor's last run of the root is queued)."
            + ("" if config.sensor_enabled else f" Turned off by {ENV_SENSOR}=off.")
        ),
    )
    def checkpoint_sensor(
        context: SensorEvaluationContext,
        storage: CheckpointStorage,
        catalog: CatalogDatabase,
        maintenance: MaintenanceConfig,
    ) -> SensorResult | SkipReason:
        if not config.sensor_enabled:
            return SkipReason(f"turned off by {ENV_SENSOR}=off")
        try:
            return _tick(context, storage, catalog, maintenance)
        finally:
            release_free_heap()  # the code server evaluates a tick every few seconds for weeks

    def _tick(
        context: SensorEvaluationContext,
        storage: CheckpointStorage,
        catalog: CatalogDatabase,
        maintenance: MaintenanceConfig,
    ) -> SensorResult:
        state = SensorCursor.parse(context.cursor)
        settings = maintenance.settings()  # validated: a bad value fails the tick, naming the setting
        ticks: list[RootTick] = []
        events: list[AssetMaterialization | AssetObservation] = []
        notes: list[str] = []
        waiting = False  # a root whose work waits for the run queued for it
        unknown = False  # a root the tick could not evaluate: whether it has work is not known
        roots = storage.root_uris()
        pending = pending_sensor_runs(context.instance)
        fleet_pending = pending.get(FLEET_TAG) if config.sensor_fleet_roots else None
        with catalog.session() as cat:
            for root in roots:
                queued = pending.get(root) or fleet_pending  # a pending fleet run holds every root: next, one run
                try:
                    tick = evaluate_root(
                        cat,
                        storage.file_manager(root),
                        state.root(root),
                        settings=settings,
                        max_names=config.sensor_max_names,
                        listing_seconds=config.sensor_listing_seconds,
                        hold=queued is not None,
                    )
                except (StatekeeperError, CatalogError, OSError) as e:
                    context.log.error("checkpoint sensor: %s: %s", root, e)
                    notes.append(f"{root}: {e}")
                    unknown = True
                    continue
                for err in tick.sync_errors:
                    context.log.warning("catalog sync of %s: %s", root, err)
                if tick.sync is not None:
                    events.append(sync_event(cat, root, tick.sync, settings.snapshot_threshold))
                if tick.new_names:
                    notes.append(f"{root}: {len(tick.new_names)} new commit(s)")
                work = [f"snapshots of {', '.join(tick.crossings)}"] if tick.crossings else []
                if tick.crossings and tick.lead:
                    lag = state.root(root).snapshot_lag
                    work.append(f"{tick.lead} commit(s) before the threshold: snapshots land {lag} after request")
                work += [f"expiry, bases moved to {', '.join(tick.moved_bases)}"] if tick.moved_bases else []
                if tick.held:
                    context.log.info("%s: run %s is still queued; later: %s", root, queued, "; ".join(work))
                    notes.append(f"{root}: waiting for queued run {queued}, then {'; '.join(work)}")
                    waiting = True
                if tick.request is not None:
                    context.log.info("requested for %s: %s", root, "; ".join(work))
                    ticks.append(tick)
        state.roots = {r: c for r, c in state.roots.items() if r in roots}
        fleet_started = bool(config.sensor_fleet_roots and ticks) and fleet_run_started(context.instance)
        requests = tick_requests(ticks, config.sensor_fleet_roots, fleet_started)
        if requests:
            return SensorResult(run_requests=requests, asset_events=events, cursor=state.dump())
        reason = "; ".join(notes) if notes else "no new commits"
        what = "no run requested" if waiting or unknown else "no store crossed the threshold or moved its base"
        return SensorResult(
            skip_reason=SkipReason(f"{what} ({reason})"),
            asset_events=events,
            cursor=state.dump(),
        )

    return checkpoint_sensor


# -- failures ------------------------------------------------------------------------------------


def maintenance_kind(run: DagsterRun) -> str | None:
    """The maintenance kind of a run (its tag, else its selected assets), None if not maintenance."""
    kind = run.tags.get(KIND_TAG)
    if kind:
        return kind
    selected = {key.to_user_string() for key in (run.asset_selection or ())}
    kinds = [KINDS[name] for name in KINDS if name in selected]
    if not kinds:
        return None
    return kinds[0] if len(kinds) == 1 else SNAPSHOT_AND_EXPIRY_KIND


def record_failed_run(
    catalog: Catalog,
    root: str,
    kind: str,
    run_id: str,
    message: str,
    *,
    started_at: dt.datetime | None = None,
    details: dict[str, Any] | None = None,
) -> list[int]:
    """Mark the catalog runs of Dagster run `run_id` failed, or record one; returns the catalog run ids."""
    mine = [r for r in catalog.runs(root, limit=500) if r.orchestrator_run_id == run_id]
    error = f"Dagster run {run_id} failed: {message}"[:4000]
    touched: list[int] = []
    for r in mine:
        if r.status == RUN_RUNNING:
            catalog.finish_run(
                r.id,
                status=RUN_FAILED,
                stores=r.store_count,
                files=r.file_count,
                bytes=r.byte_count,
                errors=[*(r.errors.splitlines() if r.errors else []), error],
                details={**(r.details or {}), "recorded_by": FAILURE_SENSOR_NAME},
            )
            touched.append(r.id)
    if not mine:
        rid = catalog.start_run(root, kind[:32], orchestrator_run_id=run_id, started_at=started_at)
        catalog.finish_run(
            rid, status=RUN_FAILED, errors=[error], details={**(details or {}), "recorded_by": FAILURE_SENSOR_NAME}
        )
        touched.append(rid)
    return touched


def failure_message(context: RunFailureSensorContext) -> str:
    """The run's failure message and the error of each failed step."""
    parts = [context.failure_event.message or "run failed"]
    for event in context.get_step_failure_events():
        data = event.step_failure_data
        error = data.error if data is not None else None
        while error is not None and error.cause is not None:  # the user error under Dagster's wrapper
            error = error.cause
        if error is not None:
            parts.append(f"{event.step_key}: {error.message.strip()}")
    return "\n".join(parts)


def build_failure_sensor(config: OrchestrationConfig) -> SensorDefinition:
    @run_failure_sensor(
        name=FAILURE_SENSOR_NAME,
        default_status=DefaultSensorStatus.RUNNING if config.failure_sensor_enabled else DefaultSensorStatus.STOPPED,
        description="Records every failed maintenance run of this code location in the catalog."
        + ("" if config.failure_sensor_enabled else f" Turned off by {ENV_FAILURE_SENSOR}=off."),
    )
    def maintenance_failure_sensor(context: RunFailureSensorContext, catalog: CatalogDatabase) -> SkipReason | None:
        run = context.dagster_run
        kind = maintenance_kind(run)
        if kind is None:
            return SkipReason(f"run {run.run_id} ({run.job_name}) is not a maintenance run")
        partitions = run_roots(run)
        if not partitions:
            return SkipReason(f"run {run.run_id} has no checkpoint root (no partition)")
        record = context.instance.get_run_record_by_id(run.run_id)
        started = None
        if record is not None and record.start_time is not None:
            started = dt.datetime.fromtimestamp(record.start_time, dt.UTC)
        message = failure_message(context)
        for partition in partitions:  # a fleet run: each root it named
            root = normalize_root(partition, "the run's partition")  # also a root no longer configured
            with catalog.session() as cat:
                ids = record_failed_run(
                    cat, root, kind, run.run_id, message, started_at=started, details={"dagster_job": run.job_name}
                )
            context.log.info("recorded failed %s run %s of %s in the catalog (runs %s)", kind, run.run_id, root, ids)
        return None

    return maintenance_failure_sensor


__all__ = [
    "FAILURE_SENSOR_NAME",
    "SENSOR_NAME",
    "RootCursor",
    "RootTick",
    "SensorCursor",
    "build_checkpoint_sensor",
    "build_failure_sensor",
    "evaluate_root",
    "list_new",
    "maintenance_kind",
    "record_failed_run",
    "run_key",
    "run_roots",
    "sync_event",
    "tick_requests",
]
