"""Layouts: each operator's partition count and key groups at every committed version.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "layouts",
        sa.Column("root_id", sa.Integer(), nullable=False),
        sa.Column("operator", sa.String(length=200), nullable=False),
        sa.Column("version", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("partitions", sa.Integer(), nullable=False),
        sa.Column("max_key_groups", sa.Integer(), nullable=True),
        sa.Column("change", sa.String(length=16), nullable=True),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["root_id"], ["checkpoint_roots.id"], name=op.f("fk_layouts_root_id_checkpoint_roots"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("root_id", "operator", "version", name=op.f("pk_layouts")),
    )


def downgrade() -> None:
    op.drop_table("layouts")
