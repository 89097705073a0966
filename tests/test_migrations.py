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


def test_0004_clears_the_flux_of_impossible_goes_classes(fresh_pg):
    """Rows stored before the class rule lose the flux of a class GOES cannot report."""
    import datetime as dt

    from sqlalchemy import text

    upgrade(fresh_pg, "0003")
    engine = dbmod.make_engine(fresh_pg)
    try:
        with engine.begin() as c:
            for i, (cls, flux) in enumerate([("M12.0", 1.2e-4), ("C0.8", 8e-7), ("M1.5", 1.5e-5), ("X28", 2.8e-3)]):
                c.execute(text("INSERT INTO events (id, event_type, source, source_key, start_time, goes_class, "
                               "goes_flux, duration_s, attributes, created_at) "
                               "VALUES (:i, 'FL', 'goes_xrs', :k, :t, :c, :f, 0, '{}', :t)"),
                          {"i": i + 1, "k": f"k{i}", "t": dt.datetime(2024, 5, 10, tzinfo=dt.UTC), "c": cls, "f": flux})
        upgrade(fresh_pg)
        with engine.connect() as c:
            got = dict(c.execute(text("SELECT goes_class, goes_flux FROM events")).all())
        assert got == {"M12.0": None, "C0.8": None, "M1.5": 1.5e-5, "X28": 2.8e-3}
    finally:
        engine.dispose()


