"""Smoke test of the fleet benchmark: two tiny fleets under both maintainers, tables and a plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.run import run_bench

FLEET = "bench.fleet"


@pytest.mark.slow  # two minutes of fleets; the default run keeps the two-root, lock-step and daemon smokes
def test_fleet_benchmark_runs_both_maintainers(tmp_path: Path) -> None:
    plot = tmp_path / "fleet.png"
    args = ["--stores", "2", "3", "--seconds", "6", "--keys", "500", "--updates", "50", "--plot", str(plot)]
    args += ["--mode", "cli", "maintain", "dagster", "--threshold", "3"]
    out = run_bench(tmp_path, ["beside", *args], module=FLEET, timeout=300)
    for title in ("### Fleet: one maintainer beside", "### Fleet: the maintainer's cost model", "### Fleet over time"):
        assert title in out, out
    for mode in (
        "| cli | 2 |",
        "| cli | 3 |",
        "| maintain | 2 |",
        "| maintain | 3 |",
        "| dagster | 2 |",
        "| dagster | 3 |",
    ):
        assert mode in out, out
    assert "marginal / rocksdict floor" in out and "rocksdict floor = " in out, out  # the same run's baseline
    rows = [line for line in out.splitlines() if line.startswith(("| cli | ", "| maintain | ", "| dagster | "))]
    landings = [row.rstrip(" |").rsplit(" | ", 1)[-1] for row in rows if row.count(" | ") == 12]
    assert len(landings) == 6 and all(" over)" in cell for cell in landings), rows  # read from each catalog
    assert plot.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == ["fleet.png"], "the benchmark left scratch files behind"


def test_fleet_benchmark_spreads_the_stores_over_several_roots(tmp_path: Path) -> None:
    """`--roots N`: N queries, each its own root and commit records; one maintainer keeps them all."""
    args = ["--stores", "4", "--roots", "2", "--mode", "maintain", "dagster", "--seconds", "8", "--keys", "500"]
    args += ["--updates", "50", "--threshold", "3", "--plot", str(tmp_path / "fleet.png")]
    out = run_bench(tmp_path, ["beside", *args], module=FLEET, timeout=300)
    for label in ("maintain, 2 roots", "dagster, 2 roots"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {label} | 4 | 4 |"))
        landed = row.rstrip(" |").rsplit(" | ", 1)[-1]  # "p50 / p90 / max (n of N over)", from the one catalog
        snapshots = int(landed.split(" of ")[1].split()[0])
        assert snapshots >= 4, row  # 8 commits at threshold 3: every store of both roots snapshotted


@pytest.mark.slow
def test_fleet_benchmark_runs_dagster_as_deployed(tmp_path: Path) -> None:
    """`--mode daemon`: `dagster-daemon run` on the root; its sensor's runs keep the chains bounded."""
    args = ["--stores", "2", "--mode", "daemon", "--seconds", "40", "--keys", "500", "--updates", "50"]
    out = run_bench(tmp_path, ["beside", *args, "--plot", str(tmp_path / "fleet.png")], module=FLEET, timeout=600)
    row = next(line for line in out.splitlines() if line.startswith("| daemon | 2 | 2 |"))
    chain_max = int(row.split(" | ")[6].split(" / ")[2])
    assert chain_max <= 20, row  # 40 commits at threshold 10: the daemon's runs snapshotted the stores


def test_the_loop_beside_the_daemon_shows_its_work_in_dagster(tmp_path: Path) -> None:
    """`--maintainer maintain+daemon`: the loop keeps the root with `dagster-daemon` beside it (checkpoint sensor
    off); the daemon's external-maintenance sensor records the loop's runs as materializations in its instance."""
    import json

    args = ["--stores", "8", "--rate", "16", "--seconds", "10", "--every", "2", "--threshold", "6", "--keys", "200"]
    args += ["--updates", "20", "--maintainer", "maintain+daemon"]
    out = run_bench(tmp_path, ["sustain", *args], module=FLEET, timeout=600)
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["errors"] == 0, figures
    made = figures["dagster_materializations"]
    assert made.get("state_snapshots", 0) >= 1 and made.get("retained_versions", 0) >= 1, figures


@pytest.mark.slow
def test_fleet_benchmark_compares_fan_out_over_a_cluster(tmp_path: Path) -> None:
    """`--fanout N`: the stores-snapshotted-per-second row of one process and of a standalone cluster."""
    args = ["--stores", "2", "--mode", "maintain", "--seconds", "4", "--keys", "500", "--updates", "50"]
    args += ["--fanout", "4", "--plot", str(tmp_path / "fleet.png")]
    out = run_bench(tmp_path, ["beside", *args], module=FLEET, timeout=900)
    assert "### Fleet: stores snapshotted per second" in out, out
    assert "| one process | 4 | 4 |" in out and "| Spark standalone, 2 x 1 core | 4 | 4 |" in out


