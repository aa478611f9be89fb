"""Alembic migrations of the catalog database (run through `sql.db.upgrade`)."""
