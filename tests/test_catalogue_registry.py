"""A catalogue is one file: a user's own list added as one parser module plus one registry line.

The module is written as a user would (README, "Adding a catalogue"): a parse function of
one file returning a ``ParseResult``, and a ``Catalogue(...)`` entry in
``pipelines.catalogues.CATALOGUES`` (here set for the test with ``monkeypatch.setitem``, the
registry line). The list holds two real flares of the NOAA GOES XRS report of 2012 (the
X5.4 and X1.3 of 2012-03-07, times and places as the report gives them) and a bad row. The
import stores its rows, refuses the bad one with the reason, names the folders no parser
reads, and the rest of the platform (HEK export, coverage) takes the new source as it is.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest
from sqlalchemy import select

from backend.models import CatalogueCoverage, Event
from backend.services.event_formats import hek_record, observation
from backend.services.events import import_all
from pipelines.catalogues import CATALOGUES, Catalogue, SOURCES

USER_MODULE = '''
"""My flare list: CSV of start, peak, end (UTC), GOES class and helioprojective x, y [arcsec]."""
import csv
import datetime as dt

from pipelines.catalogues.records import EventRecord, ParseResult


def _t(text):
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def parse_my_flares(path):
    result = ParseResult(source="my_flares", path=str(path))
    with open(path, newline="", encoding="utf-8") as fh:
        for i, row in enumerate(csv.DictReader(fh), start=2):
            result.rows_in += 1
            try:
                rec = EventRecord(event_type="FL", source="my_flares", source_key=row["start"],
                                  start_time=_t(row["start"]), peak_time=_t(row["peak"]), end_time=_t(row["end"]),
                                  goes_class=row["class"], hpc_x=float(row["x"]), hpc_y=float(row["y"]),
                                  frm_name="my flare list", frm_version="1")
            except ValueError as exc:
                result.refused.append((f"{path.name}:{i}", str(exc)))
                continue
            result.events.append(rec)
    return result.check()
'''

ROWS = """start,peak,end,class,x,y
2012-03-07T00:02:00,2012-03-07T00:24:00,2012-03-07T00:40:00,X5.4,-480,390
2012-03-07T01:05:00,2012-03-07T01:14:00,2012-03-07T01:23:00,X1.3,-470,380
2012-03-07T99:00:00,2012-03-07T01:14:00,2012-03-07T01:23:00,C1.0,0,0
"""


def _user_module(tmp_path):
    (tmp_path / "my_flares.py").write_text(textwrap.dedent(USER_MODULE), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("my_flares", tmp_path / "my_flares.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["my_flares"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_one_module_and_one_registry_line_make_a_catalogue(db_session, tmp_path, monkeypatch):
    mod = _user_module(tmp_path)
    # the registry line
    monkeypatch.setitem(CATALOGUES, "my_flares", Catalogue("my_flares", mod.parse_my_flares, "my_flares", "*.csv",
                                                           "My flare list", observatory="GOES", instrument="XRS"))
    events = tmp_path / "events"
    (events / "my_flares").mkdir(parents=True)
    (events / "my_flares" / "march2012.csv").write_text(ROWS, encoding="utf-8")
    (events / "cactus").mkdir()  # a list without a parser: named, not passed over
    (events / "cactus" / "cmes.txt").write_text("x\n", encoding="utf-8")
    (events / "notes.txt").write_text("x\n", encoding="utf-8")

    run = import_all(db_session, events)
    (r,) = run
    assert (r.source, r.rows_in, r.stored, len(r.refused)) == ("my_flares", 3, 2, 1)
    assert dict(r.refused) == {"march2012.csv:4": "hour must be in 0..23"}  # the parser's reason
    lines = run.lines()
    assert lines[0].startswith("my_flares  rows in      3  stored      2")
    assert "refused      1 x" in lines[1]
    assert "skipped cactus/: no parser for this catalogue" in lines
    assert "skipped notes.txt: not a catalogue folder" in lines

    rows = list(db_session.scalars(select(Event).where(Event.source == "my_flares").order_by(Event.start_time)))
    assert [e.goes_class for e in rows] == ["X5.4", "X1.3"] and rows[0].goes_flux == pytest.approx(5.4e-4)
    assert observation(rows[0]) == ("GOES", "XRS", None)
    assert hek_record(rows[0])["frm_identifier"] == "my_flares"
    # no coverage reader given: the file is recorded, its period unknown (and said so)
    (cov,) = db_session.scalars(select(CatalogueCoverage).where(CatalogueCoverage.source == "my_flares"))
    assert cov.covers_start is None and "no coverage reader" in cov.basis
    # a second import adds nothing
    (again,) = import_all(db_session, events)
    assert (again.stored, again.skipped_existing) == (0, 2)


def test_every_registered_catalogue_is_a_known_source():
    assert set(CATALOGUES) <= set(SOURCES)
    for source, cat in CATALOGUES.items():
        assert cat.source == source and len(source) <= 32 and callable(cat.parse)
