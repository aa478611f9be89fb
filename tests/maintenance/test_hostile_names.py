"""Hostile checkpoint content against maintenance (DESIGN invariant 12): a manifest naming paths out of its
directory, a FIFO or an endless device named like a changelog or manifest. Every command (`inspect`, `verify`,
`verify --rebuild`, `snapshot`, `expire`, `clean-orphans`, `catalog sync`, `maintain`) finishes quickly, writes
nothing outside the root and its work directory, leaves the canaries alone, keeps what retained versions need,
and names the file; the other store is maintained as usual.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from statekeeper.maintenance.cli import main
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.store.files import open_file_manager
from statekeeper.store.snapshot import read_manifest
from testkit.hostile import tree_contents
from tests.maintenance.helpers import History, clobber, snapshotted_history

COMMANDS = [
    ["inspect"],
    ["verify"],
    ["verify", "--rebuild"],
    ["snapshot", "--threshold", "1"],
    ["expire", "--retain", "3"],
    ["clean-orphans", "--grace", "0"],
    ["catalog", "sync", "--full"],
]


def plant(h: History, kind: str, outside: Path) -> str:
    """Make one file of the first store hostile; returns its path under the root."""
    bad = h.stores[0]
    files = Inventory.scan(h.fm).files_of(bad)
    (key, entry) = max(files.manifests.items())
    if kind == "manifest names paths":
        m = read_manifest(h.fm, bad, *key)
        first = replace(m.sst_files[0], local_name=f"{outside}/evil.sst")
        hostile = replace(m, sst_files=(first, *m.sst_files[1:]), db_files={**m.db_files, "../../../evil": b"x"})
        clobber(h.root, entry.path, hostile.to_bytes())
        return entry.path
    local = Path(h.fm.root_path) / entry.path  # type: ignore[attr-defined]
    clobber(h.root, entry.path, None)
    if kind == "fifo manifest":
        os.mkfifo(local)
    else:
        os.symlink("/dev/zero", local)
    return entry.path


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["manifest names paths", "fifo manifest", "manifest links /dev/zero"])
def test_every_command_refuses_hostile_content_and_writes_nothing_outside(
    make_local_history: Callable[..., History],
    settings: MaintenanceSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    h = snapshotted_history(make_local_history, settings)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("precious")
    path = plant(h, kind, outside)
    root_dir = Path(h.fm.root_path)  # type: ignore[attr-defined]
    work = tmp_path / "work"
    before = tree_contents(tmp_path, (root_dir, work, tmp_path / "home"))
    for cmd in COMMANDS:
        args = [*cmd, h.root, "--json", *(["--work-dir", str(work)] if cmd[0] != "catalog" else [])]
        code = main(args)
        out = capsys.readouterr()
        assert code in (0, 1, 2), (cmd, code, out.err[-2000:])
        if kind == "manifest names paths" and cmd[0] == "verify":
            assert path in out.out + out.err, (cmd, out.out[-2000:], out.err[-2000:])
        assert tree_contents(tmp_path, (root_dir, work, tmp_path / "home")) == before, f"{cmd}: a file changed outside"
        assert (outside / "canary.txt").read_text() == "precious"
    assert not (outside / "evil.sst").exists()
    h.check_loadable(h.retained(settings), [h.stores[1]])  # the other store: every retained version loads
    bad_files = {i.path for i in open_file_manager(h.root).list(h.stores[0].prefix + "/")}
    assert any(".changelog" in p for p in bad_files), "the hostile store's changelogs are kept"


@pytest.mark.timeout(300)
def test_maintain_goes_on_with_the_other_store_and_names_the_file(
    make_local_history: Callable[..., History],
    settings: MaintenanceSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    h = snapshotted_history(make_local_history, settings)
    outside = tmp_path / "outside"
    outside.mkdir()
    path = plant(h, "manifest names paths", outside)
    h.batches(4)
    good = h.stores[1]
    snapshots_before = max(Inventory.scan(h.fm).files_of(good).manifests)[0]
    code = main(
        [
            "maintain",
            h.root,
            "--cycles",
            "1",
            "--every",
            "0",
            "--threshold",
            "2",
            "--retain",
            "3",
            "--grace",
            "0",
            "--work-dir",
            str(tmp_path / "work"),
            "--no-catalog",
        ]
    )
    out = capsys.readouterr()
    assert code in (0, 1), out.err[-2000:]
    assert "1 error(s)" in out.out and path in caplog.text, (out.out[-2000:], caplog.text[-2000:])
    assert max(Inventory.scan(h.fm).files_of(good).manifests)[0] > snapshots_before, "the other store was snapshotted"
    h.check_loadable(h.retained(settings), [good])
    assert list(outside.iterdir()) == []
