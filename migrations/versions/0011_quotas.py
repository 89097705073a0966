"""Fair use: the frames each job was charged (frames-per-day quota) and the per-user write counter.

* ``quota_charges``: frames a job covered at submit time, per owner; the frames-per-day
  quota sums those of the last 24 h (index on ``owner, created_at``).
* ``write_counts``: one row per user, the writes counted in the current fixed window of the
  write rate limit (bumped by one conditional upsert; shared by every API process).

Revision ID: 0011_quotas
Revises: 0010
Create Date: 2026-12-02 10:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_quotas"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quota_charges",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=True),
        sa.Column("frames", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_quota_charges_job_id_jobs"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quota_charges")),
    )
    op.create_index("ix_quota_charges_owner_created_at", "quota_charges", ["owner", "created_at"])
    op.create_index("ix_quota_charges_job_id", "quota_charges", ["job_id"])
    op.create_table(
        "write_counts",
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("writes", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("user", name=op.f("pk_write_counts")),
    )


def downgrade() -> None:
    op.drop_table("write_counts")
    op.drop_index("ix_quota_charges_job_id", table_name="quota_charges")
    op.drop_index("ix_quota_charges_owner_created_at", table_name="quota_charges")
    op.drop_table("quota_charges")
