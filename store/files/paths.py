"""Validation of the relative paths every file manager accepts.

Every path under a checkpoint root goes through :func:`validate_relative_path`, so no caller can
address a file outside the root ("..", absolute paths, empty or hidden components).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from statekeeper.store.errors import ConfigurationError

_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,199}"
_COMPONENT = re.compile(_NAME)
_SAFE_PATH = re.compile(rf"(?:{_NAME}/)*{_NAME}")
"""A path of safe components in one match (listing and deletion check every path: one C call, not one per
component); any path it refuses goes through the per-component check, which names what is wrong."""


def validate_component(component: str, what: str = "path component") -> str:
    """Return `component` if it is a safe single name, else raise naming it."""
    if not isinstance(component, str) or not _COMPONENT.fullmatch(component) or ".." in component:
        raise ConfigurationError(
            f"invalid {what} {component!r}: use 1-200 characters of letters, digits and _ . = + -, "
            "not starting with '.' or '-' and without '..'"
        )
    return component


def validate_relative_path(path: str, *, allow_temp: bool = False) -> str:
    """Return `path` (components joined by '/') if every component is safe.

    `allow_temp` admits the hidden temp names the local manager itself creates, for cleanup code.
    """
    if isinstance(path, str) and _SAFE_PATH.fullmatch(path) and ".." not in path:
        return path
    if not isinstance(path, str) or not path or path.startswith("/") or path.endswith("/"):
        raise ConfigurationError(f"invalid checkpoint path {path!r}: must be relative, non-empty, no trailing /")
    parts = path.split("/")
    for part in parts[:-1]:
        validate_component(part)
    last = parts[-1]
    if allow_temp and last.startswith(".") and last.endswith(".tmp"):
        validate_component(last[1:])
    else:
        validate_component(last)
    return path


def validate_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a relative path, optionally ending in '/' or a partial name."""
    if prefix == "":
        return prefix
    body = prefix.rstrip("/")
    if not body or prefix.startswith("/") or ".." in prefix.split("/"):
        raise ConfigurationError(f"invalid listing prefix {prefix!r}")
    for part in body.split("/")[:-1]:
        validate_component(part)
    last = body.split("/")[-1]
    if last and not re.fullmatch(r"[A-Za-z0-9_.=+-]*", last):
        raise ConfigurationError(f"invalid listing prefix {prefix!r}")
    return prefix


def validate_paths_to_delete(paths: Iterable[str], *, allow_temp: bool = False) -> list[str]:
    """Every path of a `delete_many` call, validated before anything is deleted and without repeats.

    One bad path refuses the whole call, so bad input deletes nothing (DESIGN invariant 7).
    """
    return list(dict.fromkeys(validate_relative_path(p, allow_temp=allow_temp) for p in paths))


def validate_listing(prefix: str, start_after: str | None) -> None:
    """The arguments of a `list` call: a valid prefix and, if given, a path string to resume after."""
    validate_prefix(prefix)
    if start_after is not None and not isinstance(start_after, str):
        raise ConfigurationError(f"start_after must be a path string, got {start_after!r}")
