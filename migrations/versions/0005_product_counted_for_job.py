"""Products: the job a product's outcome was counted towards (idempotent progress counts).

A redelivered or duplicated progress message (a killed worker, a visibility timeout) used to
add a product to its job's counts a second time: counts above the total, a job ended early.
``products.counted_for_job`` is set once, by the UPDATE that counts the product, so a second
message for the same (product, job) counts nothing.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 20:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("products") as batch:
        batch.add_column(sa.Column("counted_for_job", sa.String(length=36), nullable=True))
    # products already counted (written or failed under their job) are marked counted, so a
    # late message of a running job does not count them again after the upgrade
    op.execute("UPDATE products SET counted_for_job = job_id WHERE job_id IS NOT NULL "
               "AND state IN ('written', 'failed')")


def downgrade() -> None:
    with op.batch_alter_table("products") as batch:
        batch.drop_column("counted_for_job")
