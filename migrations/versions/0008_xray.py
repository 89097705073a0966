"""GOES XRS time series (``xray_series``, ``xray_samples``) and the reason of each event association.

* ``xray_series``: one row per ingested GOES XRS file (unique on sha256): satellite, layout,
  span, cadence, gap counts, the quality rule applied.
* ``xray_samples``: one row per sample, keyed by (series, TAI seconds): XRS-A and XRS-B flux in
  W m-2 (NULL for a gap) and the quality words. One row per sample rather than arrays per
  chunk: a window is a range scan on ``t_tai`` on SQLite and PostgreSQL alike, a gap is a
  NULL the API passes on as ``null``, and a day of 1-s GOES-R data is 86,400 rows of 44 bytes.
* ``event_associations.reason``: why two events are linked, with the evidence (peak times
  apart, distance, NOAA region); NULL for links made before.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "xray_series",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("satellite", sa.String(length=16), nullable=False),
        sa.Column("layout", sa.String(length=32), nullable=False),
        sa.Column("original_name", sa.String(length=255), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cadence_s", sa.Float(), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("n_gaps_xrsa", sa.Integer(), nullable=False),
        sa.Column("n_gaps_xrsb", sa.Integer(), nullable=False),
        sa.Column("quality_rule", sa.Text(), nullable=False),
        sa.Column("notes", sa.JSON(), nullable=False),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_xray_series")),
        sa.UniqueConstraint("sha256", name=op.f("uq_xray_series_sha256")),
    )
    op.create_index(op.f("ix_xray_series_satellite"), "xray_series", ["satellite"])
    op.create_index("ix_xray_series_span", "xray_series", ["start_time", "end_time"])
    op.create_table(
        "xray_samples",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("t_tai", sa.Float(), nullable=False),
        sa.Column("xrsa", sa.Float(), nullable=True),
        sa.Column("xrsb", sa.Float(), nullable=True),
        sa.Column("xrsa_quality", sa.Integer(), nullable=True),
        sa.Column("xrsb_quality", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["series_id"], ["xray_series.id"], ondelete="CASCADE",
                                name=op.f("fk_xray_samples_series_id_xray_series")),
        sa.PrimaryKeyConstraint("series_id", "t_tai", name=op.f("pk_xray_samples")),
    )
    op.create_index("ix_xray_samples_t_tai", "xray_samples", ["t_tai"])
    with op.batch_alter_table("event_associations") as batch:
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("event_associations") as batch:
        batch.drop_column("reason")
    op.drop_index("ix_xray_samples_t_tai", table_name="xray_samples")
    op.drop_table("xray_samples")
    op.drop_index("ix_xray_series_span", table_name="xray_series")
    op.drop_index(op.f("ix_xray_series_satellite"), table_name="xray_series")
    op.drop_table("xray_series")
