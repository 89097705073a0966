"""Movies: the options a movie was asked with are part of its row.

* ``movies.size``: the larger side of the MP4 [pixel]; NULL: the products' own resolution
  (of the crop, with ``crop``);
* ``movies.event_id``: the event marked (and cropped to, with ``crop``); a foreign key to
  ``events``, set NULL when the event is deleted (the movie then has no marker, and a
  cropped one that is not yet made fails saying so);
* ``movies.crop``: cropped to the event's box (``pipelines.movies.event_box``); false for
  every movie made before this revision (they were drawn whole).

Revision ID: 0017_movie_options
Revises: 0015_search_indexes
Create Date: 2026-12-05 17:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_movie_options"
down_revision: str | None = "0015_search_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("movies") as batch:
        batch.add_column(sa.Column("size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("event_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("crop", sa.Boolean(), nullable=False, server_default="0"))
        batch.create_foreign_key("fk_movies_event_id_events", "events", ["event_id"], ["id"], ondelete="SET NULL")
        batch.create_index("ix_movies_event_id", ["event_id"])


def downgrade() -> None:
    with op.batch_alter_table("movies") as batch:
        batch.drop_index("ix_movies_event_id")
        batch.drop_constraint("fk_movies_event_id_events", type_="foreignkey")
        batch.drop_column("crop")
        batch.drop_column("event_id")
        batch.drop_column("size")
