"""Indexes for every filter of the event search on PostgreSQL and SQLite (issue 25).

* ``event_associations (other_event_id, event_id)``: ``associated_type`` (events linked to
  an event of type X) finds the links to each event of type X by an index probe; the
  primary key leads with ``event_id``, so SQLite (the embedded default) read every link once
  per CME and answered 503 at the API deadline on the demo's 79,000 events.
* ``event_products (product_id, event_id)``: ``calibration_set`` / ``calibration_file``
  (events detected on the products of a set or of a calibration file).
* ``products (calibration_key)``: ``calibration_set`` given as a key (``dark:3,flat:5``).
* ``events (source, start_time, id)`` (``INCLUDE`` the search columns on PostgreSQL),
  replacing ``ix_events_source`` (its prefix): one source newest first in index order, no
  sort of all that source's rows.
* ``events (noaa_ar)``: a NOAA region's events.
* ``events (goes_flux, id)``, ``(end_time, id)``, ``(peak_time, id)``, ``(speed_km_s, id)``:
  the nullable sort keys in index order (the page's rows with a value by the index, then the
  NULLs by id, ``backend.services.event_search``); the first two replace ``ix_events_goes_flux``
  and ``ix_events_end_time`` (their prefixes).

``ANALYZE`` at the end (both dialects) so that the planners know the new indexes' value
distribution (SQLite has no statistics otherwise and guesses).

Revision ID: 0015_search_indexes
Revises: 0014_idempotency_keys
Create Date: 2026-12-05 16:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015_search_indexes"
down_revision: str | None = "0014_idempotency_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Columns carried in the search indexes (PostgreSQL INCLUDE), as in migration 0002 plus
#: ``owner`` (``backend.models.SEARCH_INCLUDE``).
SEARCH_INCLUDE = ["end_time", "peak_time", "position_angle", "hpc_x", "hpc_y", "goes_flux", "owner"]


def upgrade() -> None:
    op.create_index("ix_event_associations_other", "event_associations", ["other_event_id", "event_id"])
    op.create_index("ix_event_products_product", "event_products", ["product_id", "event_id"])
    op.create_index("ix_products_calibration_key", "products", ["calibration_key"])
    op.create_index("ix_events_source_start_id", "events", ["source", "start_time", "id"],
                    postgresql_include=SEARCH_INCLUDE)
    op.drop_index("ix_events_source", table_name="events")
    op.create_index("ix_events_noaa_ar", "events", ["noaa_ar"])
    op.create_index("ix_events_goes_flux_id", "events", ["goes_flux", "id"])
    op.drop_index("ix_events_goes_flux", table_name="events")
    op.create_index("ix_events_end_time_id", "events", ["end_time", "id"])
    op.drop_index("ix_events_end_time", table_name="events")
    op.create_index("ix_events_peak_time_id", "events", ["peak_time", "id"])
    op.create_index("ix_events_speed_id", "events", ["speed_km_s", "id"])
    op.execute("ANALYZE")


def downgrade() -> None:
    op.drop_index("ix_events_speed_id", table_name="events")
    op.drop_index("ix_events_peak_time_id", table_name="events")
    op.create_index("ix_events_end_time", "events", ["end_time"])
    op.drop_index("ix_events_end_time_id", table_name="events")
    op.create_index("ix_events_goes_flux", "events", ["goes_flux"])
    op.drop_index("ix_events_goes_flux_id", table_name="events")
    op.drop_index("ix_events_noaa_ar", table_name="events")
    op.create_index("ix_events_source", "events", ["source"])
    op.drop_index("ix_events_source_start_id", table_name="events")
    op.drop_index("ix_products_calibration_key", table_name="products")
    op.drop_index("ix_event_products_product", table_name="event_products")
    op.drop_index("ix_event_associations_other", table_name="event_associations")
