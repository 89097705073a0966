"""Many users: API tokens, calibration sets, cancel/retry/re-run columns, event ownership.

* ``api_tokens``: opaque tokens stored as SHA-256, with scopes, expiry and revocation.
* ``calibration_sets``: one row per (channel, calibration files, options); products are
  versioned by set: ``products.calibration_set_id``, and ``products.version`` becomes the
  set's id (before: a per-frame counter, so "v2" meant different calibrations on different
  frames). Existing products get sets from their (channel, calibration_key, params_hash);
  the default sets (nothing pinned, default options) are public, the others belong to
  the owner of the job that made them (none: the platform).
* ``jobs.publishes``, ``lane``, ``cancel_requested_at``, ``cancelled_by``, ``retries``,
  ``rerun_of``, ``cancelled``: who may feed the public catalogue, the worker pool, cancel,
  retry and re-run.
* ``events.calibration_set_id`` and ``events.owner``: a detection made on a user's set is
  that user's (``owner``); the public catalogue is ``owner IS NULL``. The search indexes
  carry ``owner`` so the catalogue's filters still run from the index alone.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 10:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_INCLUDE = ["end_time", "peak_time", "position_angle", "hpc_x", "hpc_y", "goes_flux"]
NEW_INCLUDE = [*OLD_INCLUDE, "owner"]


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_index("ix_api_tokens_user", "api_tokens", ["user"])
    op.create_table(
        "calibration_sets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("channel_code", sa.String(length=16), nullable=False),
        sa.Column("calibration_key", sa.String(length=200), nullable=False),
        sa.Column("params_hash", sa.String(length=64), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("pinned", sa.JSON(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("software_version", sa.String(length=40), nullable=False),
        sa.Column("epoch_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("epoch_end", sa.DateTime(timezone=True), nullable=True),
        sa.Column("is_default", sa.Boolean(), nullable=False),
        sa.Column("public", sa.Boolean(), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=True),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("promoted_by", sa.String(length=100), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["channel_code"], ["channels.code"], name="fk_calibration_sets_channel_code_channels"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibration_sets")),
        sa.UniqueConstraint("channel_code", "calibration_key", "params_hash",
                            name=op.f("uq_calibration_sets_channel_code_calibration_key_params_hash")),
    )
    op.create_index("ix_calibration_sets_channel_code", "calibration_sets", ["channel_code"])
    op.create_index("ix_calibration_sets_public", "calibration_sets", ["public"])
    op.create_index("ix_calibration_sets_owner", "calibration_sets", ["owner"])

    with op.batch_alter_table("products") as batch:
        batch.add_column(sa.Column("calibration_set_id", sa.Integer(), nullable=True))
        batch.create_index("ix_products_calibration_set_id", ["calibration_set_id"], unique=False)
        batch.create_foreign_key("fk_products_calibration_set_id_calibration_sets", "calibration_sets",
                                 ["calibration_set_id"], ["id"], ondelete="RESTRICT")
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("publishes", sa.Boolean(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("lane", sa.String(length=8), nullable=False, server_default="cpu"))
        batch.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("cancelled_by", sa.String(length=100), nullable=True))
        batch.add_column(sa.Column("retries", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("rerun_of", sa.String(length=36), nullable=True))
        batch.add_column(sa.Column("cancelled", sa.Integer(), nullable=False, server_default="0"))
        batch.create_index("ix_jobs_owner", ["owner"], unique=False)
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("calibration_set_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("owner", sa.String(length=100), nullable=True))
        batch.create_foreign_key("fk_events_calibration_set_id_calibration_sets", "calibration_sets",
                                 ["calibration_set_id"], ["id"], ondelete="SET NULL")
        batch.drop_index("ix_events_type_start_id")
        batch.drop_index("ix_events_start_id")
        batch.create_index("ix_events_type_start_id", ["event_type", "start_time", "id"], unique=False,
                           postgresql_include=NEW_INCLUDE)
        batch.create_index("ix_events_start_id", ["start_time", "id"], unique=False,
                           postgresql_include=NEW_INCLUDE)
    _backfill_sets()


def _backfill_sets() -> None:
    """One set per existing (channel, calibration_key, params_hash); products get its id as
    their set and version (in two steps: a frame's versions stay unique at every row)."""
    bind = op.get_bind()
    md = sa.MetaData()
    products = sa.Table("products", md, autoload_with=bind)
    frames = sa.Table("frames", md, autoload_with=bind)
    jobs = sa.Table("jobs", md, autoload_with=bind)
    links = sa.Table("product_calibration_files", md, autoload_with=bind)
    cal = sa.Table("calibration_files", md, autoload_with=bind)
    sets = sa.Table("calibration_sets", md, autoload_with=bind)
    rows = bind.execute(
        sa.select(products.c.id, frames.c.channel_code, products.c.calibration_key, products.c.params_hash,
                  products.c.parameters, products.c.software_version, products.c.created_at, jobs.c.owner)
        .select_from(products.join(frames, frames.c.id == products.c.frame_id)
                     .outerjoin(jobs, jobs.c.id == products.c.job_id))
        .order_by(products.c.id)).all()
    made: dict[tuple, int] = {}
    for r in rows:
        key = (r.channel_code, r.calibration_key, r.params_hash)
        if key in made:
            continue
        params = r.parameters or {}
        if isinstance(params, str):
            import json

            params = json.loads(params)
        opts = {k: v for k, v in (params.get("options") or {}).items() if v is not None}
        pinned = params.get("pinned") or {}
        files = bind.execute(
            sa.select(cal.c.id, cal.c.kind, cal.c.version, cal.c.sha256, cal.c.valid_from, cal.c.valid_to)
            .select_from(links.join(cal, cal.c.id == links.c.calibration_file_id))
            .where(links.c.product_id == r.id).order_by(cal.c.kind)).all()
        starts = [f.valid_from for f in files if f.valid_from is not None]
        ends = [f.valid_to for f in files if f.valid_to is not None]
        default = not pinned and not opts
        res = bind.execute(sets.insert().values(
            channel_code=r.channel_code, calibration_key=r.calibration_key, params_hash=r.params_hash,
            options=opts, pinned=pinned,
            files=[{"id": f.id, "kind": f.kind, "version": f.version, "sha256": f.sha256} for f in files],
            software_version=r.software_version, epoch_start=max(starts) if starts else None,
            epoch_end=min(ends) if ends else None, is_default=default, public=default,
            owner=None if default or r.owner in (None, "anonymous", "system") else r.owner,
            created_at=r.created_at))
        made[key] = res.inserted_primary_key[0]
    for (channel, ckey, phash), set_id in made.items():
        ids = sa.select(frames.c.id).where(frames.c.channel_code == channel).scalar_subquery()
        bind.execute(products.update().where(products.c.calibration_key == ckey, products.c.params_hash == phash,
                                             products.c.frame_id.in_(ids))
                     .values(calibration_set_id=set_id, version=-products.c.id))
    bind.execute(products.update().where(products.c.calibration_set_id.is_not(None))
                 .values(version=products.c.calibration_set_id))


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_index("ix_events_start_id")
        batch.drop_index("ix_events_type_start_id")
        batch.create_index("ix_events_type_start_id", ["event_type", "start_time", "id"], unique=False,
                           postgresql_include=OLD_INCLUDE)
        batch.create_index("ix_events_start_id", ["start_time", "id"], unique=False,
                           postgresql_include=OLD_INCLUDE)
        batch.drop_constraint("fk_events_calibration_set_id_calibration_sets", type_="foreignkey")
        batch.drop_column("owner")
        batch.drop_column("calibration_set_id")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_owner")
        for c in ("cancelled", "rerun_of", "retries", "cancelled_by", "cancel_requested_at", "lane", "publishes"):
            batch.drop_column(c)
    with op.batch_alter_table("products") as batch:
        batch.drop_constraint("fk_products_calibration_set_id_calibration_sets", type_="foreignkey")
        batch.drop_index("ix_products_calibration_set_id")
        batch.drop_column("calibration_set_id")
    # versions were set ids: the downgrade leaves them as they are (still unique per frame)
    op.drop_index("ix_calibration_sets_owner", table_name="calibration_sets")
    op.drop_index("ix_calibration_sets_public", table_name="calibration_sets")
    op.drop_index("ix_calibration_sets_channel_code", table_name="calibration_sets")
    op.drop_table("calibration_sets")
    op.drop_index("ix_api_tokens_user", table_name="api_tokens")
    op.drop_table("api_tokens")
