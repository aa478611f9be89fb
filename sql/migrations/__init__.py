"""Alembic migrations of the catalog database (run through `statekeeper.sql.db.upgrade`)."""
