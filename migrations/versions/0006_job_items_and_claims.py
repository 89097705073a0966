"""Jobs survive faults: one item per frame of a job, product claims, follow-up keys.

* ``job_items`` (job, frame) -> product and outcome: the job's counts are its items' counts,
  settled once each (replaces ``products.counted_for_job``, which could hold one job only:
  two jobs waiting on one product counted it twice).
* ``products.attempts``, ``claimed_at``, ``claimed_by``: a calibration claims its product
  for a lease; a claim whose worker died is taken back, and a product whose calibration
  started ``MAX_DELIVERIES`` times without finishing fails (a poison frame stops).
  ``products.sent_at``: when its message was last sent (the reconciler re-sends lost ones).
* ``jobs.deliveries``: deliveries of the plan message (a job whose planning kills its worker
  fails instead of looping).
* ``job_follow_ups``: the detections a job queues when it ends, one row per key, so a
  redelivered or re-sent detection runs once.

Existing jobs get items from the products they planned (``products.job_id``; the latest
one where a re-planned job made two of one frame), settled where 0005 marked the product
counted.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 22:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OUTCOME = sa.Enum("pending", "done", "failed", "skipped", name="itemoutcome", native_enum=False, length=16)
FOLLOW_UP = sa.Enum("queued", "done", "failed", name="followupstate", native_enum=False, length=16)


def upgrade() -> None:
    op.create_table(
        "job_items",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("frame_id", sa.Integer(), nullable=False),
        sa.Column("product_id", sa.Integer(), nullable=True),
        sa.Column("outcome", OUTCOME, nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_items_job_id_jobs", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["frame_id"], ["frames.id"], name="fk_job_items_frame_id_frames",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["product_id"], ["products.id"], name="fk_job_items_product_id_products",
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("job_id", "frame_id", name="pk_job_items"),
    )
    op.create_index("ix_job_items_product_id", "job_items", ["product_id"])
    op.create_index("ix_job_items_outcome", "job_items", ["outcome"])
    op.create_table(
        "job_follow_ups",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("detector", sa.String(length=40), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("state", FOLLOW_UP, nullable=False),
        sa.Column("deliveries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("events", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_follow_ups_job_id_jobs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "detector", "channel", name="pk_job_follow_ups"),
    )
    op.create_index("ix_job_follow_ups_state", "job_follow_ups", ["state"])
    with op.batch_alter_table("products") as batch:
        batch.add_column(sa.Column("attempts", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("claimed_by", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("deliveries", sa.Integer(), server_default="0", nullable=False))
    op.execute(
        "INSERT INTO job_items (job_id, frame_id, product_id, outcome) "
        "SELECT job_id, frame_id, id, CASE "
        "  WHEN counted_for_job = job_id AND state = 'written' THEN 'done' "
        "  WHEN counted_for_job = job_id AND state = 'failed' THEN 'failed' "
        "  ELSE 'pending' END "
        "FROM products WHERE job_id IS NOT NULL "
        # one item per (job, frame): a plan message redelivered before 0006 re-planned its
        # job, and a master registered meanwhile gave the frame a second product of that job
        "AND id = (SELECT MAX(p2.id) FROM products p2 WHERE p2.job_id = products.job_id "
        "AND p2.frame_id = products.frame_id)")
    with op.batch_alter_table("products") as batch:
        batch.drop_column("counted_for_job")


def downgrade() -> None:
    with op.batch_alter_table("products") as batch:
        batch.add_column(sa.Column("counted_for_job", sa.String(length=36), nullable=True))
    op.execute("UPDATE products SET counted_for_job = job_id WHERE id IN "
               "(SELECT product_id FROM job_items WHERE outcome IN ('done', 'failed') "
               "AND job_items.job_id = products.job_id)")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("deliveries")
    with op.batch_alter_table("products") as batch:
        for c in ("sent_at", "claimed_by", "claimed_at", "attempts"):
            batch.drop_column(c)
    op.drop_index("ix_job_follow_ups_state", table_name="job_follow_ups")
    op.drop_table("job_follow_ups")
    op.drop_index("ix_job_items_outcome", table_name="job_items")
    op.drop_index("ix_job_items_product_id", table_name="job_items")
    op.drop_table("job_items")
