"""The `statekeeper` command line, run as a subprocess: commands, --json output and exit codes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import run_cli
from tests.maintenance.helpers import History, all_files, clobber

NO_GRACE = ("--grace", "0", "--load-grace", "0")


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def test_operations_on_every_backend(make_history: Callable[..., History], tmp_path: Path) -> None:
    h = make_history()
    h.batches(6, losing=1)
    home = tmp_path / "home"
    ops = ["--retain", "2", "--threshold", "4", *NO_GRACE, "--work-dir", str(tmp_path / "work"), "--json"]
    assert as_json(run_cli("snapshot", h.root, *ops, home=home))["snapshots"] == 2
    h.batches(1)
    before = all_files(h.root)
    dry = as_json(run_cli("expire", h.root, "--dry-run", *ops, home=home))
    assert all_files(h.root) == before and dry["files"] == 2 * 6 + 5
    assert as_json(run_cli("clean-orphans", h.root, *ops, home=home))["changelogs"] == 2 * 6
    assert as_json(run_cli("verify", h.root, "--rebuild", *ops, home=home))["stores_ok"] == 2
    h.check_loadable(range(1, h.latest + 1))


def test_every_command_end_to_end(make_local_history: Callable[..., History], tmp_path: Path) -> None:
    h = make_local_history()
    h.batches(6, losing=1)
    home = tmp_path / "home"
    ops = ["--retain", "3", "--threshold", "4", *NO_GRACE, "--work-dir", str(tmp_path / "work")]

    inspect = as_json(run_cli("inspect", h.root, "--json", *ops, home=home))
    assert inspect["latest_version"] == 6 and [s["chain"] for s in inspect["stores"]] == [6, 6]

    snap = as_json(run_cli("snapshot", h.root, "--json", *ops, home=home))
    assert snap["ok"] and snap["snapshots"] == 2 and snap["kind"] == "snapshot"
    h.batches(2)

    before = all_files(h.root)
    dry = as_json(run_cli("expire", h.root, "--dry-run", "--json", *ops, home=home))
    assert dry["dry_run"] and dry["files"] > 0 and all_files(h.root) == before
    real = as_json(run_cli("expire", h.root, "--json", *ops, home=home))
    assert (real["files"], real["bytes"]) == (dry["files"], dry["bytes"])

    orphans = as_json(run_cli("clean-orphans", h.root, "--json", *ops, home=home))
    assert orphans["changelogs"] == 2 * 6 and orphans["ok"]

    text = run_cli("verify", h.root, "--rebuild", *ops, home=home).stdout
    assert "verify" in text and "stores_ok=2" in text

    runs = as_json(run_cli("runs", h.root, "--json", home=home))
    assert [r["kind"] for r in runs] == ["verify", "clean-orphans", "expire", "expire", "snapshot"]
    assert [r["dry_run"] for r in runs] == [False, False, False, True, False]

    run_cli("catalog", "sync", h.root, "--full", home=home)
    chains = as_json(run_cli("catalog", "chains", h.root, "--json", home=home))
    assert [(c["snapshot_version"], c["chain_length"]) for c in chains] == [(6, 2), (6, 2)]
    files = as_json(run_cli("catalog", "files", h.root, "--store", "agg/1", "--version", "8", "--json", home=home))
    assert files["snapshot_version"] == 6 and files["missing"] == []
    assert {f["kind"] for f in files["files"]} == {"sst", "manifest", "changelog"}
    retention = as_json(run_cli("catalog", "retention", h.root, "--retain", "1", "--json", home=home))
    assert retention["min_versions_to_retain"] == 1
    version_files = as_json(run_cli("inspect", h.root, "--store", "agg/1", "--version", "8", "--json", *ops, home=home))
    assert [f["kind"] for f in version_files["version_files"]["files"]][-2:] == ["changelog", "changelog"]
    ended = as_json(run_cli("runs", h.root, "--json", home=home))  # and the full sync's
    pruned = as_json(run_cli("catalog", "prune", h.root, "--older-than", "0", "--json", home=home))
    assert pruned["files"] > 0 and pruned["runs"] == len(ended) and pruned["rows"] >= pruned["files"] + pruned["runs"]
    assert as_json(run_cli("runs", h.root, "--json", home=home)) == []
    assert as_json(run_cli("catalog", "chains", h.root, "--json", home=home)) == chains  # only history went
    run_cli("catalog", "rebuild", h.root, home=home)
    assert as_json(run_cli("db", "current", "--json", home=home))["current"] is True


def _in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from statekeeper.maintenance.cli import main

    try:
        code = main(args)
    except SystemExit as e:  # argparse's own usage errors
        code = int(e.code or 0)
    return code, capsys.readouterr().err


def test_exit_codes_and_json_errors(
    make_local_history: Callable[..., History], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = make_local_history()
    h.batches(5)
    home = tmp_path / "home"
    usage = [
        ("bogus",),
        ("expire",),
        ("expire", h.root, "--retain", "0"),
        ("expire", h.root, "--store", "agg"),
        ("expire", h.root, "--store", "../x/0"),
        ("expire", h.root, "--grace", "soon"),
        ("expire", str(tmp_path / "typo")),
        ("expire", str(tmp_path)),  # a parent of the root: not a checkpoint root
        ("snapshot", h.root, "--work-dir", str(Path(h.fm.root_path) / "w")),  # type: ignore[attr-defined]
        ("inspect", h.root, "--version", "3"),
    ]
    for i, args in enumerate(usage):
        full = [*args, "--no-catalog"] if len(args) > 1 else list(args)
        if i < 2:  # a real process for a couple; the same entry point in this process for the rest
            proc = run_cli(*full, home=home, check=None)
            code, err = proc.returncode, proc.stderr
        else:
            code, err = _in_process(full, capsys)
        assert code == 2, (args, err)
        assert "error" in err, args
    proc = run_cli("expire", h.root, "--retain", "0", "--json", "--no-catalog", home=home, check=2)
    doc = as_json(proc)
    assert doc["ok"] is False and "min_versions_to_retain=0" in doc["error"] and doc["exit_code"] == 2
    env = {"STATEKEEPER_MIN_VERSIONS_TO_RETAIN": "zero"}
    assert "STATEKEEPER_MIN_VERSIONS_TO_RETAIN" in run_cli("expire", h.root, home=home, env=env, check=2).stderr

    # A server database (or any explicit --db) is not migrated behind the operator's back.
    proc = run_cli("expire", h.root, "--db", f"sqlite:///{tmp_path / 'new.db'}", home=home, check=2)
    assert "statekeeper db upgrade" in proc.stderr
    run_cli("db", "upgrade", "--db", f"sqlite:///{tmp_path / 'new.db'}", home=home)
    run_cli("expire", h.root, "--db", f"sqlite:///{tmp_path / 'new.db'}", home=home)

    # Someone else's file outside the stores: a warning (exit 0), named on stderr and in the JSON document.
    clobber(h.root, "notes.txt", b"foreign")
    proc = run_cli("clean-orphans", h.root, "--json", home=home)
    assert "notes.txt" in proc.stderr and any("notes.txt" in w for w in as_json(proc)["warnings"])
    assert not as_json(proc)["errors"]
    assert "notes.txt" in all_files(h.root)
    assert any("notes.txt" in w for w in as_json(run_cli("inspect", h.root, "--json", home=home))["warnings"])
    # Errors found (a foreign file inside a store's prefix): exit 1, named on stderr and in the JSON document.
    clobber(h.root, "state/agg/00000/notes.txt", b"foreign")
    proc = run_cli("clean-orphans", h.root, "--json", home=home, check=1)
    assert "notes.txt" in proc.stderr and any("00000/notes.txt" in e for e in as_json(proc)["errors"])
    run_cli("inspect", h.root, home=home, check=1)
    assert "state/agg/00000/notes.txt" in all_files(h.root)
    manifest = (
        next(p for p in all_files(h.root) if p.endswith(".manifest"))
        if any(p.endswith(".manifest") for p in all_files(h.root))
        else None
    )
    assert manifest is None
    run_cli("snapshot", h.root, "--threshold", "2", home=home)
    manifest = next(p for p in all_files(h.root) if p.endswith(".manifest"))
    clobber(h.root, manifest, b"SKSM" + b"\0" * 20)
    proc = run_cli("verify", h.root, home=home, check=1)
    assert manifest in proc.stderr


def test_catalog_queries_need_a_synced_root(make_local_history: Callable[..., History], tmp_path: Path) -> None:
    h = make_local_history()
    h.batches(2)
    home = tmp_path / "home"
    proc = run_cli("catalog", "chains", h.root, home=home, check=1)
    assert "not in the catalog" in proc.stderr and "catalog sync" in proc.stderr
    run_cli("catalog", "sync", h.root, home=home)
    proc = run_cli("catalog", "files", h.root, "--store", "agg/0", "--version", "9", home=home, check=1)
    assert "version 9" in proc.stderr


@pytest.mark.parametrize("command", ["snapshot", "expire", "clean-orphans"])
def test_a_busy_store_fails_clearly(make_local_history: Callable[..., History], tmp_path: Path, command: str) -> None:
    from statekeeper.sql import Catalog

    h = make_local_history()
    h.batches(6, losing=1)
    home = tmp_path / "home"
    run_cli("snapshot", h.root, "--threshold", "4", home=home)
    h.batches(4)
    cat = Catalog.open(f"sqlite:///{home / 'catalog.db'}")
    try:
        with cat.acquire_lease(h.fm.root_uri, ("agg", 1), owner="nightly-job@host-b", ttl=120):
            proc = run_cli(command, h.root, "--retain", "2", "--threshold", "4", *NO_GRACE, home=home, check=1)
    finally:
        cat.close()
    assert "nightly-job@host-b" in proc.stderr and "agg/1" in proc.stderr
