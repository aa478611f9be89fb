"""What the `statekeeper` command line checks before any work, so a mistake exits 2 naming itself.

Each check is a cheap look (the environment, a root's first listing entries, its newest commit record), made
once at the start of a command: a bad ``STATEKEEPER_*`` variable, a parent folder named as the root, a store or
operator that is not there. Without them the mistake surfaced later, as per-store errors, a row of zeros or
hundreds of "foreign file" warnings, or not at all.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable
from itertools import islice
from typing import TYPE_CHECKING

from statekeeper.maintenance.cli_output import UsageError
from statekeeper.store.errors import ConfigurationError
from statekeeper.store.layout import COMMITS_DIR, StoreId, parse_commit_name

if TYPE_CHECKING:
    from statekeeper.store.files.base import CheckpointFileManager

ROOT_COMMANDS = frozenset(
    {"inspect", "verify", "snapshot", "expire", "clean-orphans", "maintain", "rescale", "rollback"}
)
"""Commands that work on the files under a root (``catalog sync`` and ``rebuild`` are checked too)."""
NESTED_LISTING_LIMIT = 5000
"""Files looked at under a root without commit records, for checkpoint roots below it."""


def check_environment(args: argparse.Namespace) -> None:
    """Every ``STATEKEEPER_*`` setting the command may read, checked now: a bad one is a `ConfigurationError`
    naming the variable before anything was read or changed (not a per-store error in the middle of a run)."""
    from statekeeper.maintenance.cli_commands import settings_of
    from statekeeper.store.rocks import MEMORY_ENV, MemoryLimits

    settings_of(args)
    try:
        MemoryLimits.from_env()
    except ConfigurationError as e:
        message = str(e)
        raise ConfigurationError(message if MEMORY_ENV in message else f"{MEMORY_ENV}: {message}") from None
    if any(root.lower().startswith("s3://") for root in roots_of(args)):
        from statekeeper.store.files.s3.options import S3Options

        S3Options.resolve({})


def roots_of(args: argparse.Namespace) -> list[str]:
    """The checkpoint roots named on the command line."""
    roots = getattr(args, "roots", None) or []
    root = getattr(args, "root", None)
    return [*roots, *([root] if isinstance(root, str) else [])]


def check_roots(args: argparse.Namespace) -> None:
    """Refuse a folder above a checkpoint root, naming the root(s) found below it."""
    if args.command not in ROOT_COMMANDS and getattr(args, "catalog_command", None) not in ("sync", "rebuild"):
        return
    from statekeeper.maintenance.cli_commands import file_manager_of

    for root in roots_of(args):
        fm = file_manager_of(args, root)
        below = nested_roots(fm)
        if below:
            shown = ", ".join(below[:5]) + (f" and {len(below) - 5} more" if len(below) > 5 else "")
            raise UsageError(
                f"{fm.root_uri} is not a checkpoint root: it has no {COMMITS_DIR}/ of its own, but checkpoint "
                f"root(s) below it: {shown}; pass the root of one query"
            )


def nested_roots(fm: CheckpointFileManager, limit: int = NESTED_LISTING_LIMIT) -> list[str]:
    """The checkpoint roots below `fm`'s root when it has no commit records itself (a parent folder named by
    mistake): the folders holding ``commits/<version>.commit`` among its first `limit` files. A root with
    commit records costs one look at its ``commits/``."""
    if not _exists(fm) or next(iter(fm.list(f"{COMMITS_DIR}/")), None) is not None:
        return []
    marker = f"/{COMMITS_DIR}/"
    found: dict[str, None] = {}
    for info in islice(fm.list(""), limit):
        head, sep, name = info.path.rpartition(marker)
        if sep and head and "/" not in name and parse_commit_name(name) is not None:
            found.setdefault(f"{fm.root_uri}/{head}", None)
    return list(found)


def _exists(fm: CheckpointFileManager) -> bool:
    """False for a local root that is not there (the operations name that themselves)."""
    path = getattr(fm, "root_path", None)
    return path is None or os.path.isdir(str(path))


def check_stores(args: argparse.Namespace) -> None:
    """Refuse a ``--store`` the root has no file of and its newest version does not name (a typo: without this
    check a command reports a row of zeros for it). `maintain` is not checked: its stores may appear later."""
    stores: list[StoreId] = list(getattr(args, "stores", None) or [])
    if not stores or args.command == "maintain" or not isinstance(getattr(args, "root", None), str):
        return
    from statekeeper.maintenance.cli_commands import file_manager_of

    fm = file_manager_of(args)
    unknown = [s for s in stores if next(iter(fm.list(f"{s.prefix}/")), None) is None]
    if not unknown:
        return
    operators = latest_operators(fm)
    missing = [s for s in unknown if s.partition >= operators.get(s.operator, 0)]
    if missing:
        raise UsageError(
            f"no store {', '.join(map(str, missing))} in {fm.root_uri} (no files, and not in its newest commit "
            f"record); its stores: {_describe(operators)}"
        )


def check_operator(args: argparse.Namespace) -> None:
    """Refuse ``--operator`` of `rescale` / `rollback` when the root's newest version has no such operator
    (else the command said a version of it was not committed)."""
    operator = getattr(args, "operator", None)
    if args.command not in ("rescale", "rollback") or not isinstance(operator, str):
        return
    from statekeeper.maintenance.cli_commands import file_manager_of

    fm = file_manager_of(args)
    operators = latest_operators(fm)
    if operators and operator not in operators:
        raise UsageError(f"no operator {operator!r} in {fm.root_uri}; its operators: {', '.join(sorted(operators))}")


def latest_operators(fm: CheckpointFileManager) -> dict[str, int]:
    """Operator -> partition count in the root's newest commit record ({} when nothing is committed)."""
    from statekeeper.store.commit_log import CommitLog

    log = CommitLog(fm)
    latest = log.latest()
    record = log.get(latest) if latest else None
    return {op: len(ids) for op, ids in record.checkpoint_ids.items()} if record else {}


def _describe(operators: dict[str, int]) -> str:
    if not operators:
        return "none committed"
    return ", ".join(f"{op}/0-{n - 1}" if n > 1 else f"{op}/0" for op, n in sorted(operators.items()))


_PASS = re.compile(r"\bpass ([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b")


def in_flag_terms(message: str, flags: dict[str, str]) -> str:
    """`message` with "pass <parameter>" (the Python API's words) naming the command's flag instead."""
    return _PASS.sub(lambda m: f"pass {flags[m.group(1)]}" if m.group(1) in flags else m.group(0), message)


def flags_of(actions: Iterable[argparse.Action]) -> dict[str, str]:
    """Parameter name -> the command's long flag for it (``max_key_groups`` -> ``--max-key-groups``)."""
    return {a.dest: a.option_strings[-1] for a in actions if a.option_strings and a.dest != argparse.SUPPRESS}


__all__ = [
    "check_environment",
    "check_operator",
    "check_roots",
    "check_stores",
    "flags_of",
    "in_flag_terms",
    "latest_operators",
    "nested_roots",
]
