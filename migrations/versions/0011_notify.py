"""Notifications: webhooks with their delivery outbox and attempt log, saved searches.

* ``webhooks``: a receiver URL of one job or one saved search and its HMAC-SHA256 secret;
* ``webhook_deliveries``: the outbox (one row per message, committed with the change it
  announces), its state (pending, delivering, delivered, failed) and claim;
* ``webhook_attempts``: every POST of a delivery (status, error, duration);
* ``saved_searches``: a user's event or product query, with its cursor;
* ``saved_search_notifications``: the new matches found, one row per (search, item).

Revision ID: 0011_notify
Revises: (re-chained at merge)
Create Date: 2026-12-02 10:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_notify"
down_revision: str | None = "0011_manifests"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DELIVERY_STATE = sa.Enum("pending", "delivering", "delivered", "failed", name="deliverystate",
                         native_enum=False, length=16)


def upgrade() -> None:
    op.create_table(
        "saved_searches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("query", sa.JSON(), nullable=False),
        sa.Column("cursor", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("matches", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("evaluated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_saved_searches")),
    )
    op.create_index("ix_saved_searches_owner", "saved_searches", ["owner"])
    op.create_table(
        "saved_search_notifications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("saved_search_id", sa.Integer(), nullable=False),
        sa.Column("item_kind", sa.String(length=16), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["saved_search_id"], ["saved_searches.id"], ondelete="CASCADE",
                                name="fk_saved_search_notifications_saved_search_id_saved_searches"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_saved_search_notifications")),
        sa.UniqueConstraint("saved_search_id", "item_id",
                            name="uq_saved_search_notifications_saved_search_id_item_id"),
    )
    op.create_index("ix_saved_search_notifications_saved_search_id", "saved_search_notifications",
                    ["saved_search_id"])
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(length=100), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=True),
        sa.Column("saved_search_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE", name="fk_webhooks_job_id_jobs"),
        sa.ForeignKeyConstraint(["saved_search_id"], ["saved_searches.id"], ondelete="CASCADE",
                                name="fk_webhooks_saved_search_id_saved_searches"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_index("ix_webhooks_owner", "webhooks", ["owner"])
    op.create_index("ix_webhooks_job_id", "webhooks", ["job_id"])
    op.create_index("ix_webhooks_saved_search_id", "webhooks", ["saved_search_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(length=40), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", DELIVERY_STATE, nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claimed_by", sa.String(length=200), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"], ondelete="CASCADE",
                                name="fk_webhook_deliveries_webhook_id_webhooks"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index("ix_webhook_deliveries_webhook_id", "webhook_deliveries", ["webhook_id"])
    op.create_index("ix_webhook_deliveries_state", "webhook_deliveries", ["state"])
    op.create_table(
        "webhook_attempts",
        sa.Column("delivery_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("retry_in_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhook_deliveries.id"], ondelete="CASCADE",
                                name="fk_webhook_attempts_delivery_id_webhook_deliveries"),
        sa.PrimaryKeyConstraint("delivery_id", "attempt", name=op.f("pk_webhook_attempts")),
    )


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_deliveries_state", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_webhook_id", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhooks_saved_search_id", table_name="webhooks")
    op.drop_index("ix_webhooks_job_id", table_name="webhooks")
    op.drop_index("ix_webhooks_owner", table_name="webhooks")
    op.drop_table("webhooks")
    op.drop_index("ix_saved_search_notifications_saved_search_id", table_name="saved_search_notifications")
    op.drop_table("saved_search_notifications")
    op.drop_index("ix_saved_searches_owner", table_name="saved_searches")
    op.drop_table("saved_searches")
