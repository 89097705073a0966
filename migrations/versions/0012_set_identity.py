"""A calibration set's identity includes the software version.

The issue-12 sets were unique on (channel, calibration_key, params_hash): a new release of
the pipeline would have written its products under the set id of the old release's, so
"version S" would have meant two calibrations. The unique key now adds
``software_version``; the old constraint is replaced (batch mode on SQLite). A product is
one per (frame, set) (``uq_products_frame_id_version``, version = set id), so the products'
old unique (frame, calibration_key, params_hash) goes: a new release's product of a frame
has the same files and options as the old release's.

Existing sets are not split by release: a set made before this migration may hold products
of more than one software version (each product's own ``software_version`` says which).
The downgrade fails once two releases have made products of one frame (the old unique key
cannot be recreated over them).

Revision ID: 0012_set_identity
Revises: 0011_notify
Create Date: 2026-12-02 15:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012_set_identity"
down_revision: str | None = "0011_notify"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "uq_calibration_sets_channel_code_calibration_key_params_hash"
NEW = "uq_calibration_sets_identity"


PRODUCTS_OLD = "uq_products_frame_id_calibration_key_params_hash"


def upgrade() -> None:
    with op.batch_alter_table("calibration_sets") as b:
        b.drop_constraint(OLD, type_="unique")
        b.create_unique_constraint(NEW, ["channel_code", "calibration_key", "params_hash", "software_version"])
    with op.batch_alter_table("products") as b:
        b.drop_constraint(PRODUCTS_OLD, type_="unique")


def downgrade() -> None:
    with op.batch_alter_table("products") as b:
        b.create_unique_constraint(PRODUCTS_OLD, ["frame_id", "calibration_key", "params_hash"])
    with op.batch_alter_table("calibration_sets") as b:
        b.drop_constraint(NEW, type_="unique")
        b.create_unique_constraint(OLD, ["channel_code", "calibration_key", "params_hash"])
