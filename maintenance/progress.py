"""tqdm progress bars on stderr for long maintenance runs (no-ops when disabled)."""

from __future__ import annotations

import importlib
import sys
from typing import Any


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def bar(enabled: bool, desc: str, total: int | None = None, unit: str = "file") -> Any:
    """A tqdm bar on stderr, or an object with the same (used) methods that does nothing."""
    if not enabled:
        return _NoBar()
    tqdm = importlib.import_module("tqdm").tqdm  # untyped library: keep it out of the type checker's way
    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, file=sys.stderr)


__all__ = ["bar"]
