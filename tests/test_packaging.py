"""The lean install: the core carries only the store; each extra is named when it is missing.

The fast checks run in subprocesses of this interpreter (a fresh ``sys.modules``): importing the store
imports none of the extras' packages, and hiding an extra's package gives an error naming the extra.
The slow one builds the wheel, installs it with only the core into a fresh virtualenv (dependencies
from the package index), commits and loads a store there, then adds ``[maintenance]`` and runs
``statekeeper inspect``, and ``statekeeper snapshot`` and ``statekeeper verify --rebuild`` on a root of
typed state written here (through the Spark partition task code, without a JVM): maintenance reads
typed state without PySpark.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXTRA_PACKAGES = ("pyspark", "pandas", "sqlalchemy", "alembic", "tqdm", "dagster", "psycopg")
STORE_MODULES = (
    "statekeeper.store",
    "statekeeper.store.files",
    "statekeeper.store.state_store",
    "statekeeper.store.commit_log",
    "statekeeper.store.snapshot",
    "statekeeper.store.async_upload",
    "statekeeper.store.layout",
)

COMMIT_AND_LOAD = """
import sys
from statekeeper.store import CommitLog, StateStore
root = sys.argv[1]
store = StateStore(root, "counts", partition=0)
store.load(0)
store.column_family("totals").put(b"alice", b"1")
result = store.commit()
CommitLog(store.fm).commit(1, {"counts": [result.checkpoint_id]})
store.close()
again = StateStore(root, "counts", partition=0, config=None)
again.load(1, result.checkpoint_id)
assert again.column_family("totals").get(b"alice") == b"1"
again.close()
print("loaded", sorted(m for m in sys.modules if m.split(".")[0] in %r))
"""


def _python(code: str, *args: str, python: str = sys.executable, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run `code` in `python`; `python -c` puts `cwd` first on sys.path (outside the clone: the installed wheel)."""
    return subprocess.run(
        [python, "-c", textwrap.dedent(code), *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_importing_the_store_imports_no_extra() -> None:
    done = _python(
        f"""
        import importlib, json, sys
        for m in {STORE_MODULES!r}:
            importlib.import_module(m)
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {EXTRA_PACKAGES!r})))
        """
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize(
    ("hidden", "statement", "extra"),
    [
        ("pyspark", "from statekeeper.store.spark import StatefulOperator", "spark"),
        ("sqlalchemy", "import statekeeper.maintenance", "maintenance"),
        ("tqdm", "import statekeeper.maintenance.cli", "maintenance"),
        ("sqlalchemy", "import statekeeper.sql", "maintenance"),
        ("dagster", "import statekeeper.orchestration", "dagster"),
        (
            "psycopg",
            "import statekeeper.sql as s; s.make_engine('postgresql+psycopg://user@127.0.0.1:1/catalog')",
            "postgres",
        ),
    ],
)
def test_a_missing_extra_is_named(hidden: str, statement: str, extra: str) -> None:
    done = _python(
        f"""
        import sys
        sys.modules[{hidden!r}] = None  # as if the package were not installed
        try:
            {statement}
        except ImportError as e:
            print(type(e).__name__, e)
        except Exception as e:
            print(type(e).__name__, e)
        else:
            print("imported")
        """
    )
    assert done.returncode == 0, done.stderr
    assert f"pip install 'statekeeper[{extra}]'" in done.stdout, done.stdout


def _build_wheel(dest: Path) -> Path:
    """Build the wheel from a copy of the sources (the build leaves build/ and *.egg-info behind)."""
    src = dest / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in ("statekeeper", "store", "maintenance", "orchestration", "sql"):
        shutil.copytree(REPO / package, src / package, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(dest / "dist")],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = (dest / "dist").glob("statekeeper-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        top = {name.split("/")[0] for name in zf.namelist()}
    assert top == {"statekeeper", "statekeeper-0.1.0.dist-info"}, f"only statekeeper lands in site-packages: {top}"
    return wheel


def _base_python() -> str:
    """The interpreter the current virtualenv was made from (a venv is made from a real interpreter)."""
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


@pytest.mark.slow
def test_the_wheel_installs_lean_and_each_extra_works(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True, timeout=120)
    python, pip = str(venv / "bin" / "python"), [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    t0 = time.monotonic()
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True, timeout=900)
    core_install_s = time.monotonic() - t0

    installed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], check=True, capture_output=True, text=True
    ).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert {"rocksdict", "zstandard", "pyarrow", "boto3"} <= names
    assert not names & {"pyspark", "pandas", "sqlalchemy", "alembic", "dagster", "psycopg", "tqdm"}
    root = (tmp_path / "root").as_uri()
    done = _python(COMMIT_AND_LOAD % (EXTRA_PACKAGES,), root, python=python, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded []"
    done = _python("from statekeeper.store.spark import read_state", python=python, cwd=tmp_path)
    assert "pip install 'statekeeper[spark]'" in done.stderr

    subprocess.run([*pip, f"{wheel}[maintenance]"], check=True, capture_output=True, timeout=900)
    cli = str(venv / "bin" / "statekeeper")
    done = subprocess.run(
        [cli, "inspect", root, "--json", "--db", f"sqlite:///{tmp_path / 'catalog.db'}"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "counts/0" in done.stdout

    typed = _typed_root(tmp_path / "typed")
    for command in (["snapshot", typed, "--threshold", "1"], ["verify", typed, "--rebuild", "--json"]):
        done = subprocess.run([cli, *command], check=False, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert report["ok"] and report["stores"] == 1 and report["rebuilt"] >= 1, report
    with_maintenance = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], check=True, capture_output=True, text=True
    ).stdout
    assert "pyspark" not in {p["name"].lower() for p in json.loads(with_maintenance)}
    print(f"core install into a fresh venv: {core_install_s:.0f}s")


def _typed_root(directory: Path) -> str:
    """A root whose operator keeps value, list and map state under recorded schemas, with TTLs and timers."""
    from statekeeper.store.spark.testing import TwsTester
    from testkit.processors import TypedAll

    with TwsTester(
        TypedAll(), key="user", output_schema="user string, count long, total long", directory=directory
    ) as t:
        for b in range(3):
            t.run([{"user": f"u{(b + i) % 4}", "value": b * 10 + i} for i in range(6)], processing_time_ms=1000 * b)
        return t.root
