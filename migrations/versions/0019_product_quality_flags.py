"""Products carry the frame-wide systematics their calibration flagged.

* ``products.quality_flags``: the product header's ``QUALITY``, bits of
  ``pipelines.calibration.l2.quality.FrameQuality`` (1 centre fit refused, 2 centre fit
  failed, 4 stray light refused, 8 flat plane stated); 0: none. NOT NULL, default 0.

Issue 27 item 5: a 256 px frame with a 5 px pointing error had its correct centre fit refused
and kept the wrong header with no quality flag; the searches (``systematics=``) and pages read
this column. Existing rows are filled from the stored header: ``QUALITY`` when it has one, else
a ``FITCSTAT = 'FAILED'`` centre (products made before issue 27, without ``QUALITY``) is
``CENTRE_REFUSED`` when its HISTORY gives a refusal's reason (a fit too far from the header
or too uncertain) and ``CENTRE_FAILED`` otherwise.

Revision ID: 0019_product_quality_flags
Revises: 0018_link_other_type
Create Date: 2026-12-05 20:10:00
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_product_quality_flags"
down_revision: str | None = "0018_link_other_type"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: FrameQuality bits as of this migration (a migration does not import the application).
_CENTRE_REFUSED, _CENTRE_FAILED = 1, 2
#: HISTORY phrases of a refused centre fit (pipelines.calibration.l2.centre, lstdp 0.1.0).
_REFUSAL = ("believed", "fit uncertainty")


def _bits(header) -> int:
    if isinstance(header, str):
        header = json.loads(header)
    if not isinstance(header, dict):
        return 0
    if header.get("QUALITY") is not None:
        try:
            return int(header["QUALITY"])
        except (TypeError, ValueError):
            return 0
    if str(header.get("FITCSTAT", "")).strip().upper() != "FAILED":
        return 0
    history = " ".join(str(line) for line in (header.get("HISTORY") or []))
    return _CENTRE_REFUSED if any(p in history for p in _REFUSAL) else _CENTRE_FAILED


def upgrade() -> None:
    with op.batch_alter_table("products") as batch:
        batch.add_column(sa.Column("quality_flags", sa.Integer(), nullable=False, server_default="0"))
    conn = op.get_bind()
    # only headers that may flag something are read (a text match, then the JSON in Python)
    rows = conn.execute(sa.text("SELECT id, header FROM products WHERE header IS NOT NULL AND "
                                "(CAST(header AS TEXT) LIKE '%QUALITY%' OR CAST(header AS TEXT) LIKE '%FAILED%')"))
    updates = [{"i": pid, "q": q} for pid, header in rows if (q := _bits(header))]
    if updates:
        conn.execute(sa.text("UPDATE products SET quality_flags = :q WHERE id = :i"), updates)


def downgrade() -> None:
    with op.batch_alter_table("products") as batch:
        batch.drop_column("quality_flags")
