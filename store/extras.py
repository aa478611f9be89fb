"""Optional dependencies: a missing one is reported with the `pip install` line that brings it.

The core install (``pip install statekeeper``) carries only what a job's executors need for the store
(rocksdict, zstandard, pyarrow, boto3). The Spark integration, maintenance, Dagster and PostgreSQL
support are extras; each package that needs one calls :func:`require` before importing it, so a
missing extra fails with :class:`MissingExtraError` naming the extra instead of a bare ImportError.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from statekeeper.store.errors import StatekeeperError

DISTRIBUTION = "statekeeper"


class MissingExtraError(StatekeeperError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def install_hint(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def require(modules: Iterable[str], extra: str, feature: str) -> None:
    """Raise MissingExtraError naming `extra` and what needs it unless each of `modules` is installed.

    Only finds the modules (no import), so the check costs nothing when they are there.
    """
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtraError(
            f"{feature} needs the Python package(s) {missing}, which are not installed: {install_hint(extra)}"
        )


__all__ = ["DISTRIBUTION", "MissingExtraError", "install_hint", "require"]
