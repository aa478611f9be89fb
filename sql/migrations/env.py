"""Alembic environment: migrates the catalog on the connection `statekeeper.sql.db.upgrade` passes in.

Run from a shell with ``alembic -c sql/alembic.ini upgrade head`` (URL from ``STATEKEEPER_DB_URL``
or the embedded default), or from Python with ``statekeeper.sql.db.upgrade(url)``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from statekeeper.sql.db import make_engine
from statekeeper.sql.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url") or None,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or None)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
