"""Index-only reads for the lean event search's box and angle counts (issue 29 item 4:
PostgreSQL's CPU per request).

PostgreSQL only (SQLite has neither GiST nor INCLUDE; nothing changes there):

* ``ix_events_time_hpc_x`` (GiST of ``point(start time [s since 2000-01-01 UTC], Solar X)``,
  migration 0022) also carries ``start_time``, ``hpc_x`` and ``id`` (INCLUDE). The box over a
  month tests ``start_time``, ``hpc_x`` and ``hpc_y`` and returns ``id``: without those columns
  in the index the planner read it as a bitmap (ANDed with ``ix_events_start_id``) and visited
  the table for every candidate (about 1,900 index entries and 330 table pages per search, for
  the count and again for the page); with them both are index-only scans.
* ``ix_events_pa_deg_start``: a B-tree of the events that have a position angle, keyed by the
  angle's whole degree (``least(greatest(floor(position_angle), -1), 360)``: NaN and +inf to 360,
  -inf to -1) and the start time, carrying what an angle search tests (INCLUDE). The lean
  search's exact count of an angle range adds ``degree = ANY(the degrees of the range)`` beside
  the exact conditions (the same rows: floor and the clamp are monotonic) and reads one range of
  start times per degree, index-only: a year of CMEs in a 20-120 deg range reads the few
  thousand entries of those degrees instead of every CME of the year (8,000-26,000 entries of
  ``ix_events_type_start_id``), a range through 0 deg included. The page itself keeps the
  B-tree of the type (newest first, it stops at the page's end). A GiST of (time, angle) with
  the same INCLUDE columns, tried first, cost about twice as much per entry and cannot take a
  range through 0 deg exactly (NaN passes ``pa >= lo``, no box holds it); migration 0022 tried
  one without them (a bitmap heap scan).

Figures: benchmarks/reports/events_api_load.md. Both are built by ``CREATE INDEX`` on the
existing rows (about 1-2 s each at 1,000,000 events), then ``ANALYZE events`` (the new
expression's statistics; about 1 s).

Revision ID: 0024_events_index_only_boxes
Revises: 0023_placed_objects
Create Date: 2026-12-06 19:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024_events_index_only_boxes"
down_revision: str | None = "0023_placed_objects"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The start time as seconds since 2000-01-01 UTC (the same IMMUTABLE text as migration 0022).
TIME_S = "date_part('epoch', start_time - '2000-01-01 00:00:00+00'::timestamptz)"
#: The position angle's whole degree, clamped (the same text as backend/services/event_search_lean.py).
PA_DEG = "least(greatest(floor(position_angle), -1), 360)"

#: name: (CREATE INDEX text after ``ON events``; the same before this migration, None: new here).
_INDEXES = {
    "ix_events_time_hpc_x": (
        f"USING gist ((point({TIME_S}, hpc_x))) "
        "INCLUDE (hpc_y, event_type, owner, end_time, peak_time, start_time, hpc_x, id) WHERE hpc_x IS NOT NULL",
        f"USING gist ((point({TIME_S}, hpc_x))) "
        "INCLUDE (hpc_y, event_type, owner, end_time, peak_time) WHERE hpc_x IS NOT NULL"),
    "ix_events_pa_deg_start": (
        f"(({PA_DEG}), start_time) INCLUDE (event_type, owner, end_time, peak_time, position_angle, id) "
        "WHERE position_angle IS NOT NULL",
        None),
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, (after, before) in _INDEXES.items():
        if before is not None:
            op.execute(f"DROP INDEX IF EXISTS {name}")
        op.execute(f"CREATE INDEX {name} ON events {after}")
    # statistics of the new index's expression (the degree) now, not at the next auto-analyze
    # (which only row changes start): the planner's estimate of the degree condition needs them
    op.execute("ANALYZE events")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, (_after, before) in _INDEXES.items():
        op.execute(f"DROP INDEX IF EXISTS {name}")
        if before is not None:
            op.execute(f"CREATE INDEX {name} ON events {before}")
