"""`snapshot_spread` and the phase schedule: the partitions of an operator, committing in lock step, do not all
become due at once."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.maintenance.loop import CycleResult, maintain
from statekeeper.maintenance.settings import MaintenanceSettings, SnapshotSchedule
from statekeeper.maintenance.snapshot_builds import create_snapshots
from statekeeper.store.errors import ConfigurationError
from tests.cli_support import run_cli
from tests.maintenance.helpers import History


def test_each_store_draws_its_point_between_the_spread_and_the_threshold() -> None:
    settings = MaintenanceSettings(snapshot_threshold=20, snapshot_spread=0.5)
    points = [settings.snapshot_due_at("agg", p, 40) for p in range(1000)]
    again = MaintenanceSettings(snapshot_threshold=20, snapshot_spread=0.5)
    assert points == [again.snapshot_due_at("agg", p, 40) for p in range(1000)], "the same in every process"
    later = [settings.snapshot_due_at("agg", p, 60) for p in range(1000)]
    assert sum(a != b for a, b in zip(points, later, strict=True)) > 500, "a new point for each snapshot"
    assert set(points) == set(range(11, 21)), "between the threshold less half of it and the threshold"
    counts = Counter(points)
    assert max(counts.values()) < 2 * min(counts.values()), f"spread evenly: {sorted(counts.items())}"
    assert {MaintenanceSettings(snapshot_threshold=20).snapshot_due_at("agg", p, 0) for p in range(100)} == {20}
    assert MaintenanceSettings(snapshot_threshold=1, snapshot_spread=0.9).snapshot_due_at("agg", 3, 0) == 1
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ConfigurationError, match="snapshot_spread"):
            MaintenanceSettings(snapshot_spread=bad)
    assert MaintenanceSettings.from_env({"STATEKEEPER_SNAPSHOT_SPREAD": "0.25"}).snapshot_spread == 0.25


def test_on_the_phase_schedule_the_partitions_of_an_operator_take_the_phases_in_turn(tmp_path: Path) -> None:
    settings = MaintenanceSettings(snapshot_threshold=20, snapshot_schedule=SnapshotSchedule.PHASE)
    assert settings.snapshot_schedule is SnapshotSchedule.PHASE and settings.to_json()["snapshot_schedule"] == "phase"
    firsts = [settings.snapshot_due_at("agg", p, 0) for p in range(1000)]
    assert Counter(firsts) == dict.fromkeys(range(1, 21), 50), "as many stores due at each version"
    assert firsts != [settings.snapshot_due_at("other", p, 0) for p in range(1000)], "each operator its own offset"
    assert {settings.snapshot_due_at("agg", p, f) for p, f in enumerate(firsts)} == {20}, "on its phase: a threshold"
    assert MaintenanceSettings.from_env({"STATEKEEPER_SNAPSHOT_SCHEDULE": "phase"}) == settings.with_(
        snapshot_threshold=10
    )
    with pytest.raises(ConfigurationError, match=r"STATEKEEPER_SNAPSHOT_SCHEDULE='daily'.*threshold, phase"):
        MaintenanceSettings.from_env({"STATEKEEPER_SNAPSHOT_SCHEDULE": "daily"})
    with pytest.raises(ConfigurationError, match=r"snapshot_spread=0\.5: applies to the threshold schedule"):
        settings.with_(snapshot_spread=0.5)
    bad = run_cli("snapshot", str(tmp_path), "--snapshot-schedule", "daily", home=tmp_path, check=None)
    assert bad.returncode != 0 and "--snapshot-schedule" in bad.stderr and "'phase'" in bad.stderr


@given(threshold=st.integers(1, 64), partition=st.integers(0, 10_000), since=st.integers(0, 10**9))
def test_on_the_phase_schedule_a_store_is_due_at_its_next_phase_version(
    threshold: int, partition: int, since: int
) -> None:
    """Wherever its chain starts (built on its phase, late or in a lumped round), a store is due at the first
    version of its phase after it: within the threshold, so no chain outgrows it for the schedule."""
    settings = MaintenanceSettings(snapshot_threshold=threshold, snapshot_schedule=SnapshotSchedule.PHASE)
    due = settings.snapshot_due_at("agg", partition, since)
    phase = settings.snapshot_due_at("agg", partition, 0) % threshold
    assert 1 <= due <= threshold
    assert [d for d in range(1, due + 1) if (since + d) % threshold == phase] == [due]


def test_a_store_is_snapshotted_at_its_point(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    settings = settings.with_(snapshot_threshold=8, snapshot_spread=0.5)
    h = make_history(operators={"agg": 8})
    due_at = {s: settings.snapshot_due_at(s.operator, s.partition, 0) for s in h.stores}
    assert len(set(due_at.values())) > 1
    for chain in range(1, 9):
        h.batches(1)
        report = create_snapshots(h.fm, settings)
        built = {row["store"] for row in report.items if row.get("action") == "snapshot"}
        assert built == {str(s) for s, at in due_at.items() if at == chain}, f"chain {chain}"
    h.check_loadable(h.retained(settings))


def test_a_lock_step_fleet_spreads_its_rounds_over_the_cycles(
    make_local_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """One batch of every store per cycle: without a spread every store is built in the same cycles; with one,
    no cycle builds more than about half of them, and every chain stays within the threshold."""

    def per_cycle(spread: float) -> list[int]:
        h = make_local_history(operators={"agg": 16}, keys=8)
        h.batches(1)
        built: list[int] = []

        def between(result: CycleResult) -> None:
            built.append(sum(getattr(r, "snapshots", 0) for r in result.reports))
            h.batches(1)

        s = settings.with_(snapshot_threshold=8, snapshot_spread=spread)
        results = maintain(h.fm, s, every=0, cycles=24, on_cycle=between)
        assert all(r.ok for r in results)
        assert create_snapshots(h.fm, s, dry_run=True).max_chain_length <= 8
        h.check_loadable(h.retained(s))
        return built

    lock_step, spread = per_cycle(0.0), per_cycle(0.5)
    assert max(lock_step) == 16, lock_step
    assert max(spread) <= 16 // 2, spread


def test_after_a_lumped_round_the_phase_schedule_builds_a_steady_share_a_cycle(
    make_local_history: Callable[..., History], settings: MaintenanceSettings, tmp_path: Path
) -> None:
    """A round built every store at once (the first maintenance of a checkpoint with long chains, or a fleet's
    first): with the spread, the next rounds lump within its range; on the phase schedule every cycle builds the
    same share, a threshold's worth of stores a version, and fewer in all (one snapshot a threshold a store)."""

    def per_cycle(**schedule: object) -> list[int]:
        h = make_local_history(operators={"agg": 16}, keys=8)
        h.batches(10)
        s = settings.with_(snapshot_threshold=8, **schedule)
        assert create_snapshots(h.fm, s.with_(snapshot_threshold=1)).snapshots == 16, "the lumped round"
        h.batches(1)
        if schedule.get("snapshot_schedule") == "phase":  # the command line's flag draws the same phases
            flags = ["--threshold", "8", "--snapshot-schedule", "phase", "--dry-run", "--no-catalog", "--json"]
            rows = json.loads(run_cli("snapshot", h.root, *flags, home=tmp_path).stdout)["rows"]
            assert {r["store"] for r in rows} == {
                str(x) for x in h.stores if s.snapshot_due_at(x.operator, x.partition, 10) == 1
            }
        built: list[int] = []

        def between(result: CycleResult) -> None:
            built.append(sum(getattr(r, "snapshots", 0) for r in result.reports))
            h.batches(1)

        results = maintain(h.fm, s, every=0, cycles=24, on_cycle=between)
        assert all(r.ok for r in results)
        assert create_snapshots(h.fm, s, dry_run=True).max_chain_length <= 8
        h.check_loadable(h.retained(s))
        return built

    phase, spread = per_cycle(snapshot_schedule=SnapshotSchedule.PHASE), per_cycle(snapshot_spread=0.5)
    assert phase == [2] * 24, phase
    assert max(spread) >= 4 and sum(spread) > sum(phase), spread


