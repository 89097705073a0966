"""Workers with an identity, and storage faults that pause a lane (issue 28, items 3 and 4).

* ``worker_heartbeats``: one row per worker process start (a UUID, never ``host:pid``), with
  its host, pid, role and last heartbeat, all times from the database's clock. A claim whose
  worker stopped beating is dead on every host.
* ``lane_faults``: a lane (``cpu``/``gpu``) paused by a storage fault (disk full, read-only or
  unreachable store): the true reason, when it began, how many tries failed and when the lane
  is tried again.

Revision ID: 0021_workers_and_lane_faults
Revises: 0019_product_quality_flags
Create Date: 2026-12-05 22:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_workers_and_lane_faults"
down_revision: str | None = "0019_product_quality_flags"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "worker_heartbeats",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker_heartbeats")),
    )
    op.create_index(op.f("ix_worker_heartbeats_heartbeat_at"), "worker_heartbeats", ["heartbeat_at"])
    op.create_table(
        "lane_faults",
        sa.Column("lane", sa.String(8), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), server_default="1", nullable=False),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retry_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("lane", name=op.f("pk_lane_faults")),
    )


def downgrade() -> None:
    op.drop_table("lane_faults")
    op.drop_index(op.f("ix_worker_heartbeats_heartbeat_at"), table_name="worker_heartbeats")
    op.drop_table("worker_heartbeats")
