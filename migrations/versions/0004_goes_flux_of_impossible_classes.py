"""Events: no GOES flux for a class the instrument cannot report (data repair).

Rows stored before the class rule of ``pipelines.catalogues.records.goes_class_to_flux``
(B to M take a multiplier from 1.0 to 9.9; zero is never a class) may hold a flux for
``M12.0``, ``C0.8``, ``B0.6`` ... that a ``min_goes_class`` search returns. This revision
recomputes ``goes_flux`` from ``goes_class`` by that rule and clears it where the class is
impossible; the class text is kept as the catalogue wrote it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 20:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from pipelines.catalogues.records import goes_flux_or_none

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

events = sa.table("events", sa.column("id", sa.Integer), sa.column("goes_class", sa.String),
                  sa.column("goes_flux", sa.Float))


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.select(events.c.id, events.c.goes_class).where(
        events.c.goes_class.is_not(None), events.c.goes_flux.is_not(None))).all()
    bad = [r.id for r in rows if goes_flux_or_none(r.goes_class) is None]
    for i in range(0, len(bad), 1000):
        conn.execute(sa.update(events).where(events.c.id.in_(bad[i:i + 1000])).values(goes_flux=None))


def downgrade() -> None:
    """Nothing to undo: a flux for an impossible class was never a measurement."""
