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

import datetime as dt
import importlib.util
import io
import subprocess
import sys
import textwrap

import pytest
from sqlalchemy import select

from astropy.io.votable import parse_single_table

from backend.models import CatalogueCoverage, Event
from backend.services.coverage import coverage_report, window_coverage
from backend.services.event_formats import events_csv, events_votable, hek_record, observation
from backend.services.events import associate_events, associated_events_with_reasons, import_all
from pipelines.catalogues import CATALOGUES, DETECTED_SOURCE, SOURCES, Catalogue, LazyFunction, source_entry

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


def test_the_registry_names_every_parser_and_reader_and_they_exist():
    """The built-in entries name their parser and coverage reader as strings; each resolves to a
    function of the named module; every known source has its names in one entry."""
    for source, cat in CATALOGUES.items():
        assert isinstance(cat.parse, LazyFunction) and isinstance(cat.coverage, LazyFunction)
        for ref in (cat.parse, cat.coverage):
            fn = ref.resolve()
            assert callable(fn) and fn.__module__ == ref.module and fn.__name__ == ref.name
    for source in SOURCES:
        entry = source_entry(source)
        assert entry.source == source and entry.title and (entry.label or entry.title)


# the modules the registry names; importing backend.models must load none of them
_LAZY_CHECK = """
import sys
import backend.models
from pipelines.catalogues import CATALOGUES
named = {ref.module for c in CATALOGUES.values() for ref in (c.parse, c.coverage)}
assert len(named) == len(CATALOGUES) + 1, named  # one parser module each, one coverage module
loaded = sorted(m for m in named if m in sys.modules)
print(loaded)
"""


def test_importing_the_models_loads_no_catalogue_parser():
    """Every worker, API and test process imports ``backend.models``; the catalogue parsers (and
    their coverage readers) load only when a catalogue is read."""
    out = subprocess.run([sys.executable, "-c", _LAZY_CHECK], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


MY_LIST = '''
"""A test-only catalogue: CSV of start, peak, end (UTC), GOES class and helioprojective x, y
[arcsec]; a file named ``<YYYY>-<MM>.csv`` covers that month."""
import csv
import datetime as dt

from pipelines.catalogues.coverage import FileCoverage
from pipelines.catalogues.records import EventRecord, ParseResult


def _t(text):
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def parse_my_list(path):
    result = ParseResult(source="my_list", path=str(path))
    with open(path, newline="", encoding="utf-8") as fh:
        for i, row in enumerate(csv.DictReader(fh), start=2):
            result.rows_in += 1
            result.events.append(EventRecord(event_type="FL", source="my_list", source_key=row["start"],
                                             start_time=_t(row["start"]), peak_time=_t(row["peak"]),
                                             end_time=_t(row["end"]), goes_class=row["class"],
                                             hpc_x=float(row["x"]), hpc_y=float(row["y"]),
                                             frm_name="my list", frm_version="1"))
    return result.check()


def my_list_coverage(path):
    year, month = (int(x) for x in path.stem.split("-"))
    start = dt.datetime(year, month, 1, tzinfo=dt.UTC)
    end = dt.datetime(year + month // 12, month % 12 + 1, 1, tzinfo=dt.UTC)
    return FileCoverage(path.name, start, end, True, "file name: the month")
'''


def _utc(text):
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def test_a_catalogue_is_one_entry_coverage_exports_and_association_reasons_read_it(db_session, tmp_path,
                                                                                     monkeypatch):
    """One module (named by string, imported on first use) and one registry line: its label in
    the coverage, its observatory and instrument in the CSV and VOTable exports, its
    association label in the reasons of its links."""
    module = "lstdp_test_my_list"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(MY_LIST), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    # the registry line
    monkeypatch.setitem(CATALOGUES, "my_list", Catalogue(
        "my_list", f"{module}:parse_my_list", "my_list", "*.csv", "My flare list (a test)",
        coverage=f"{module}:my_list_coverage", observatory="Test Observatory", instrument="TXI",
        label="My list", association_label="MyL"))
    events = tmp_path / "events"
    (events / "my_list").mkdir(parents=True)
    (events / "my_list" / "2012-03.csv").write_text(ROWS.rsplit("\n", 2)[0] + "\n", encoding="utf-8")
    (r,) = import_all(db_session, events)
    assert (r.source, r.stored) == ("my_list", 2)
    assert module in sys.modules  # imported on first use

    # coverage: the reader's span, under the entry's label
    w = window_coverage(db_session, ["my_list"], _utc("2012-03-05T00:00:00"), _utc("2012-03-09T00:00:00"))
    assert (w["my_list"].status, w["my_list"].message) == ("covered", "My list: covered")
    w = window_coverage(db_session, ["my_list"], _utc("2012-05-01T00:00:00"), _utc("2012-05-09T00:00:00"))
    assert w["my_list"].message == "My list: no coverage after 2012-03-31"
    (rep,) = coverage_report(db_session, _utc("2012-03-01T00:00:00"), _utc("2012-04-01T00:00:00"), names=["my_list"])
    assert (rep.title, [(s.start, s.end) for s in rep.spans]) == (
        "My list", [(_utc("2012-03-01T00:00:00"), _utc("2012-04-01T00:00:00"))])

    # exports: observatory and instrument columns
    rows = list(db_session.scalars(select(Event).where(Event.source == "my_list").order_by(Event.start_time)))
    csv_text = events_csv(rows)
    header, first = csv_text.splitlines()[:2]
    cols = header.split(",")
    values = first.split(",")
    assert (values[cols.index("obs_observatory")], values[cols.index("obs_instrument")]) == ("Test Observatory", "TXI")
    table = parse_single_table(io.BytesIO(events_votable(rows))).to_table()
    assert list(table["obs_observatory"]) == ["Test Observatory"] * 2 and list(table["obs_instrument"]) == ["TXI"] * 2

    # association reasons: an LST detection of the X5.4 flare links to it, naming it by its label
    lst = Event(event_type="FL", source=DETECTED_SOURCE, source_key="lst-x5.4", frm_name="lst-sdi-flare",
                start_time=_utc("2012-03-07T00:05:00"), peak_time=_utc("2012-03-07T00:25:00"),
                end_time=_utc("2012-03-07T00:45:00"), hpc_x=-470.0, hpc_y=395.0, attributes={})
    db_session.add(lst)
    db_session.flush()
    assert associate_events(db_session) >= 1
    ((other, kind, reason),) = associated_events_with_reasons(db_session, lst.id)
    assert (other.id, kind) == (rows[0].id, "same_flare")
    assert reason.startswith("same flare in LST lst-sdi-flare and MyL: peaks 60 s apart"), reason
