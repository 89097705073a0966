"""Event search: ``goes_flux`` and ``duration_s`` columns, indexes for the search API.

* ``events.goes_flux`` [W m-2]: the GOES class as a number (``min_goes_class`` filter,
  sort by class), filled here for the rows already stored.
* ``events.duration_s`` [s]: start to end (peak without an end), bounds time-overlap
  searches (an event overlapping [t0, t1] starts after t0 minus the longest duration of
  its type, one probe of ``ix_events_type_duration``; of ``ix_events_duration`` for all
  types).
* ``(event_type, start_time, id)`` and ``(start_time, id)``, both ``INCLUDE (end_time,
  peak_time, position_angle, hpc_x, hpc_y, goes_flux)`` on PostgreSQL: keyset pagination,
  newest first, and filters and counts from the index alone;
  they replace the single-column ``event_type``/``start_time`` indexes and
  ``ix_events_type_start`` (prefixes of the new ones).
* ``goes_flux``; ``(frm_name, frm_version)``: the detector filters.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 11:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Columns carried in the search indexes (PostgreSQL INCLUDE): the filters are tested, and
#: matches counted, from the index alone (index-only scans).
SEARCH_INCLUDE = ["end_time", "peak_time", "position_angle", "hpc_x", "hpc_y", "goes_flux"]

_FLUX_SQL = """
UPDATE events SET goes_flux = CAST(substr(trim(goes_class), 2) AS FLOAT) * CASE upper(substr(trim(goes_class), 1, 1))
    WHEN 'A' THEN 1e-8 WHEN 'B' THEN 1e-7 WHEN 'C' THEN 1e-6 WHEN 'M' THEN 1e-5 WHEN 'X' THEN 1e-4 END
WHERE goes_class IS NOT NULL AND upper(substr(trim(goes_class), 1, 1)) IN ('A', 'B', 'C', 'M', 'X')
  AND {numeric}
"""


def upgrade() -> None:
    bind = op.get_bind()
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("goes_flux", sa.Float(), nullable=True))
        batch.add_column(sa.Column("duration_s", sa.Float(), nullable=False, server_default="0"))
    if bind.dialect.name == "postgresql":
        op.execute(_FLUX_SQL.format(numeric=r"substr(trim(goes_class), 2) ~ '^[0-9]+(\.[0-9]*)?$'"))
        op.execute("UPDATE events SET duration_s = GREATEST(0, EXTRACT(EPOCH FROM "
                   "COALESCE(end_time, peak_time, start_time) - start_time))")
    else:
        op.execute(_FLUX_SQL.format(numeric="substr(trim(goes_class), 2) GLOB '[0-9]*'"))
        op.execute("UPDATE events SET duration_s = MAX(0, (julianday(COALESCE(end_time, peak_time, start_time)) "
                   "- julianday(start_time)) * 86400.0)")
    with op.batch_alter_table("events") as batch:
        batch.alter_column("duration_s", server_default=None)
        batch.drop_index("ix_events_type_start")
        batch.drop_index("ix_events_event_type")
        batch.drop_index("ix_events_start_time")
        batch.create_index("ix_events_type_start_id", ["event_type", "start_time", "id"], unique=False,
                           postgresql_include=SEARCH_INCLUDE)
        batch.create_index("ix_events_start_id", ["start_time", "id"], unique=False,
                           postgresql_include=SEARCH_INCLUDE)
        batch.create_index("ix_events_type_duration", ["event_type", "duration_s"], unique=False)
        batch.create_index("ix_events_duration", ["duration_s"], unique=False)
        batch.create_index("ix_events_goes_flux", ["goes_flux"], unique=False)
        batch.create_index("ix_events_frm", ["frm_name", "frm_version"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_index("ix_events_frm")
        batch.drop_index("ix_events_goes_flux")
        batch.drop_index("ix_events_duration")
        batch.drop_index("ix_events_type_duration")
        batch.drop_index("ix_events_start_id")
        batch.drop_index("ix_events_type_start_id")
        batch.create_index("ix_events_start_time", ["start_time"], unique=False)
        batch.create_index("ix_events_event_type", ["event_type"], unique=False)
        batch.create_index("ix_events_type_start", ["event_type", "start_time"], unique=False)
        batch.drop_column("duration_s")
        batch.drop_column("goes_flux")
