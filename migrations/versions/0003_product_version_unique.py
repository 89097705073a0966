"""Products: one row per (frame, version), so concurrent jobs cannot share a version number.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 12:10:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("products") as batch:
        batch.create_unique_constraint("uq_products_frame_id_version", ["frame_id", "version"])


def downgrade() -> None:
    with op.batch_alter_table("products") as batch:
        batch.drop_constraint("uq_products_frame_id_version", type_="unique")
