"""Movies: MP4 movies of one channel over a DATE-OBS window, made by a worker as a job.

* ``movies``: channel, window, difference mode (none, running, base), frame rate, state
  (queued, running, succeeded, failed), progress (frames done of total), the file and its
  size, and the delivery bookkeeping the reconciler reads (deliveries, sent_at, claim).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATE = sa.Enum("queued", "running", "succeeded", "failed", name="moviestate", native_enum=False, length=16)


def upgrade() -> None:
    op.create_table(
        "movies",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("channel_code", sa.String(length=16), nullable=False),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("diff", sa.String(length=16), nullable=False),
        sa.Column("fps", sa.Float(), nullable=False),
        sa.Column("state", STATE, nullable=False),
        sa.Column("frames_total", sa.Integer(), nullable=False),
        sa.Column("frames_done", sa.Integer(), server_default="0", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.Column("deliveries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claimed_by", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["channel_code"], ["channels.code"], name="fk_movies_channel_code_channels"),
        sa.PrimaryKeyConstraint("id", name="pk_movies"),
    )
    op.create_index("ix_movies_state", "movies", ["state"])


def downgrade() -> None:
    op.drop_index("ix_movies_state", table_name="movies")
    op.drop_table("movies")