def test_a_cycle_builds_the_longest_chains_first(
    make_history: Callable[..., History], settings: MaintenanceSettings
) -> None:
    """Its last builds land a round's length later: the stores that wait for them are those with the shortest
    chains."""
    settings = settings.with_(snapshot_threshold=3, parallelism=1)
    h = make_history(operators={"agg": 3})
    a0, a1, a2 = h.stores
    h.batches(4)
    create_snapshots(h.fm, settings, stores=[a0, a1])
    h.batches(3)
    create_snapshots(h.fm, settings, stores=[a1])
    h.batches(3)
    report = create_snapshots(h.fm, settings)
    rows = [row for row in report.items if row.get("action") == "snapshot"]
    assert [(row["store"], row["chain_length"]) for row in rows] == [(str(a2), 10), (str(a0), 6), (str(a1), 3)]
    assert [row["written_at"] for row in rows] == sorted(row["written_at"] for row in rows), "built in that order"


def test_past_its_time_a_round_leaves_the_stores_due_early_for_the_next(
    make_history: Callable[..., History], settings: MaintenanceSettings, tmp_path: Path
) -> None:
    """`snapshot_round_seconds`: once a round ran that long, a store under the threshold, due early by the
    spread alone, is not started; one at the threshold always is; the next run builds the ones left."""
    settings = settings.with_(snapshot_threshold=8, snapshot_spread=0.5, parallelism=1)
    h = make_history(operators={"agg": 8})
    late, *others = h.stores
    h.batches(2)
    create_snapshots(h.fm, settings.with_(snapshot_threshold=1), stores=others)  # their chains restart at 2
    h.batches(6)  # `late`: a chain of 8, the others 6
    early = {str(s) for s in others if settings.snapshot_due_at(s.operator, s.partition, 2) <= 6}
    assert early, "some store is due early at a chain of 6"

    # through the command line (the flag and the setting): the round's time is up once `late` is started
    flags = ["--threshold", "8", "--snapshot-spread", "0.5", "--parallelism", "1", "--round-seconds", "1e-9"]
    report = json.loads(run_cli("snapshot", h.root, *flags, "--no-catalog", "--json", home=tmp_path).stdout)
    actions = {row["store"]: (row["action"], row.get("reason")) for row in report["rows"]}
    assert actions == {str(late): ("snapshot", None), **dict.fromkeys(early, ("skipped", "deferred"))}
    assert create_snapshots(h.fm, settings, dry_run=True).max_chain_length == 6, "the deferred ones wait"

    results = maintain(h.fm, settings.with_(snapshot_round_seconds=60), every=0, cycles=1)
    built = {row["store"] for r in results[0].reports for row in getattr(r, "items", []) if row["action"] == "snapshot"}
    assert built == early, "the next round builds them, within its time"
    h.check_loadable(h.retained(settings))
    with pytest.raises(ConfigurationError, match="snapshot_round_seconds"):
        settings.with_(snapshot_round_seconds=-1)
