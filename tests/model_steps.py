"""Step counts of the hypothesis state machines, reported at the end of every pytest run.

A model-based test is trusted for how much it explored: each machine mixes in `CountedSteps`, whose
invariant runs after every step (and once after setup), so `STEPS[machine]` counts the steps
actually executed, whatever hypothesis decided to shrink or stop early. The pytest hook in
`tests/conftest.py` prints the counts and, when STATEKEEPER_MODEL_STEPS_FILE names a file, writes
them there as JSON (`python -m bench reliability` reads it).

STATEKEEPER_MODEL_SCALE multiplies the examples of every machine (`scaled`): 1 in the default run,
10 for a long run (`make test-model-long`, >= 100,000 steps).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any, ClassVar

from hypothesis.stateful import invariant

STEPS: Counter[str] = Counter()
STEPS_FILE_ENV = "STATEKEEPER_MODEL_STEPS_FILE"
SCALE_ENV = "STATEKEEPER_MODEL_SCALE"


class CountedSteps:
    """Mix into a `RuleBasedStateMachine` (before it) to count its steps under `model_name`."""

    model_name: ClassVar[str] = ""

    @invariant()
    def count_step(self) -> None:
        STEPS[self.model_name or type(self).__name__] += 1


def scaled(examples: int) -> int:
    """`examples` times STATEKEEPER_MODEL_SCALE (default 1)."""
    return examples * max(1, int(os.environ.get(SCALE_ENV, "1")))


def figures() -> dict[str, dict[str, Any]]:
    """{"steps": {machine: steps}, "fuzzed": {reader: inputs}, "injected": {fault: count}, "soak":
    {duration: figures}}: what this process counted."""
    return {"steps": dict(STEPS), "fuzzed": dict(FUZZED), "injected": dict(INJECTED), "soak": dict(SOAK)}


def merge(counted: dict[str, dict[str, Any]]) -> None:
    """Add another process's `figures()` (a pytest-xdist worker's) to this process's."""
    STEPS.update(counted.get("steps", {}))
    FUZZED.update(counted.get("fuzzed", {}))
    INJECTED.update(counted.get("injected", {}))
    SOAK.update(counted.get("soak", {}))


def write_report() -> None:
    """`figures()` to STATEKEEPER_MODEL_STEPS_FILE, when it names a file."""
    path = os.environ.get(STEPS_FILE_ENV)
    if path:
        with open(path, "w") as f:
            json.dump(figures(), f, indent=1)


def summary() -> str:
    lines = []
    for title, counts in (("model-based steps", STEPS), ("bad inputs fuzzed", FUZZED), ("faults injected", INJECTED)):
        if counts:
            parts = [f"{name} {n:,}" for name, n in sorted(counts.items())]
            lines.append(f"{title}: {sum(counts.values()):,} ({', '.join(parts)})")
    return "\n".join(lines)


FUZZED: Counter[str] = Counter()
"""Bad inputs fed to each persisted-format reader (tests/store/test_fuzz_readers.py)."""
INJECTED: Counter[str] = Counter()
"""Faults injected, by kind (disk: ENOSPC, EIO; catalog: PostgreSQL stopped, SQLite locked, catalog
deleted; S3 in the soak), each followed by the checks."""
SOAK: dict[str, dict[str, int]] = {}
"""Figures of each soak run (tests/reliability/test_soak.py), by duration."""