def test_fleet_profile_measures_the_maintainer_per_store_commit(tmp_path: Path) -> None:
    """`python -m bench.fleet lockstep`: one maintain loop, a lock-step writer, CPU per store-commit."""
    import json

    args = ["--stores", "2", "--cycles", "2", "--warmup", "1", "--keys", "300", "--updates", "30", "--catalog"]
    out = run_bench(tmp_path, ["lockstep", *args, "--profile", str(tmp_path / "cycle.prof")], module=FLEET)
    result = json.loads(out.splitlines()[0])
    assert result["store_commits"] == 8 and result["cpu_ms_per_store_commit"] > 0
    assert "create_snapshots" in out and (tmp_path / "cycle.prof").stat().st_size > 0  # the cycles' profile
    out = run_bench(tmp_path, ["lockstep", *args, "--stores", "4", "--roots", "2"], module=FLEET)
    result = json.loads(out.splitlines()[0])
    assert (result["roots"], result["store_commits"], result["errors"]) == (2, 16, 0), "one loop, two roots"


@pytest.mark.slow  # two minutes of fleets; the default run keeps the two-root, lock-step and daemon smokes
def test_ceiling_measures_threads_and_build_processes(tmp_path: Path) -> None:
    """`python -m bench ceiling`: the loop's ceiling with its builds on threads and in build processes."""
    out = run_bench(tmp_path, ["--quick", "ceiling"], timeout=600)
    assert "### Fleet: one maintenance process's ceiling" in out, out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| threads", "| 4 build"))]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        ("threads", "10"),
        ("4 build processes", "10"),
        ("threads", "20"),
        ("4 build processes", "20"),
    ], out
    assert [float(r[3]) > 0 for r in rows] == [False, True, False, True], "the build processes' CPU is counted"


@pytest.mark.slow  # two minutes of fleets; the default run keeps the two-root, lock-step and daemon smokes
def test_sustain_publishes_at_the_rate_asked_and_reports_whether_the_maintainer_kept_up(tmp_path: Path) -> None:
    """`python -m bench sustain`: versions written first, published at a rate beside one maintain loop."""
    out = run_bench(tmp_path, ["--quick", "sustain"], timeout=600)
    assert "### Fleet: the rate one maintenance process keeps up with" in out, out
    lines = out.splitlines()
    header = [c.strip() for c in next(line for line in lines if line.startswith("| stores |")).split("|")[1:-1]]
    rows = [
        dict(zip(header, (c.strip() for c in line.split("|")[1:-1]), strict=True))
        for line in lines
        if line.startswith("| 8 |")
    ]
    # with snapshot_spread and without, kept by Dagster's sensor and runs, then the root in memory on the phase
    # schedule (where /dev/shm has room: it is named if not)
    expected = [
        ("maintain", "disk", "0.5", "", "yes"),
        ("maintain", "disk", "0", "", "no"),
        ("dagster", "disk", "0.5", "", "yes"),
        ("maintain", "memory", "0", "0.2", "yes"),
    ]
    if "Not run: 8 stores in memory" in out:
        expected.pop()
    got = [(r["maintainer"], r["root"], r["snapshot_spread"], r["round (s)"], r["catalog"]) for r in rows]
    assert got == expected, out
    assert [r["snapshot_schedule"] for r in rows] == ["threshold"] * 3 + ["phase"] * (len(rows) - 3)
    for r in rows:
        assert r["snapshot threshold"] == "4", r
        assert 8 <= float(r["store-commits/s in the window"]) <= 24, f"the cycles were given about the rate asked: {r}"
        assert float(r["of which build processes"]) > 0, "the build processes' CPU is counted"
        assert r["kept up"] in ("yes", "no")
    assert list(tmp_path.iterdir()) == [], "the benchmark left scratch files behind"


def test_fleet_caches_times_the_cache_upkeep_of_a_rescan(tmp_path: Path) -> None:
    """`python -m bench.fleet caches`: a row per fleet size, then per store size."""
    out = run_bench(tmp_path, ["caches", "--stores", "3", "20", "--store-files", "2000"], module=FLEET)
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r[0].strip() for r in rows] == ["3", "20", "2,000"], out
    assert [r[1].strip() for r in rows[:2]] == ["135", "900"], out


def test_sustain_publishes_a_version_with_its_commit_record_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sustain bench publishes versions while the loop lists the root: a listing must never find a commit
    record whose changelogs are not there yet (the driver writes the record last)."""
    import os

    from bench.fleet import publisher

    src, dst = tmp_path / "version", tmp_path / "root"
    for rel in ("commits/00000000000000000002.commit", "state/op/0/2.changelog", "state/op/1/2.changelog"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(b"x")
    linked: list[str] = []
    link = os.link

    def recording_link(source: str, target: Path) -> None:
        linked.append(Path(target).relative_to(dst).as_posix())
        link(source, target)

    monkeypatch.setattr(os, "link", recording_link)
    publisher.move_tree(src, dst, link=True)
    assert sorted(linked[:2]) == ["state/op/0/2.changelog", "state/op/1/2.changelog"], linked
    assert linked[2:] == ["commits/00000000000000000002.commit"], linked
