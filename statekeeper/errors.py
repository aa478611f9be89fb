"""The one root of every statekeeper error, below every package so that `store` and `sql` share it
without importing each other."""


class StatekeeperError(Exception):
    """Base class: catch this to handle every statekeeper failure (store, maintenance, catalog)."""
