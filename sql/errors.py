"""Errors of the metadata database, under the root every statekeeper error shares (`statekeeper.errors`)."""

from __future__ import annotations

import datetime as dt

from statekeeper.errors import StatekeeperError


class CatalogError(StatekeeperError):
    """Base class: the catalog database is missing, outdated, or a query names what it does not know."""


class CatalogConfigError(CatalogError, ValueError):
    """A database URL or argument is invalid; nothing was read or written because of it."""


class CatalogUnavailableError(CatalogError, ConnectionError):
    """The catalog database cannot be reached (server stopped, restarting, network); the transaction in
    progress was not committed. Re-run once it is back."""


class NotInCatalogError(CatalogError, LookupError):
    """A root, store or version the caller named is not in the catalog (sync it first?)."""


class LeaseError(CatalogError):
    """Base class of maintenance lease failures."""


class LeaseUnavailableError(LeaseError):
    """Another maintainer holds the store (or the whole root) and did not release it within the timeout."""

    def __init__(self, root: str, scope: str, holder: str, scope_held: str, expires_at: dt.datetime, waited: float):
        what = "the whole root" if scope == "*" else f"store {scope}"
        held = "the whole root" if scope_held == "*" else f"store {scope_held}"
        super().__init__(
            f"cannot maintain {what} of {root}: {holder!r} holds a lease on {held} until "
            f"{expires_at.isoformat(timespec='seconds')} (waited {waited:.1f}s)"
        )
        self.root = root
        self.scope = scope
        self.holder = holder
        self.scope_held = scope_held
        self.expires_at = expires_at


class LeaseLostError(LeaseError):
    """A lease expired and was taken over (or released) before its holder renewed it."""
