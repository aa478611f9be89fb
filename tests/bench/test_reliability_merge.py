"""`python -m bench reliability` runs the local and the S3 sweep side by side: their results merge into one."""

from __future__ import annotations

from typing import Any

from bench.reliability import merge_sweeps


def _part(kind: str, kills: int, points: dict[str, int], lost: int, seconds: float) -> dict[str, Any]:
    return {
        "kills": {"commit": {kind: kills}},
        "seconds_by_scenario": {"commit": {kind: seconds}},
        "traced": {"commit": {kind: kills + 1}},
        "points": points,
        "not_reached": 1,
        "lost": lost,
        "problems": [f"{kind}: lost"] if lost else [],
        "seconds": seconds,
        "total_kills": kills,
    }


def test_sweeps_of_two_root_kinds_merge_without_losing_a_count() -> None:
    merged = merge_sweeps(
        [
            _part("local", 3, {"local.write": 2, "catalog.transaction": 1}, 0, 10.0),
            _part("s3", 4, {"s3.put": 4}, 1, 25.0),
        ]
    )
    assert merged["kills"] == {"commit": {"local": 3, "s3": 4}}
    assert merged["traced"] == {"commit": {"local": 4, "s3": 5}}
    assert merged["points"] == {"local.write": 2, "catalog.transaction": 1, "s3.put": 4}
    assert (merged["total_kills"], merged["lost"], merged["not_reached"]) == (7, 1, 2)
    assert merged["problems"] == ["s3: lost"]
    assert merged["seconds"] == 25.0  # side by side: the longest, not the sum
