"""File kinds of the Spark driver: its per-batch files and heartbeats, recorded as ours, not as foreign.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BEFORE = ("commit", "changelog", "manifest", "sst", "temp", "foreign")
_AFTER = (*_BEFORE, "batch", "heartbeat")


def _kinds(kinds: Sequence[str]) -> str:
    return "kind IN (" + ", ".join(f"'{k}'" for k in kinds) + ")"


def _replace_check(kinds: Sequence[str]) -> None:
    with op.batch_alter_table("files") as batch:  # SQLite: the table is copied with the new constraint
        batch.drop_constraint(op.f("ck_files_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_files_kind"), _kinds(kinds))


def upgrade() -> None:
    _replace_check(_AFTER)


def downgrade() -> None:
    op.execute("UPDATE files SET kind = 'foreign' WHERE kind IN ('batch', 'heartbeat')")
    _replace_check(_BEFORE)
