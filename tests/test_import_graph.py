"""The product's import graph: no circle between modules, and the layers point one way.

Read from the source (no module is imported), so every import counts: at module level, inside
functions and under ``TYPE_CHECKING`` alike. A circle there is one even if Python happens to load
it, since it ties two modules' responsibilities together; a module reached only through a deferred
import is still a dependency. Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``;
those implicit parent imports are not edges (a package re-exporting its modules is not a circle).
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("store", "maintenance", "orchestration", "sql")

ALLOWED_LAYERS = {
    "store": {"store"},
    "sql": {"sql"},
    "maintenance": {"maintenance", "store", "sql"},
    "orchestration": {"orchestration", "maintenance", "store", "sql"},
}
"""Which top-level packages each package may import: orchestration -> maintenance -> (store, sql)."""


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under `packages` of `root`."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path) -> Iterable[str]:
    """Every dotted name `module` imports, candidates first-best: `from a import b` yields a.b then a."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}" if alias.name != "*" else base
            yield base


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the product modules it imports (each import resolved to the longest known module)."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for name in _imported_names(module, path):
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != module:
                targets.add(".".join(parts))
        graph[module] = targets
    return graph


def find_circle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None when the graph has none."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def _product_graph() -> dict[str, set[str]]:
    return import_graph(module_files(REPO, PACKAGES))


def test_no_import_circle_in_the_product() -> None:
    graph = _product_graph()
    assert len(graph) > 50, "the product's modules were not found"
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_layers_point_one_way() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in _product_graph().items()
        for target in targets
        if target.split(".")[0] not in ALLOWED_LAYERS[module.split(".")[0]]
    )
    assert not wrong, "imports against orchestration -> maintenance -> (store, sql):\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("files", "circle"),
    [
        ({"a.py": "from pkg import b\n", "b.py": "from pkg.a import x\n"}, True),
        ({"a.py": "from .b import x\n", "b.py": "def f():\n    from . import a\n"}, True),
        (
            {
                "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\n",
                "b.py": "import pkg.a\n",
            },
            True,
        ),
        ({"__init__.py": "from pkg.a import x\n", "a.py": "from pkg.b import y\n", "b.py": "import os\n"}, False),
    ],
    ids=["from-import", "relative-deferred", "type-checking", "package-reexport"],
)
def test_the_check_finds_circles(tmp_path: Path, files: dict[str, str], circle: bool) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in files.items():
        (package / name).write_text(text)
    found = find_circle(import_graph(module_files(tmp_path, ["pkg"])))
    assert (found is not None) == circle, found
