"""A FIFO or a symlink to an endless device where a retained changelog (or a commit record) belongs is a
problem maintenance names (DESIGN invariant 12), not a file that looks missing: `verify` and `maintain` report
it as not a regular file, never open it, and keep what the store's retained versions need."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from statekeeper.maintenance.cli import main
from statekeeper.maintenance.inventory import Inventory
from statekeeper.maintenance.settings import MaintenanceSettings
from statekeeper.store.layout import commit_path
from tests.maintenance.helpers import History, clobber, snapshotted_history


def make_special(h: History, path: str, kind: str) -> None:
    local = Path(h.fm.root_path) / path  # type: ignore[attr-defined]
    clobber(h.root, path, None)
    if kind == "fifo":
        os.mkfifo(local)
    else:
        os.symlink("/dev/zero", local)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kind", "where"), [("fifo", "changelog"), ("symlink to /dev/zero", "commit record")])
def test_verify_and_maintain_name_a_special_file_in_place_of_a_retained_one(
    make_local_history: Callable[..., History],
    settings: MaintenanceSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    kind: str,
    where: str,
) -> None:
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    h = snapshotted_history(make_local_history, settings)
    bad = h.stores[0]
    files = Inventory.scan(h.fm).files_of(bad)
    path = max(files.changelogs.values(), key=lambda e: e.version or 0).path if where == "changelog" else None
    path = path or commit_path(h.latest)
    make_special(h, path, kind)
    inv = Inventory.scan(h.fm)
    assert path in {**inv.unreadable, **inv.files_of(bad).unreadable}
    work = ["--work-dir", str(tmp_path / "work")]
    code = main(["verify", h.root, "--json", *work])
    out = capsys.readouterr()
    assert code == 1 and path in out.out and "not a regular file" in out.out, out.out[-2000:]
    code = main(
        ["maintain", h.root, "--cycles", "1", "--every", "0", "--retain", "3", "--grace", "0", *work, "--no-catalog"]
    )
    out = capsys.readouterr()
    assert code in (0, 1) and path in out.out + out.err + caplog.text, (out.out[-2000:], caplog.text[-2000:])
    assert os.path.lexists(Path(h.fm.root_path) / path), "the special entry is left as it is"  # type: ignore[attr-defined]
    others = [s for s in h.stores if s != bad] if where == "changelog" else []
    if others:
        h.check_loadable(h.retained(settings), others)
