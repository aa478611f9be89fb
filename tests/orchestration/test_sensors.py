"""The checkpoint-location sensor over several ticks (local and S3 through moto, listings paginated)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetKey, DagsterRunStatus, RunRequest, SensorResult, build_sensor_context
from dagster._core.storage.tags import PARTITION_NAME_TAG, PRIORITY_TAG

from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.maintenance.snapshot_policy import snapshot_lead
from statekeeper.orchestration import assets, sensors
from statekeeper.orchestration.assets import RETAINED, SNAPSHOTS
from statekeeper.orchestration.checks import CHAINS, CHAINS_BOUNDED
from statekeeper.orchestration.jobs import JOB_NAMES, SNAPSHOT_AND_EXPIRY_JOB, requested_job
from statekeeper.orchestration.resources import MaintenanceConfig
from statekeeper.orchestration.sensors import (
    COMMITS_PREFIX,
    SENSOR_NAME,
    RootCursor,
    SensorCursor,
    evaluate_root,
    run_key,
)
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.files import CheckpointFileManager, FileInfo, open_file_manager
from statekeeper.store.layout import commit_path
from tests.orchestration.conftest import RETAIN, THRESHOLD, Orch
from tests.orchestration.helpers import CheckpointWriter

SETTINGS = MaintenanceSettings(snapshot_threshold=THRESHOLD, min_versions_to_retain=RETAIN)
LARGE = MaintenanceSettings(snapshot_threshold=100, min_versions_to_retain=100)
"""No store reaches the threshold or moves its base in the test."""


class CountingFileManager:
    """Wraps a file manager; records each listing (prefix, start_after, names returned)."""

    def __init__(self, fm: CheckpointFileManager) -> None:
        self._fm = fm
        self.listings: list[tuple[str, str | None, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fm, name)

    @property
    def root_uri(self) -> str:
        return self._fm.root_uri

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[FileInfo]:
        n = 0
        try:
            for info in self._fm.list(prefix, start_after=start_after):
                n += 1
                yield info
        finally:
            self.listings.append((prefix, start_after, n))


def tick(orch: Orch, cursor: str | None) -> SensorResult:
    sensor = orch.defs.get_repository_def().get_sensor_def(SENSOR_NAME)
    ctx = build_sensor_context(cursor=cursor, resources=orch.resources, instance=orch.instance)
    result = sensor(ctx)
    assert isinstance(result, SensorResult)
    return result


def test_sensor_ticks_request_each_crossing_once(orch: Orch) -> None:
    run_keys: list[str] = []

    def step(cursor: str | None) -> tuple[str, list[RunRequest]]:
        result = tick(orch, cursor)
        assert result.cursor is not None
        requests = list(result.run_requests or [])
        run_keys.extend(r.run_key for r in requests if r.run_key)
        return result.cursor, requests

    # an empty root: nothing to list, the root enters the catalog
    cursor, requests = step(None)
    assert requests == []
    assert orch.catalog.find_root(orch.root) is not None

    # below the threshold: lineage synced, nothing requested; the cursor holds the last commit name
    orch.writer.commit(THRESHOLD - 1)
    cursor, requests = step(cursor)
    assert requests == []
    state = SensorCursor.parse(cursor)
    assert state.roots[orch.root].listed[COMMITS_PREFIX] == commit_path(THRESHOLD - 1)
    assert len(orch.catalog.committed_versions(orch.root, "agg", 0)) == THRESHOLD - 1

    # the chains cross the threshold: one snapshot run for the root, naming both stores
    orch.writer.commit(1)
    cursor, requests = step(cursor)
    assert len(requests) == 1
    req = requests[0]
    assert req.partition_key == orch.root
    assert req.run_key == run_key("snapshot", orch.root, [f"agg/0@{THRESHOLD}", f"agg/1@{THRESHOLD}"])
    assert req.run_config["ops"][SNAPSHOTS]["config"]["stores"] == [f"agg/0@{THRESHOLD}", f"agg/1@{THRESHOLD}"]

    # no new commit; then commits that leave the crossing where it was: nothing requested again
    cursor, requests = step(cursor)
    assert requests == []
    orch.writer.commit(1)
    cursor, requests = step(cursor)
    assert requests == []

    # still no snapshot at the next multiple of the threshold: requested again, under a new key
    orch.writer.commit(THRESHOLD - 1)
    cursor, requests = step(cursor)
    assert [r.run_key for r in requests] == [
        run_key("snapshot", orch.root, [f"agg/0@{2 * THRESHOLD}", f"agg/1@{2 * THRESHOLD}"])
    ]
    assert len(run_keys) == len(set(run_keys)) == 2
    assert SensorCursor.parse(cursor).roots[orch.root].requested == {"agg/0": 2 * THRESHOLD, "agg/1": 2 * THRESHOLD}


def test_a_commit_that_moves_a_base_requests_an_expiry_run(orch: Orch) -> None:
    """Expiry follows the commits that make an old base unneeded within a tick, not at the hourly
    schedule; each base is requested once, and without the loadability check (the schedule's)."""
    orch.writer.commit(THRESHOLD)
    cursor, requests = _tick_requests(orch, None)
    assert [r.job_name for r in requests] == [JOB_NAMES[SNAPSHOTS]]
    _run(orch, requests[0])
    orch.writer.commit(RETAIN - 2)  # the oldest retained version is still below the snapshot
    cursor, requests = _tick_requests(orch, cursor)
    assert requests == []
    orch.writer.commit(1)  # now it loads from the snapshot: everything before it is unneeded
    cursor, requests = _tick_requests(orch, cursor)
    (req,) = requests
    assert req.job_name == JOB_NAMES[RETAINED] and req.partition_key == orch.root
    assert req.run_key == run_key("expire", orch.root, [f"agg/0@{THRESHOLD}", f"agg/1@{THRESHOLD}"])
    result = _run(orch, req)
    assert result.get_asset_check_evaluations() == [], "the loadability check is the schedule's"
    (mat,) = [e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(RETAINED)]
    assert mat.materialization.metadata["changelogs"].value == 2 * THRESHOLD
    cursor, requests = _tick_requests(orch, cursor)
    assert requests == [], "requested once per base"
    assert SensorCursor.parse(cursor).roots[orch.root].bases == {"agg/0": THRESHOLD, "agg/1": THRESHOLD}


def _tick_requests(orch: Orch, cursor: str | None) -> tuple[str, list[RunRequest]]:
    result = tick(orch, cursor)
    assert result.cursor is not None
    return result.cursor, list(result.run_requests or [])


def _run(orch: Orch, request: RunRequest) -> Any:
    """The run the daemon launches for `request`."""
    result = requested_job(orch.defs, request).execute_in_process(
        run_config=request.run_config, partition_key=request.partition_key, instance=orch.instance
    )
    assert result.success
    return result


def test_each_tick_and_each_run_hands_the_freed_heap_back(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code server ticks the sensor every few seconds for weeks, and a process may execute many runs: each tick
    and each maintenance operation of a run ends with `release_free_heap` (glibc's malloc_trim), as a maintain
    loop's cycle does. Without it a Dagster process running the sensor and its runs for 20 minutes grew its RSS
    outside the block cache by 15.5 MiB instead of 9.7, still rising (docs/reliability.md, memory soaks)."""
    calls: list[str] = []
    monkeypatch.setattr(sensors, "release_free_heap", lambda: calls.append("tick"))
    monkeypatch.setattr(assets, "release_free_heap", lambda: calls.append("run"))
    orch = Orch([str(tmp_path / "root")], db_url)  # on any backend alike: one local root
    try:
        orch.writer.commit(THRESHOLD)
        _cursor, requests = _tick_requests(orch, None)
        assert calls == ["tick"]
        _run(orch, requests[0])
        assert calls == ["tick", "run"]
    finally:
        orch.close()


def test_sensor_lists_only_new_names_and_misses_none(orch: Orch) -> None:
    """Capped at 5 names a tick over S3 pages of 7: every commit seen exactly once, in order."""
    total = 23
    orch.writer.commit(total)
    fm = CountingFileManager(open_file_manager(orch.root))
    rc = RootCursor()
    seen: list[str] = []
    afters: list[str | None] = []
    ticks = 0
    while True:
        ticks += 1
        fm.listings.clear()
        result = evaluate_root(orch.catalog, fm, rc, settings=LARGE, max_names=5)
        assert len(result.new_names) <= 5
        commit_listings = [(after, n) for prefix, after, n in fm.listings if prefix == COMMITS_PREFIX]
        afters.append(commit_listings[0][0])  # the sensor's own listing comes first
        if ticks > 1:  # never again a listing of commits/ from its start
            assert all(after is not None for after, _ in commit_listings)
        if not result.new_names:
            break
        seen.extend(result.new_names)
    assert seen == [commit_path(v) for v in range(1, total + 1)]
    assert ticks == 6
    # each tick listed commits/ after the name the previous tick ended on
    assert afters == [None, *(commit_path(v) for v in (5, 10, 15, 20, 23))]
    # an idle tick: one listing that returns nothing, and no catalog sync
    fm.listings.clear()
    idle = evaluate_root(orch.catalog, fm, rc, settings=LARGE, max_names=5)
    assert not idle.synced and idle.new_names == []
    assert fm.listings == [(COMMITS_PREFIX, commit_path(total), 0)]

    # new commits after the backlog: exactly those
    orch.writer.commit(2)
    more = evaluate_root(orch.catalog, fm, rc, settings=LARGE, max_names=5)
    assert more.new_names == [commit_path(total + 1), commit_path(total + 2)]
    assert more.synced
    assert len(orch.catalog.committed_versions(orch.root, "agg", 1)) == total + 2


def test_ticks_between_listings_read_commit_records_only(orch: Orch) -> None:
    """Chains and crossings from the commit records alone; every store's directories once per listing period."""
    orch.writer.commit(2)
    fm = CountingFileManager(open_file_manager(orch.root))
    rc = RootCursor()
    store_prefixes = {"state/agg/00000/", "state/agg/00001/"}

    def listed_stores() -> set[str]:
        return {p for p, _, _ in fm.listings if any(p.startswith(s) for s in store_prefixes)}

    first = evaluate_root(orch.catalog, fm, rc, settings=SETTINGS, max_names=100, now=1000.0)
    assert first.synced and listed_stores(), "a root new to the catalog: every store listed"
    orch.writer.commit(THRESHOLD)
    fm.listings.clear()
    quiet = evaluate_root(orch.catalog, fm, rc, settings=SETTINGS, max_names=100, now=1299.0)
    assert quiet.synced and listed_stores() == set(), "within the period: the commit records alone"
    assert len(orch.catalog.committed_versions(orch.root, "agg", 1)) == THRESHOLD + 2
    assert quiet.crossings == [f"agg/0@{THRESHOLD}", f"agg/1@{THRESHOLD}"], "chains known without a listing"
    changelogs = {f.path for f in orch.catalog.files(orch.root, kinds=["changelog"])}
    assert len(changelogs) == 2 * 2, "the newest changelogs' rows wait for the next listing"
    fm.listings.clear()
    due = evaluate_root(orch.catalog, fm, rc, settings=SETTINGS, max_names=100, now=1300.0)
    assert due.synced and due.new_names == []
    assert listed_stores() >= {s + "changelogs/" for s in store_prefixes}, "the period passed: every store listed"
    changelogs = {f.path for f in orch.catalog.files(orch.root, kinds=["changelog"])}
    assert len(changelogs) == 2 * (THRESHOLD + 2)
    fm.listings.clear()
    evaluate_root(orch.catalog, fm, rc, settings=SETTINGS, max_names=100, now=900.0)
    assert listed_stores(), "a clock set back does not postpone the next listing"


def test_sensor_keeps_going_when_a_root_fails(tmp_path, db_url: str, s3_endpoint: str) -> None:
    good = str(tmp_path / "good")
    orch = Orch([good, "s3://sk-no-such-bucket-here/ckpt"], db_url)
    try:
        orch.writer.commit(THRESHOLD)
        result = tick(orch, None)
        assert [r.partition_key for r in result.run_requests or []] == [orch.root]
        state = json.loads(result.cursor or "{}")
        assert orch.root in state["roots"]
        assert (
            "s3://sk-no-such-bucket-here/ckpt" not in state["roots"]
            or not state["roots"]["s3://sk-no-such-bucket-here/ckpt"]["listed"]
        )
    finally:
        orch.close()


@pytest.mark.parametrize("text", [None, "", "garbage", '{"v": 99}', '{"v": 1, "roots": []}'])
def test_unreadable_cursor_starts_over(text: str | None) -> None:
    assert SensorCursor.parse(text).roots == {}


def test_sensor_turned_off(tmp_path, db_url: str) -> None:
    orch = Orch([str(tmp_path / "r")], db_url, sensor_enabled=False)
    try:
        sensor = orch.defs.get_repository_def().get_sensor_def(SENSOR_NAME)
        ctx = build_sensor_context(resources=orch.resources, instance=orch.instance)
        result = sensor(ctx)
        assert "turned off" in str(result)
    finally:
        orch.close()


def test_requested_snapshot_run_clears_the_crossing(orch: Orch) -> None:
    """The run the sensor asks for, executed: the chains are short again and nothing is re-requested; a tick
    that finds both crossings and moved bases requests one run that expires, then snapshots, with the chain
    checks and without the loadability check."""
    orch.writer.commit(THRESHOLD)
    first = tick(orch, None)
    [req] = list(first.run_requests or [])
    job = orch.defs.resolve_job_def("snapshot_job")
    result = job.execute_in_process(
        partition_key=req.partition_key, run_config=req.run_config, instance=orch.instance, tags=req.tags
    )
    assert result.success
    assert {c.chain_length for c in orch.catalog.chain_lengths(orch.root)} == {0}
    second = tick(orch, first.cursor)
    assert not second.run_requests
    assert SensorCursor.parse(second.cursor).roots[orch.root].requested == {}
    orch.writer.commit(THRESHOLD)
    third = tick(orch, second.cursor)
    crossings = [f"agg/0@{2 * THRESHOLD}", f"agg/1@{2 * THRESHOLD}"]
    bases = [f"base:agg/0@{THRESHOLD}", f"base:agg/1@{THRESHOLD}"]  # the first snapshot is the base
    (both,) = third.run_requests or []
    assert both.run_key == run_key("maintain", orch.root, crossings + bases)
    assert both.job_name == SNAPSHOT_AND_EXPIRY_JOB and both.partition_key == orch.root
    assert both.tags[PRIORITY_TAG] == "1", "before a schedule's runs still queued for the root"
    result = _run(orch, both)
    assert [e.asset_key for e in result.get_asset_materialization_events()] == [AssetKey(RETAINED), AssetKey(SNAPSHOTS)]
    assert {e.check_name for e in result.get_asset_check_evaluations()} == {CHAINS, CHAINS_BOUNDED}
    assert {c.chain_length for c in orch.catalog.chain_lengths(orch.root)} == {0}
    assert orch.catalog.expiry_bases(orch.root, retain=RETAIN) == {"agg/0": THRESHOLD, "agg/1": THRESHOLD}
    fourth = tick(orch, third.cursor)
    assert not fourth.run_requests


@pytest.mark.parametrize("status", [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING])
def test_no_second_run_while_the_sensors_run_of_the_root_is_queued(orch: Orch, status: DagsterRunStatus) -> None:
    """A run the sensor requested has not started (the root's slot is busy, or its process is still starting):
    later ticks request nothing for the root and keep what they find; once it started, one run asks for all of
    it."""
    orch.writer.commit(THRESHOLD)
    first = tick(orch, None)
    (req,) = first.run_requests or []
    job = orch.defs.resolve_job_def(req.job_name or "")
    queued = orch.instance.create_run_for_job(
        job,
        run_config=req.run_config,
        status=status,
        tags={**req.tags, PARTITION_NAME_TAG: orch.root},
    )
    orch.writer.commit(THRESHOLD)  # crossings at 2 * THRESHOLD (the snapshot has not run)
    held = tick(orch, first.cursor)
    assert not held.run_requests and held.skip_reason is not None and queued.run_id in str(held.skip_reason)
    assert "no store crossed" not in str(held.skip_reason) and f"agg/0@{2 * THRESHOLD}" in str(held.skip_reason)
    assert SensorCursor.parse(held.cursor).roots[orch.root].requested == {"agg/0": THRESHOLD, "agg/1": THRESHOLD}
    orch.instance.report_run_canceled(queued)  # it left the queue (a start does too)
    later = tick(orch, held.cursor)
    assert [r.run_key for r in later.run_requests or []] == [
        run_key("snapshot", orch.root, [f"agg/0@{2 * THRESHOLD}", f"agg/1@{2 * THRESHOLD}"])
    ]


def test_snapshots_that_land_late_are_requested_ahead_of_the_threshold(orch: Orch) -> None:
    """The root's snapshots landed `lag` commits after the version they were requested at: the next ones are
    requested `snapshot_lead` commits before the threshold, and the run snapshots those stores although their
    chains are below it; as snapshots land on time again the lag falls and so does the lead."""
    orch.writer.commit(THRESHOLD)
    first = tick(orch, None)
    (late,) = first.run_requests or []
    lag = THRESHOLD + 1
    orch.writer.commit(lag)  # the run starts late: the stores committed on
    _run(orch, late)
    snapshot = THRESHOLD + lag
    assert {c.snapshot_version for c in orch.catalog.chain_lengths(orch.root)} == {snapshot}
    second = tick(orch, first.cursor)
    assert SensorCursor.parse(second.cursor).roots[orch.root].snapshot_lag == lag
    lead = snapshot_lead(lag, THRESHOLD)
    assert 0 < lead < THRESHOLD and THRESHOLD - lead + lag <= 2 * THRESHOLD
    for request in second.run_requests or []:  # the moved bases' expiry
        _run(orch, request)

    orch.writer.commit(THRESHOLD - lead)
    third = tick(orch, second.cursor)
    early = snapshot + THRESHOLD - lead
    (ahead,) = third.run_requests or []
    assert ahead.run_config["ops"][SNAPSHOTS]["config"]["stores"] == [f"agg/0@{early}", f"agg/1@{early}"]
    orch.writer.commit(lead)  # the chains pass the threshold before the run starts: not requested again
    waiting = tick(orch, third.cursor)
    assert not waiting.run_requests, "a store is asked for again only a whole threshold later"
    _run(orch, ahead)
    landed = early + lead
    assert {(c.snapshot_version, c.chain_length) for c in orch.catalog.chain_lengths(orch.root)} == {(landed, 0)}
    fourth = tick(orch, waiting.cursor)
    rc = SensorCursor.parse(fourth.cursor).roots[orch.root]
    assert rc.snapshot_lag == (lag + lead) // 2 and rc.requested == {}, "landed sooner: the lag falls halfway"
    assert snapshot_lead(rc.snapshot_lag, THRESHOLD) == 0


@pytest.mark.parametrize(("spread", "schedule"), [(0.5, "threshold"), (0.0, "phase")])
def test_with_a_spread_each_store_is_requested_at_its_own_point(
    tmp_path, db_url: str, spread: float, schedule: str
) -> None:
    """With `snapshot_spread`, the partitions of an operator, committing in lock step, cross at the points
    `statekeeper maintain` draws for them (`MaintenanceSettings.snapshot_due_at`, between half the threshold and the
    threshold at a spread of 0.5), not all at one tick; after each store's snapshot, at the point drawn for its new
    chain. With the phase schedule, at the versions of each store's phase: each partition its own, a threshold
    apart. No store is requested past the threshold."""
    threshold, partitions = 8, 8
    orch = Orch([str(tmp_path / "root")], db_url)
    try:
        orch.writer.close()
        orch.writer = CheckpointWriter(orch.root, partitions=partitions, keys_per_batch=2)
        orch.resources["maintenance"] = MaintenanceConfig(
            snapshot_threshold=threshold,
            snapshot_spread=spread,
            snapshot_schedule=schedule,
            min_versions_to_retain=threshold,
            orphan_grace_seconds=0,
        )
        settings = orch.resources["maintenance"].settings()
        expected: dict[str, list[int]] = {}
        for p in range(partitions):
            points = expected[f"agg/{p}"] = [settings.snapshot_due_at("agg", p, 0)]
            while points[-1] + (step := settings.snapshot_due_at("agg", p, points[-1])) <= 2 * threshold:
                points.append(points[-1] + step)
        assert len({points[0] for points in expected.values()}) > 2, "the points are spread"
        steps = [b - a for v in expected.values() for a, b in zip([0, *v], v, strict=False)]
        if schedule == "phase":
            assert sorted(points[0] for points in expected.values()) == list(range(1, threshold + 1))
            assert all(b - a == threshold for v in expected.values() for a, b in pairwise(v))
        else:
            assert all(threshold // 2 <= step <= threshold for step in steps)
        requested: dict[str, list[int]] = {store: [] for store in expected}
        cursor = None
        for _ in range(2 * threshold):
            version = orch.writer.commit()
            result = tick(orch, cursor)
            cursor = result.cursor
            for request in result.run_requests or []:
                ops = request.run_config.get("ops", {})
                for crossing in ops.get(SNAPSHOTS, {}).get("config", {}).get("stores", []):
                    store, at = crossing.split("@")
                    assert int(at) == version, "requested at the tick its chain reached its point"
                    requested[store].append(int(at))
                _run(orch, request)  # at once: each snapshot lands at the version it was requested at
        assert requested == expected
    finally:
        orch.close()


def test_snapshot_lag_counts_from_the_first_request_of_a_store(orch: Orch) -> None:
    """A store asked for again (its chain grew a whole threshold more before a snapshot landed) keeps the version
    of its first request: the lag is what the chain waited, not what the last request waited."""
    orch.writer.commit(THRESHOLD)
    first = tick(orch, None)
    orch.writer.commit(THRESHOLD)
    again = tick(orch, first.cursor)
    (late,) = again.run_requests or []
    rc = SensorCursor.parse(again.cursor).roots[orch.root]
    assert rc.requested == {"agg/0": 2 * THRESHOLD, "agg/1": 2 * THRESHOLD}
    assert rc.waiting == {"agg/0": THRESHOLD, "agg/1": THRESHOLD}
    orch.writer.commit(1)
    _run(orch, late)
    landed = tick(orch, again.cursor)
    rc = SensorCursor.parse(landed.cursor).roots[orch.root]
    assert rc.snapshot_lag == THRESHOLD + 1 and rc.waiting == {}


def test_a_bad_maintenance_setting_fails_the_tick_naming_it(tmp_path, db_url: str) -> None:
    """The resource's settings are validated once a tick (`MaintenanceConfig.settings`): a schedule Dagster's
    config takes as any string, or a spread beside the phase schedule, fails the tick with the setting's name
    instead of drawing points from it."""
    orch = Orch([str(tmp_path / "root")], db_url)
    try:
        orch.writer.commit(THRESHOLD)
        for bad, named in (
            ({"snapshot_schedule": "daily"}, "snapshot_schedule='daily'"),
            ({"snapshot_schedule": "phase", "snapshot_spread": 0.5}, "snapshot_spread=0.5"),
        ):
            orch.resources["maintenance"] = MaintenanceConfig(snapshot_threshold=THRESHOLD, **bad)
            with pytest.raises(ConfigurationError, match=re.escape(named)):
                tick(orch, None)
        orch.resources["maintenance"] = MaintenanceConfig(snapshot_threshold=THRESHOLD, snapshot_schedule="phase")
        assert tick(orch, None).run_requests, "a good value ticks on"
    finally:
        orch.close()
