"""docs/reliability.md shows the hostile-content table the matrix checks (tests/reliability/test_hostile_matrix.py
asserts every cell it runs against `testkit.hostile.EXPECTED`; `python -m bench reliability` writes the table from
the outcomes it saw)."""

from __future__ import annotations

from bench.reliability import DOC, hostile_table
from testkit.hostile import BACKENDS, CLASSES, EXPECTED, READERS


def test_every_class_reader_and_root_has_an_expected_outcome() -> None:
    assert sorted(EXPECTED) == sorted(BACKENDS)
    for per in EXPECTED.values():
        assert list(per) == list(CLASSES)
        assert all(list(cells) == READERS for cells in per.values())


def test_docs_reliability_shows_the_hostile_table() -> None:
    assert hostile_table(EXPECTED).markdown() in DOC.read_text()
