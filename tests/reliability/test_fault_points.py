"""The fault seam's names are the product's: every point the product reaches is listed in
`statekeeper.store.faults.POINTS` (so a sweep report names real instants), and every listed point is reached
somewhere (so none is a dead name)."""

from __future__ import annotations

import re
from pathlib import Path

from statekeeper.store import faults

REPO = Path(__file__).resolve().parents[2]
CALL = re.compile(r"""fault_point\(\s*"([a-z0-9_.]+)\"""")


def test_every_point_is_listed_and_reached() -> None:
    used: set[str] = set()
    for package in ("store", "maintenance"):
        for path in (REPO / package).rglob("*.py"):
            used.update(CALL.findall(path.read_text()))
    sweep = (REPO / "tests" / "reliability" / "scenarios.py").read_text()
    used.update(p for p in faults.POINTS if f'"{p}"' in sweep)  # catalog.transaction: from SQLAlchemy
    assert used == set(faults.POINTS)


def test_disarmed_seam_does_nothing_and_arm_returns_the_previous_hook() -> None:
    assert not faults.armed()
    faults.reached("local.write", "x")  # no hook: nothing happens
    seen: list[tuple[str, str]] = []
    assert faults.arm(lambda p, s: seen.append((p, s))) is None
    try:
        faults.reached("local.delete", "a/b")
    finally:
        assert faults.arm(None) is not None
    assert seen == [("local.delete", "a/b")]