def test_0006_migrates_a_job_that_planned_two_products_of_one_frame(fresh_pg):
    """Before 0006 a redelivered plan message re-planned a running job; a calibration master
    registered in between gave the frame a second product (a new calibration key) with the
    same ``job_id``. One item per (job, frame): the migration keeps the job's latest product
    instead of failing on the primary key."""
    import datetime as dt

    from sqlalchemy import text

    upgrade(fresh_pg, "0005")
    engine = dbmod.make_engine(fresh_pg)
    t = dt.datetime(2024, 5, 10, tzinfo=dt.UTC)
    try:
        with engine.begin() as c:
            c.execute(text("INSERT INTO jobs (id, owner, kind, parameters, state, total, done, failed, skipped, "
                           "created_at) VALUES ('j1', 'me', 'recalibrate', '{}', 'running', 1, 0, 0, 0, :t)"),
                      {"t": t})
            c.execute(text("INSERT INTO frames (id, channel_code, date_obs, exposure_s, level, naxis1, naxis2, path, "
                           "original_name, sha256, size_bytes, header, quality_flags, ingested_at) VALUES "
                           "(1, 'WST', :t, 1, 'L1', 8, 8, '/x', 'x.fits', 'aa', 1, '{}', 0, :t)"), {"t": t})
            for pid, key, state, counted in ((1, 'k-old', 'failed', None), (2, 'k-new', 'written', 'j1')):
                c.execute(text("INSERT INTO products (id, frame_id, level, version, calibration_key, params_hash, "
                               "parameters, software_version, state, job_id, counted_for_job, created_at, "
                               "updated_at) VALUES (:id, 1, 'L2', :id, :k, 'h', '{}', 't', :s, 'j1', :c, :t, :t)"),
                          {"id": pid, "k": key, "s": state, "c": counted, "t": t})
        upgrade(fresh_pg)
        with engine.connect() as c:
            items = c.execute(text("SELECT job_id, frame_id, product_id, outcome FROM job_items")).all()
        assert [tuple(i) for i in items] == [("j1", 1, 2, "done")]
    finally:
        engine.dispose()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_0017_movie_options_upgrade_and_downgrade_keep_the_movies(dialect, tmp_path, request):
    """Issue 25 (movies): 0017 adds ``size``, ``event_id`` (set NULL when the event is
    deleted) and ``crop`` (false for the movies made before) to ``movies``, and its downgrade
    drops them again; the movies' rows survive both ways, on SQLite and PostgreSQL."""
    import datetime as dt

    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'm.sqlite3'}" if dialect == "sqlite" else request.getfixturevalue("fresh_pg")
    upgrade(url, "0014_idempotency_keys")
    engine = dbmod.make_engine(url)
    t = dt.datetime(2024, 5, 10, tzinfo=dt.UTC)
    movie = ("INSERT INTO movies (id, owner, channel_code, start_time, end_time, diff, fps, state, frames_total, "
             "created_at{cols}) VALUES (:id, 'me', 'SDI', :t, :t, 'none', 10, 'queued', 3, :t{vals})")
    try:
        with engine.begin() as c:
            c.execute(text(movie.format(cols="", vals="")), {"id": "old", "t": t})
        upgrade(url)
        cols = {c["name"]: c for c in inspect(engine).get_columns("movies")}
        assert {"size", "event_id", "crop"} <= set(cols) and not cols["crop"]["nullable"]
        fks = inspect(engine).get_foreign_keys("movies")
        assert [(f["referred_table"], f["options"].get("ondelete")) for f in fks
                if f["constrained_columns"] == ["event_id"]] == [("events", "SET NULL")]
        with engine.begin() as c:
            if dialect == "sqlite":
                c.exec_driver_sql("PRAGMA foreign_keys=ON")
            c.execute(text("INSERT INTO events (id, event_type, source, source_key, start_time, duration_s, "
                           "attributes, created_at) VALUES (7, 'FL', 'hek', 'k', :t, 0, '{}', :t)"), {"t": t})
            c.execute(text(movie.format(cols=", size, event_id, crop", vals=", 256, 7, :crop")),
                      {"id": "new", "t": t, "crop": True})
        with engine.connect() as c:
            got = {r[0]: tuple(r[1:]) for r in c.execute(text("SELECT id, size, event_id, crop FROM movies"))}
        assert got == {"old": (None, None, False), "new": (256, 7, True)}
        with engine.begin() as c:
            if dialect == "sqlite":
                c.exec_driver_sql("PRAGMA foreign_keys=ON")
            c.execute(text("DELETE FROM events WHERE id = 7"))
        with engine.connect() as c:
            assert c.execute(text("SELECT event_id, crop FROM movies WHERE id = 'new'")).one() == (None, True)
        downgrade(url, "0014_idempotency_keys")
        assert not {"size", "event_id", "crop"} & {c["name"] for c in inspect(engine).get_columns("movies")}
        with engine.connect() as c:
            assert sorted(c.execute(text("SELECT id FROM movies")).scalars()) == ["new", "old"]
        upgrade(url)
    finally:
        engine.dispose()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_0018_links_carry_the_other_events_type_and_owner(dialect, tmp_path, request):
    """Issue 25 (search at scale): 0018 copies each link's other event's type and owner into
    the link row (existing rows filled from ``events``), makes the type NOT NULL and indexes
    ``(other_event_type, event_id, other_owner)``; the downgrade drops them, keeping the links."""
    import datetime as dt

    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'l.sqlite3'}" if dialect == "sqlite" else request.getfixturevalue("fresh_pg")
    upgrade(url, "0017_movie_options")
    engine = dbmod.make_engine(url)
    t = dt.datetime(2024, 5, 10, tzinfo=dt.UTC)
    try:
        with engine.begin() as c:
            for eid, typ, owner in ((1, "FL", None), (2, "CE", None), (3, "CE", "alice")):
                c.execute(text("INSERT INTO events (id, event_type, source, source_key, start_time, duration_s, "
                               "attributes, created_at, owner) VALUES (:i, :ty, 'hek', :k, :t, 0, '{}', :t, :o)"),
                          {"i": eid, "ty": typ, "k": f"k{eid}", "t": t, "o": owner})
            for a, b in ((1, 2), (2, 1), (1, 3), (3, 1)):
                c.execute(text("INSERT INTO event_associations (event_id, other_event_id, kind) "
                               "VALUES (:a, :b, 'same_event')"), {"a": a, "b": b})
        upgrade(url)
        with engine.connect() as c:
            got = {(r[0], r[1]): (r[2], r[3]) for r in c.execute(text(
                "SELECT event_id, other_event_id, other_event_type, other_owner FROM event_associations"))}
        assert got == {(1, 2): ("CE", None), (2, 1): ("FL", None), (1, 3): ("CE", "alice"), (3, 1): ("FL", None)}
        cols = {c["name"]: c for c in inspect(engine).get_columns("event_associations")}
        assert not cols["other_event_type"]["nullable"] and cols["other_owner"]["nullable"]
        assert ["other_event_type", "event_id", "other_owner"] in [
            i["column_names"] for i in inspect(engine).get_indexes("event_associations")]
        downgrade(url, "0017_movie_options")
        assert not {"other_event_type", "other_owner"} & {
            c["name"] for c in inspect(engine).get_columns("event_associations")}
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM event_associations")).scalar() == 4
        upgrade(url)
    finally:
        engine.dispose()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_0019_products_carry_their_quality_flags(dialect, tmp_path, request):
    """Issue 27 item 5: 0019 adds ``products.quality_flags`` (NOT NULL, default 0), filled from the
    stored header: ``QUALITY`` when there is one, else a failed centre fit of an older product
    (``FITCSTAT = 'FAILED'``: refused when HISTORY gives a refusal's reason, else failed); the
    downgrade drops it, keeping the products."""
    import datetime as dt
    import json

    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'q.sqlite3'}" if dialect == "sqlite" else request.getfixturevalue("fresh_pg")
    upgrade(url, "0018_link_other_type")
    engine = dbmod.make_engine(url)
    t = dt.datetime(2024, 5, 10, tzinfo=dt.UTC)
    headers = {
        1: {"FITCSTAT": "OK", "HISTORY": ["fit_sun_centre: limb fit ... the header's centre kept"]},
        2: {"FITCSTAT": "FAILED", "HISTORY": ["fit_sun_centre: limb fit FAILED (fit 4.94 px from the header's "
                                              "centre, more than the 4.2 px believed); the header's centre kept"]},
        3: {"FITCSTAT": "FAILED", "HISTORY": ["fit_sun_centre: limb fit FAILED (limb edge found on 3 of 800 rays "
                                              "only); the header's centre kept"]},
        4: {"QUALITY": 9, "FITCSTAT": "FAILED", "HISTORY": ["... believed ..."]},
        5: None,
    }
    try:
        with engine.begin() as c:
            c.execute(text("INSERT INTO frames (id, channel_code, date_obs, exposure_s, level, naxis1, naxis2, path, "
                           "original_name, sha256, size_bytes, header, quality_flags, ingested_at) VALUES "
                           "(1, 'WST', :t, 1, 'L1', 8, 8, '/x', 'x.fits', 'aa', 1, '{}', 0, :t)"), {"t": t})
            for pid, header in headers.items():
                c.execute(text("INSERT INTO products (id, frame_id, level, version, calibration_key, params_hash, "
                               "parameters, software_version, state, header, created_at, updated_at) VALUES "
                               "(:id, 1, 'L2', :id, 'k', 'h', '{}', 't', 'written', :h, :t, :t)"),
                          {"id": pid, "h": None if header is None else json.dumps(header), "t": t})
        upgrade(url)
        cols = {c["name"]: c for c in inspect(engine).get_columns("products")}
        assert "quality_flags" in cols and not cols["quality_flags"]["nullable"]
        with engine.connect() as c:
            got = dict(c.execute(text("SELECT id, quality_flags FROM products")).all())
        assert got == {1: 0, 2: 1, 3: 2, 4: 9, 5: 0}
        with engine.begin() as c:  # a new row without the column gets the default
            c.execute(text("INSERT INTO products (id, frame_id, level, version, calibration_key, params_hash, "
                           "parameters, software_version, state, created_at, updated_at) VALUES "
                           "(6, 1, 'L2', 6, 'k', 'h', '{}', 't', 'planned', :t, :t)"), {"t": t})
        with engine.connect() as c:
            assert c.execute(text("SELECT quality_flags FROM products WHERE id = 6")).scalar() == 0
        downgrade(url, "0018_link_other_type")
        assert "quality_flags" not in {c["name"] for c in inspect(engine).get_columns("products")}
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM products")).scalar() == 6
        upgrade(url)
    finally:
        engine.dispose()
