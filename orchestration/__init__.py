"""The Dagster code location for statekeeper maintenance."""
