"""Run Alembic migrations from code (``lstdp db upgrade``) and seed reference rows."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from backend.db import db_timeouts, make_engine
from backend.services.channels import ensure_channels
from backend.settings import get_settings

ROOT = Path(__file__).resolve().parent.parent


def alembic_config(url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` and seed the channel rows."""
    from sqlalchemy.orm import Session

    command.upgrade(alembic_config(url), revision)
    engine = make_engine(url, db_timeouts(get_settings(), "migrations"))
    try:
        with Session(engine) as s:
            ensure_channels(s)
            s.commit()
    finally:
        engine.dispose()


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)
