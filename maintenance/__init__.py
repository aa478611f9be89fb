"""Maintenance operations (snapshots, expiry, orphan cleanup) and the statekeeper command line."""
