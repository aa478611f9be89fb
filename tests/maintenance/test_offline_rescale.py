"""`statekeeper rescale` and `statekeeper rollback`: the CLI end to end, and kill -9 at every write.

A killed rescale leaves the old layout with every key intact (only uncommitted changelogs, which
orphan cleanup removes); its rerun commits the new layout with every key intact (DESIGN invariant 11).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from statekeeper.maintenance.catalog_sync import sync_catalog
from statekeeper.maintenance.cli import main
from statekeeper.maintenance.inventory import Inventory, clear_caches
from statekeeper.maintenance.offline_rescale import check_writer_idle
from statekeeper.sql import Catalog, LayoutSpan
from statekeeper.store import CommitLog, open_file_manager
from statekeeper.store.key_groups import KeyGroupLayout
from statekeeper.store.layout import heartbeat_dir
from statekeeper.store.rescale import RescaleError
from statekeeper.store.spark.driver import _streams_active
from statekeeper.store.spark.heartbeat import Heartbeat
from tests.cli_support import run_module
from tests.store.test_rescale import GROUPS, OP, clean, read_all, run_batch, stored

ROOT = Path(__file__).resolve().parents[2]


def _history(root: str, partitions: int = 3, batches: int = 3) -> dict[str, dict[bytes, bytes]]:
    model: dict[str, dict[bytes, bytes]] = {"default": {}}
    layout = KeyGroupLayout(partitions, GROUPS)
    for b in range(batches):
        updates: dict[str, dict[bytes, bytes | None]] = {"default": {}}
        for i in range(30):
            k, v = stored(b"k%d" % ((i * 7 + b) % 45)), b"b%d-%d" % (b, i)
            updates["default"][k] = v
            model["default"][k] = v
        run_batch(root, b, layout, updates)
    return clean(model)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main([*args, "--no-catalog", "--json"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip() else {})


def test_rescale_and_rollback_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = (tmp_path / "ckpt").as_uri()
    model = _history(root)
    code, doc = _cli(capsys, "rescale", root, "--operator", OP, "--partitions", "5")
    assert code == 1 and "a query may still be writing" in capsys.readouterr().err + str(doc.get("error"))
    code, doc = _cli(capsys, "rescale", root, "--operator", OP, "--partitions", "5", "--dry-run")
    assert code == 0 and doc["committed"] is False and doc["moved_key_groups"] > 0  # type: ignore[operator]
    assert CommitLog(open_file_manager(root)).latest() == 3
    code, doc = _cli(capsys, "rescale", root, "--operator", OP, "--partitions", "5", "--force")
    assert code == 0 and doc["committed"] is True and doc["new_version"] == 4 and doc["partitions"] == 5
    assert doc["relayed_partitions"] == 5, "never snapshotted: every new partition relayed from changelogs"
    assert read_all(root, 4, KeyGroupLayout(5, GROUPS)) == model
    code, doc = _cli(capsys, "rollback", root, "--operator", OP, "--to-version", "2", "--force")
    assert code == 0 and doc["new_version"] == 5
    record = CommitLog(open_file_manager(root)).get(5)
    assert record is not None and record.batch == 1 and record.layouts[OP] == KeyGroupLayout(3, GROUPS)
    code, _ = _cli(capsys, "rollback", root, "--operator", OP, "--to-version", "9", "--force")
    assert code == 2


def _run_killed(root: str, kill_at: int | None, env: dict[str, str]) -> int:
    args = ["rescale", root, "--operator", OP, "--partitions", "4", "--no-catalog", "--force", "--workers", "2"]
    if kill_at is None:
        proc = run_module("statekeeper.maintenance", *args, env=env)
    else:
        proc = run_module("tests.maintenance.crash_runner", str(kill_at), "--", *args, env=env)
    assert proc.returncode in (0, -signal.SIGKILL), f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode


@pytest.mark.parametrize("kill_at", [1, 3, 5])
def test_kill_9_during_an_offline_rescale(tmp_path: Path, kill_at: int) -> None:
    """Killed at its 1st, 3rd, 5th write (the 5th is the commit record): old layout or new, never a mix."""
    root = (tmp_path / "ckpt").as_uri()
    model = _history(root, partitions=2)
    env = {**os.environ, "STATEKEEPER_WORK_DIR": str(tmp_path / "work"), "PYTHONPATH": str(ROOT)}
    code = _run_killed(root, kill_at, env)
    latest = CommitLog(open_file_manager(root)).latest()
    if code == -signal.SIGKILL and latest == 3:
        assert read_all(root, 3, KeyGroupLayout(2, GROUPS)) == model  # the old layout, intact
        assert _run_killed(root, None, env) == 0
    assert CommitLog(open_file_manager(root)).latest() == 4
    assert read_all(root, 4, KeyGroupLayout(4, GROUPS)) == model


def test_maintenance_after_a_rescale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify, snapshot, expire and clean-orphans understand full-state versions; state stays exact."""
    root = (tmp_path / "ckpt").as_uri()
    model = _history(root, partitions=2, batches=3)
    assert _cli(capsys, "rescale", root, "--operator", OP, "--partitions", "3", "--force")[0] == 0
    layout = KeyGroupLayout(3, GROUPS)
    updates: dict[str, dict[bytes, bytes | None]] = {"default": {stored(b"k1"): b"after", stored(b"k2"): None}}
    run_batch(root, 4, layout, updates)
    model["default"][stored(b"k1")] = b"after"
    model["default"].pop(stored(b"k2"), None)
    for args in (
        ["verify", root],
        ["snapshot", root, "--threshold", "1"],
        ["expire", root, "--retain", "2", "--grace", "0"],
        ["clean-orphans", root, "--retain", "2", "--grace", "0"],
        ["verify", root],
    ):
        code, doc = _cli(capsys, *args)
        assert code == 0, (args, doc)
    assert read_all(root, 5, layout) == model
    assert read_all(root, 4, layout), "the retained rescale version still loads"
    # partition 2 was created by the rescale: nothing of it before the rescale version
    fm = open_file_manager(root)
    left = [i.path for i in fm.list("state/agg/00002/changelogs/")]
    assert left and all(int(p.rsplit("/", 1)[1][:20]) >= 4 for p in left), left


