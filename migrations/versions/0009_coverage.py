"""Catalogue coverage: the time span each imported catalogue file says it covers.

``catalogue_coverage`` (source, file) -> [covers_start, covers_end), complete, basis:
recorded by ``lstdp import-events`` (``backend.services.coverage.record_catalogue_coverage``)
from what the file states (``pipelines.catalogues.coverage``). Catalogues imported before
this revision get their rows at their next import (a re-import stores no event twice).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "catalogue_coverage",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("file", sa.String(length=255), nullable=False),
        sa.Column("covers_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("covers_end", sa.DateTime(timezone=True), nullable=True),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.Column("basis", sa.String(length=400), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_catalogue_coverage")),
        sa.UniqueConstraint("source", "file", name=op.f("uq_catalogue_coverage_source_file")),
    )
    op.create_index("ix_catalogue_coverage_source_start", "catalogue_coverage", ["source", "covers_start"])


def downgrade() -> None:
    op.drop_index("ix_catalogue_coverage_source_start", table_name="catalogue_coverage")
    op.drop_table("catalogue_coverage")
