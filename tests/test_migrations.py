"""Alembic on real PostgreSQL: upgrade, downgrade, and models match migrations."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select

from backend import db as dbmod
from backend.migrate import downgrade, upgrade
from backend.models import Base, Channel

from tests.conftest import create_pg_database, drop_pg_database

pytestmark = pytest.mark.postgres


@pytest.fixture
def fresh_pg():
    url = create_pg_database("lstdp_mig")
    yield url
    drop_pg_database(url)


def test_upgrade_downgrade_upgrade(fresh_pg):
    upgrade(fresh_pg)
    engine = dbmod.make_engine(fresh_pg)
    try:
        tables = set(inspect(engine).get_table_names())
        assert set(Base.metadata.tables) <= tables
        downgrade(fresh_pg, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(fresh_pg)
        from sqlalchemy.orm import Session

        with Session(engine) as s:
            codes = set(s.scalars(select(Channel.code)))
        assert codes == {"SDI", "WST", "SCI-UV", "SCI-WL"}
    finally:
        engine.dispose()


def test_models_match_migrations(fresh_pg):
    upgrade(fresh_pg)
    engine = dbmod.make_engine(fresh_pg)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
    finally:
        engine.dispose()


def test_sqlite_upgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    upgrade(url)
    upgrade(url)  # idempotent
    engine = dbmod.make_engine(url)
    try:
        assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
