"""Reproducibility: product manifests and re-run items.

* ``products.manifest``: the machine-readable manifest recorded when a product is written
  (``backend.services.manifests``); NULL for products written before this revision.
* ``rerun_items``: one row per frame of a ``rerun`` job (the manifest's inputs, the claim of
  the delivery recomputing it, the result and its comparison with the original's data).

Revision ID: 0011_manifests
Revises: (re-chained at merge)
Create Date: 2026-12-02 10:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_manifests"
down_revision: str | None = "0011_quotas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("products") as batch:
        batch.add_column(sa.Column("manifest", sa.JSON(), nullable=True))
    op.create_table(
        "rerun_items",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("frame_id", sa.Integer(), nullable=False),
        sa.Column("product_id", sa.Integer(), nullable=True),
        sa.Column("frame_sha256", sa.String(length=64), nullable=False),
        sa.Column("calibration_files", sa.JSON(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("expected", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claimed_by", sa.String(length=200), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("backend", sa.String(length=16), nullable=True),
        sa.Column("data_sha256", sa.JSON(), nullable=True),
        sa.Column("verdict", sa.String(length=20), nullable=True),
        sa.Column("comparison", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_rerun_items_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["frame_id"], ["frames.id"], name=op.f("fk_rerun_items_frame_id_frames"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["product_id"], ["products.id"], name=op.f("fk_rerun_items_product_id_products"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("job_id", "frame_id", name=op.f("pk_rerun_items")),
    )
    op.create_index("ix_rerun_items_product_id", "rerun_items", ["product_id"])


def downgrade() -> None:
    op.drop_index("ix_rerun_items_product_id", table_name="rerun_items")
    op.drop_table("rerun_items")
    with op.batch_alter_table("products") as batch:
        batch.drop_column("manifest")
