"""Browser sessions: the session cookie holds a random id, not the API token (issue 24).

* ``sessions``: one row per browser sign-in (``POST /api/v1/session``): the SHA-256 of the
  cookie's random id, the token it was made from (``token_id``, deleted with it), the user,
  ``created_at``, ``expires_at``, ``revoked_at`` (signed out, or the token revoked) and
  ``last_seen_at``.

Cookies set before this migration held the token itself; they are no longer accepted (401,
cleared): the browser signs in again.

Revision ID: 0013_sessions
Revises: 0012_set_identity
Create Date: 2026-12-03 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_sessions"
down_revision: str | None = "0012_set_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"], name=op.f("fk_sessions_token_id_api_tokens"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
        sa.UniqueConstraint("session_hash", name=op.f("uq_sessions_session_hash")),
    )
    op.create_index("ix_sessions_token_id", "sessions", ["token_id"])


def downgrade() -> None:
    op.drop_index("ix_sessions_token_id", table_name="sessions")
    op.drop_table("sessions")
