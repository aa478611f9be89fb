"""How the `statekeeper` command line answers: exit codes, text tables for people, one JSON document for tools.

Every command prints through :func:`emit` (``--json``: one document on stdout; otherwise text built only
when needed), maintenance reports through :func:`report_out`, and failures through :func:`print_failure`,
so the output contract in the command line's help holds for every command in one place.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statekeeper.maintenance.reports import Report

log = logging.getLogger("statekeeper")

EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_USAGE = 2
MAX_ROWS = 40
"""Rows printed per table without --all."""


class UsageError(Exception):
    """Bad arguments or configuration: exit code 2."""


def row_limit(args: argparse.Namespace) -> int | None:
    """Rows a table shows: :data:`MAX_ROWS`, or every row with ``--all``."""
    return None if getattr(args, "all", False) else MAX_ROWS


def emit(args: argparse.Namespace, document: Any, text: Callable[[], str], *, line: bool = False) -> None:
    """Print `document` as JSON with ``--json`` (`line`: on one line, a JSON Lines record of a stream such as the
    maintain loop's cycles), else the text `text` builds."""
    if args.json:
        json.dump(document, sys.stdout, indent=None if line else 2, default=str, sort_keys=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text() + "\n")


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, *, limit: int | None = MAX_ROWS) -> str:
    """`rows` as aligned text columns (`columns`, else the first row's keys), at most `limit` of them."""
    if not rows:
        return "(none)"
    cols = list(columns or rows[0].keys())
    shown = rows if limit is None else rows[:limit]

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)

    cells = [[cell(r.get(c)) for c in cols] for r in shown]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if len(rows) > len(shown):
        lines.append(f"... and {len(rows) - len(shown)} more (--all or --json shows every row)")
    return "\n".join(lines)


def listed(title: str, items: Sequence[Any], limit: int | None) -> list[str]:
    """`title` and one indented line per item (at most `limit`), or nothing when there are none."""
    return [title, *(f"  {item}" for item in items[:limit])] if items else []


def report_out(args: argparse.Namespace, report: Report, columns: Sequence[str] | None = None) -> int:
    """Print a maintenance report (summary, rows, counts; its errors and warnings on stderr); its exit code."""
    limit = row_limit(args)

    def text() -> str:
        parts = [report.summary()]
        rows = report.rows()
        if rows:
            parts.append(table(rows, columns, limit=limit))
        parts.append(", ".join(f"{k}={v}" for k, v in report.metadata().items() if k not in ("seconds",)))
        return "\n".join(parts)

    emit(args, report.to_json(), text)
    log_problems(report, limit=limit if not args.json else 10)
    return EXIT_OK if report.ok else EXIT_ERRORS


def log_problems(report: Report, *, warnings: bool = True, limit: int | None = 10) -> None:
    """The errors (and warnings) of `report` on stderr, once each: the text on stdout counts them, ``--json``
    lists them all. At most `limit` of each, then how many more there are."""
    named: list[tuple[int, list[str]]] = [(logging.ERROR, report.errors)]
    for level, items in [*named, *([(logging.WARNING, report.warnings)] if warnings else [])]:
        for item in items[:limit]:
            log.log(level, "%s", item)
        if limit is not None and len(items) > limit:
            log.log(level, "... and %d more (--all or --json names every one)", len(items) - limit)


def print_failure(args: argparse.Namespace, e: BaseException, code: int, message: str | None = None) -> int:
    """Name the error on stderr (and as a JSON document with ``--json``), as `message` if given; returns `code`."""
    text = str(e) if message is None else message
    command = " ".join(
        str(getattr(args, a)) for a in ("command", "catalog_command", "db_command") if getattr(args, a, None)
    )
    sys.stderr.write(f"statekeeper {command}: error: {text}\n")
    if getattr(args, "json", False):
        json.dump({"ok": False, "error": text, "error_type": type(e).__name__, "exit_code": code}, sys.stdout)
        sys.stdout.write("\n")
    return code


__all__ = [
    "EXIT_ERRORS",
    "EXIT_OK",
    "EXIT_USAGE",
    "MAX_ROWS",
    "UsageError",
    "emit",
    "listed",
    "log_problems",
    "print_failure",
    "report_out",
    "row_limit",
    "table",
]