def test_retired_partitions_expire_after_a_rescale_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """8 -> 4: once no retained version needs partitions 4..7, expiry and orphan cleanup remove every file
    of theirs (DESIGN invariant 8); every retained version still loads."""
    root = (tmp_path / "ckpt").as_uri()
    model = _history(root, partitions=8, batches=2)
    assert _cli(capsys, "rescale", root, "--operator", OP, "--partitions", "4", "--force")[0] == 0
    layout = KeyGroupLayout(4, GROUPS)
    states = {}
    for b in range(3, 6):  # versions 4..6
        run_batch(root, b, layout, {"default": {stored(b"k%d" % b): b"v%d" % b}})
        model["default"][stored(b"k%d" % b)] = b"v%d" % b
        states[b + 1] = clean(model)
    fm = open_file_manager(root)
    for args in (
        ["snapshot", root, "--threshold", "1"],
        ["expire", root, "--retain", "2", "--grace", "0"],
        ["clean-orphans", root, "--retain", "2", "--grace", "0"],
        ["expire", root, "--retain", "2", "--grace", "0"],
        ["verify", root, "--retain", "2"],
    ):
        code, doc = _cli(capsys, *args)
        assert code == 0, (args, doc)
    for p in range(4, 8):
        assert not list(fm.list(f"state/agg/{p:05d}/")), f"files of retired partition {p} remain"
    for v in (5, 6):
        assert read_all(root, v, layout) == states[v]


