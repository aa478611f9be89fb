"""A class-data-sharing archive of the classes a Spark streaming job on statekeeper loads, for the test JVMs.

Each JVM a test starts (Spark sessions, the standalone cluster and its executors, the Connect server, Spark jobs
run as subprocesses) otherwise parses and verifies some 15,000 classes from Spark's jars; mapping them from an
archive instead saves about a third of a Spark session's start-up CPU. The archive is made once, at setup, by
running the example job for a few seconds with `-XX:ArchiveClassesAtExit` (JDK 13+). A JVM whose class path
or JDK does not match the archive ignores it and loads its classes as usual, so the archive only ever changes
how fast a JVM starts.

    python -m testkit.jvm_classes .venv/spark-classes.jsa
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUIET = "-Xlog:cds*=off"
"""Unified logging off for class data sharing: a JVM whose class path differs from the archive (Spark's launcher,
a Connect server with its extra jar) would print a warning on stdout."""

log = logging.getLogger(__name__)


def jvm_options(archive: Path) -> str:
    """The Java options that map `archive` when it exists (an empty string when it does not)."""
    return f"-XX:SharedArchiveFile={archive} {QUIET}" if archive.is_file() else ""


def make_archive(archive: Path, seconds: int = 6) -> None:
    """Runs the example job for `seconds` in this process and waits until its JVM has written `archive`."""
    from pyspark import SparkContext

    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    base = os.environ.get("JDK_JAVA_OPTIONS", "")
    os.environ["JDK_JAVA_OPTIONS"] = f"{base} -XX:ArchiveClassesAtExit={partial} {QUIET}".strip()
    os.environ["RUN_SECONDS"] = str(seconds)
    os.environ.pop("WORK_DIR", None)
    try:
        runpy.run_path(str(ROOT / "examples" / "session_count.py"), run_name="__main__")
    except SystemExit as done:
        if done.code:
            raise
    # the archive is written when the JVM exits, which it does when its stdin closes (PySpark's gateway)
    gateway = SparkContext._gateway
    if gateway is None:
        raise RuntimeError("the example job started no Spark gateway")
    proc = gateway.proc
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=300)
    if not partial.is_file():
        raise RuntimeError(f"the JVM wrote no class archive at {partial}")
    partial.replace(archive)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    parser.add_argument("--seconds", type=int, default=6, help="how long the example job runs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    make_archive(args.archive.resolve(), args.seconds)
    log.info("class archive: %s (%.0f MB)", args.archive, args.archive.stat().st_size / 2**20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
