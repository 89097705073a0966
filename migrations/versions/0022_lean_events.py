"""Lean events path: a generation number of the catalogue coverage, and search indexes.

* ``data_generations`` (name, value) and the sequence ``data_generation_seq``; on PostgreSQL
  a statement-level trigger on ``catalogue_coverage`` (INSERT, UPDATE, DELETE, TRUNCATE) sets
  the ``catalogue_coverage`` row's value to the sequence's next value, in the writer's
  transaction. The lean event search (``backend/services/event_search_lean.py``) keeps the
  catalogue spans per process and re-reads them when the number it reads with each search
  differs: correct across processes and for every writer of the table (imports today), without
  the application having to remember to bump it. A sequence, not ``value + 1``: a write rolled
  back never makes a number that another write gives again.
* ``ix_events_goes_flux_id`` (goes_flux, id) gets ``INCLUDE`` columns (owner, event_type,
  start_time, end_time, peak_time): a minimum GOES class (the count of up to 10,001 matches,
  the ids of a page sorted by flux) is then read from the index alone. Without them the
  planner took a sequential scan for the count of ``min_goes_class=B5`` (130,000 rows read,
  57 ms at 1,000,000 events: benchmarks/reports/events_api_load.md).
* A GiST index (PostgreSQL) of 2-D points for the box filter, whose time range and Solar X
  range two B-tree ranges cannot both bound: ``ix_events_time_hpc_x`` on (start time [s since
  2000-01-01 UTC], Solar X) of the events that have a position, carrying what the search tests
  besides (INCLUDE). A box over a month read every event of the month (12,000 index entries
  for 0-50 matches, 1-10 ms); with it 0.5-2.5 ms (benchmarks/reports/events_api_load.md). The
  lean search adds the point-in-box condition beside the exact ones (a superset with 1 s of
  slack: the rows are the same) when both time bounds and both Solar X bounds are given. The
  position-angle filter is covered by the INCLUDE columns of ``ix_events_type_start_id``
  (migration 0015); a GiST of (time, angle) was tried and made the planner slower (a bitmap
  heap scan), so it is not made.

Issue 29 item 4. The number 0022 was assigned to this change; it chains after 0019 here (the
lead re-chains 0020/0021 at merge).

Revision ID: 0022_lean_events
Revises: 0021_workers_and_lane_faults
Create Date: 2026-12-05 22:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022_lean_events"
down_revision: str | None = "0021_workers_and_lane_faults"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BUMP = """
CREATE OR REPLACE FUNCTION lstdp_bump_generation() RETURNS trigger AS $$
BEGIN
    INSERT INTO data_generations (name, value) VALUES (TG_ARGV[0], nextval('data_generation_seq'))
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value;
    RETURN NULL;
END $$ LANGUAGE plpgsql
"""


#: ix_events_goes_flux_id's INCLUDE columns (models.Event.__table_args__).
_FLUX_INCLUDE = ["owner", "event_type", "start_time", "end_time", "peak_time"]


#: The start time as seconds since 2000-01-01 UTC, an IMMUTABLE expression (timestamptz minus
#: timestamptz is an interval; its epoch does not depend on the session's time zone). The lean
#: search (backend/services/event_search_lean.py) writes the same text.
TIME_S = "date_part('epoch', start_time - '2000-01-01 00:00:00+00'::timestamptz)"
_GIST = {
    "ix_events_time_hpc_x": (f"point({TIME_S}, hpc_x)", "hpc_x IS NOT NULL",
                             "hpc_y, event_type, owner, end_time, peak_time"),
}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_events_goes_flux_id", table_name="events")
        op.create_index("ix_events_goes_flux_id", "events", ["goes_flux", "id"], postgresql_include=_FLUX_INCLUDE)
        for name, (expr, where, include) in _GIST.items():
            op.execute(f"CREATE INDEX {name} ON events USING gist (({expr})) INCLUDE ({include}) WHERE {where}")
    op.create_table(
        "data_generations",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.execute("INSERT INTO data_generations (name, value) VALUES ('catalogue_coverage', 0)")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE SEQUENCE data_generation_seq")
        op.execute(_BUMP)
        op.execute("CREATE TRIGGER catalogue_coverage_generation AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
                   "ON catalogue_coverage FOR EACH STATEMENT EXECUTE FUNCTION lstdp_bump_generation('catalogue_coverage')")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name in _GIST:
            op.execute(f"DROP INDEX IF EXISTS {name}")
        op.drop_index("ix_events_goes_flux_id", table_name="events")
        op.create_index("ix_events_goes_flux_id", "events", ["goes_flux", "id"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS catalogue_coverage_generation ON catalogue_coverage")
        op.execute("DROP FUNCTION IF EXISTS lstdp_bump_generation()")
        op.execute("DROP SEQUENCE IF EXISTS data_generation_seq")
    op.drop_table("data_generations")
