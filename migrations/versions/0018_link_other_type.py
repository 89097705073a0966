"""Event links carry the other event's type and owner.

* ``event_associations.other_event_type``: the HEK code of ``other_event_id``'s event;
* ``event_associations.other_owner``: its owner (NULL: public);
* ``ix_event_associations_other_type`` on ``(other_event_type, event_id, other_owner)``;
* ``ix_events_peak_value`` and ``ix_events_angular_width``: ``min_peak_value`` and
  ``min_angular_width`` above every stored value walked all events newest first to find none
  (0.1-0.3 s at 1,000,000 events).

The ``associated_type`` search ("events linked to an event of type X that the viewer may
see") then reads one index range instead of joining every link with the other events: at
1,000,000 events and 600,000 links that join took 0.1-0.3 s per search on PostgreSQL
(``benchmarks/embedded_search.py``). An event's type and owner never change once stored,
so the copies stay true. Existing rows are filled from ``events``.

Revision ID: 0018_link_other_type
Revises: 0017_movie_options
Create Date: 2026-12-05 19:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_link_other_type"
down_revision: str | None = "0017_movie_options"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("event_associations") as batch:
        batch.add_column(sa.Column("other_event_type", sa.String(4), nullable=True))
        batch.add_column(sa.Column("other_owner", sa.String(100), nullable=True))
    op.execute("UPDATE event_associations SET "
               "other_event_type = (SELECT e.event_type FROM events e WHERE e.id = event_associations.other_event_id), "
               "other_owner = (SELECT e.owner FROM events e WHERE e.id = event_associations.other_event_id)")
    with op.batch_alter_table("event_associations") as batch:
        batch.alter_column("other_event_type", existing_type=sa.String(4), nullable=False)
        batch.create_index("ix_event_associations_other_type", ["other_event_type", "event_id", "other_owner"])
    op.create_index("ix_events_peak_value", "events", ["peak_value"])
    op.create_index("ix_events_angular_width", "events", ["angular_width"])


def downgrade() -> None:
    op.drop_index("ix_events_angular_width", table_name="events")
    op.drop_index("ix_events_peak_value", table_name="events")
    with op.batch_alter_table("event_associations") as batch:
        batch.drop_index("ix_event_associations_other_type")
        batch.drop_column("other_owner")
        batch.drop_column("other_event_type")