def test_a_heartbeat_whose_spark_session_stopped_goes(tmp_path: Path) -> None:
    """A session stopped under the heartbeat thread (its streams call raises: "RpcEnv has been stopped")
    runs no query: the heartbeat is deleted and the thread ends, instead of failing every poll."""

    class StoppedSession:
        @property
        def streams(self) -> object:
            raise RuntimeError("java.lang.IllegalStateException: RpcEnv has been stopped")

    fm = open_file_manager((tmp_path / "ckpt").as_uri())
    beat = Heartbeat(fm, OP, functools.partial(_streams_active, StoppedSession()), interval=0.2)  # type: ignore[arg-type]
    beat.start()
    deadline = time.time() + 10
    while beat.running and time.time() < deadline:
        time.sleep(0.05)
    assert not beat.running and not any(fm.list(heartbeat_dir(OP)))


def test_a_running_drivers_heartbeat_stops_an_offline_rescale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """While the driver's heartbeat is fresh, rescale refuses and names it; a stopped driver removes it; a
    killed driver's stale one ages out of --idle-seconds and is an orphan for clean-orphans."""
    root = (tmp_path / "ckpt").as_uri()
    _history(root, partitions=2, batches=2)
    fm = open_file_manager(root)
    running = threading.Event()
    running.set()
    beat = Heartbeat(fm, OP, running.is_set, interval=0.2)
    beat.start()
    time.sleep(0.5)
    beats = [i.path for i in fm.list(heartbeat_dir(OP))]
    assert len(beats) == 1, "each beat replaces the one before it"
    code, doc = _cli(capsys, "rescale", root, "--operator", OP, "--partitions", "3", "--idle-seconds", "30")
    err = capsys.readouterr().err + str(doc.get("error"))
    assert code == 1 and "heartbeat" in err and "spark/agg/heartbeat/" in err and "s old" in err, err
    running.clear()  # the query stopped: the heartbeat goes within a poll
    deadline = time.time() + 10
    while (beat.running or any(fm.list(heartbeat_dir(OP)))) and time.time() < deadline:
        time.sleep(0.1)  # the thread deletes its file, then returns: wait for both
    assert not any(fm.list(heartbeat_dir(OP)))
    assert not beat.running

    killed = Heartbeat(fm, OP, running.is_set)
    killed.beat()  # a driver killed right after a beat leaves it behind
    stale = next(iter(fm.list(heartbeat_dir(OP)))).path
    with pytest.raises(RescaleError, match=r"heartbeat .*/spark/agg/heartbeat/"):
        check_writer_idle(fm, OP, 60)
    check_writer_idle(fm, OP, 60, now=time.time() + 120)  # two minutes later the writer is surely gone
    local = Path(tmp_path / "ckpt" / stale)
    old = time.time() - 600
    os.utime(local, (old, old))
    clear_caches()
    assert Inventory.scan(fm).heartbeats and not Inventory.scan(fm).foreign
    code, doc = _cli(capsys, "clean-orphans", root, "--grace", "0")
    assert code == 0 and doc["heartbeats"] == 1 and not local.exists()


def test_layouts_in_the_catalog_and_in_inspect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], catalog: Catalog
) -> None:
    """Every layout with its versions: 2 partitions (1..2), rescaled to 3 (3..4), rolled back to 2 (5)."""
    root = (tmp_path / "ckpt").as_uri()
    _history(root, partitions=2, batches=2)
    assert _cli(capsys, "rescale", root, "--operator", OP, "--partitions", "3", "--force")[0] == 0
    run_batch(root, 3, KeyGroupLayout(3, GROUPS), {"default": {stored(b"x"): b"1"}})
    assert _cli(capsys, "rollback", root, "--operator", OP, "--to-version", "2", "--force")[0] == 0
    expected = [
        LayoutSpan(OP, 1, 2, 2, GROUPS, None),
        LayoutSpan(OP, 3, 4, 3, GROUPS, "rescale"),
        LayoutSpan(OP, 5, 5, 2, GROUPS, "rollback"),
    ]
    code, doc = _cli(capsys, "inspect", root)
    assert code == 0 and doc["layouts"] == [s.to_json() for s in expected]
    fm = open_file_manager(root)
    assert not sync_catalog(catalog, fm).errors
    assert catalog.layouts(fm.root_uri) == expected
    assert catalog.layouts(fm.root_uri, operator="other") == []
