"""Write-ahead records of what a calibration attempt is about to place (issue 28).

* ``placed_objects``: one row per file or object a calibration attempt is about to put into
  the product store (its product, the claim's attempt and holder, the path or ``s3://`` URL the
  row would name, the database's time), committed before the object is placed and deleted with
  the commit of the row that names it. A record left behind (a writer killed, past its soft
  time limit or out of disk between placing and committing) is settled by the reconciler and
  ``lstdp fsck --repair`` (``backend.worker.placements``): what the product row does not name
  is removed once the attempt's claim is no longer live.

Revision ID: 0023_placed_objects
Revises: 0022_lean_events
Create Date: 2026-12-06 01:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023_placed_objects"
down_revision: str | None = "0022_lean_events"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "placed_objects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("product_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("ref", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_placed_objects")),
    )
    op.create_index(op.f("ix_placed_objects_product_id"), "placed_objects", ["product_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_placed_objects_product_id"), table_name="placed_objects")
    op.drop_table("placed_objects")
