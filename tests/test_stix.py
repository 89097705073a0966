"""Solar Orbiter/STIX flare list (Hayes et al.): parser on the real file, import, associations.

The expected values are read from the CSV here with the csv module, independently of the
parser (which also uses csv, but the conversions checked - light-time shift, Earth view,
refusals - are the parser's own).
"""

from __future__ import annotations

import csv
import datetime as dt
import math

import pytest
from sqlalchemy import func, select

from backend.models import Event
from backend.services.event_formats import observation
from backend.services.events import SAME_FLARE, associate_events, associated_events, import_all, import_catalogue
from pipelines.catalogues import CATALOGUES, CatalogueError, parse_catalogue, parse_stix
from pipelines.catalogues.stix import COVERAGE, GOES_CLASS_NOTE, PEAK_UNIT
from tests.conftest import SAMPLE
from tests.test_event_import import goes_2022, goes_line  # noqa: F401  (fixture)

EVENTS = SAMPLE / "events"
STIX_FILE = EVENTS / "stix" / "STIX_flarelist_w_locations_20210214_20230430_version1.csv"
WST_FILE = EVENTS / "aso-s_lst_wst" / "jing2024_wst_whitelight_flares_table2.txt"
UTC = dt.UTC


def csv_rows() -> list[dict]:
    with STIX_FILE.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def utc(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC)


@pytest.fixture(scope="module")
def parsed():
    return parse_stix(STIX_FILE)


def test_real_list_every_row_an_earth_time_flare(parsed):
    rows = csv_rows()
    assert len(rows) == 6429
    assert (parsed.rows_in, len(parsed.events), len(parsed.refused)) == (6429, 6429, 0)
    by_key = {e.source_key: e for e in parsed.events}
    assert set(by_key) == {r["flare_id"] for r in rows}
    for r in rows:
        e = by_key[r["flare_id"]]
        shift = dt.timedelta(seconds=float(r["light_travel_time"]))
        assert (e.start_time, e.peak_time, e.end_time) == (
            utc(r["start_UTC"]) + shift, utc(r["peak_UTC"]) + shift, utc(r["end_UTC"]) + shift)
        assert e.event_type == "FL" and e.source == "stix" and e.goes_class is None
        assert e.peak_value == float(r["4-10 keV"]) and e.peak_unit == PEAK_UNIT
        if r["visible_from_earth"] == "True":
            assert (e.hpc_x, e.hpc_y) == (float(r["hpc_x_earth"]), float(r["hpc_y_earth"]))
            assert not e.flags
        else:
            assert r["hpc_x_earth"] == "" and e.hpc_x is None and e.hpc_y is None
            assert e.flags == ["not_visible_from_earth"]
        assert (e.attributes["hpc_x_solo"], e.attributes["hpc_y_solo"]) == (float(r["hpc_x_solo"]),
                                                                           float(r["hpc_y_solo"]))
    # the period the list says it covers (file name) is the period of its rows
    first = min(utc(r["start_UTC"]) for r in rows).date()
    last = max(utc(r["end_UTC"]) for r in rows).date()
    assert COVERAGE == (first, last) == (dt.date(2021, 2, 14), dt.date(2023, 4, 30))


def test_a_known_flare_of_the_lst_era_day(parsed):
    """The C4.9 of 2023-01-31 (the demo's WST frame day), field by field."""
    (r,) = [r for r in csv_rows() if r["flare_id"] == "2301311057"]
    (e,) = [e for e in parsed.events if e.source_key == "2301311057"]
    assert r["peak_UTC"] == "2023-01-31T10:57:51.840" and r["light_travel_time"] == "34.243645"
    assert e.peak_time == dt.datetime(2023, 1, 31, 10, 58, 26, 83645, tzinfo=UTC)  # 10:57:51.840 + 34.243645 s
    assert e.attributes["peak_utc_solo"] == dt.datetime(2023, 1, 31, 10, 57, 51, 840000, tzinfo=UTC)
    assert (e.hpc_x, e.hpc_y) == (float(r["hpc_x_earth"]), float(r["hpc_y_earth"]))
    assert math.hypot(e.hpc_x, e.hpc_y) < 960  # on the disk seen from Earth
    assert (e.hgs_lat, e.hgs_lon) == (float(r["hgs_lat"]), float(r["hgs_lon"]))
    assert e.attributes["counts"]["25-50 keV"] == float(r["25-50 keV"])
    assert e.attributes["goes_xrs_class_at_flare_time"] == r["GOES_class_time_of_flare"] == "C4.9"
    assert e.attributes["goes_class_note"] == GOES_CLASS_NOTE and "not a GOES flare class" in e.description
    assert (e.frm_name, e.frm_version, e.channels) == ("STIX flare list (Hayes et al.)", "1", "4-10 keV")
    day = [x for x in parsed.events if x.attributes["start_utc_solo"].date() == dt.date(2023, 1, 31)]
    assert len(day) == 3


HEADER = ("start_UTC,end_UTC,peak_UTC,4-10 keV,10-15 keV,15-25 keV,25-50 keV,50-84 keV,att_in,bkg 4-10 keV,"
          "bkg 10-15 keV,bkg 15-25 keV,bkg 25-50 keV,bkg 50-84 keV,bkg_baseline_4-10 keV,hpc_x_solo,hpc_y_solo,"
          "hpc_x_earth,hpc_y_earth,visible_from_earth,hgs_lon,hgs_lat,hgc_lon,hgc_lat,solo_position_lat,"
          "solo_position_lon,solo_position_AU_distance,light_travel_time,file_request_id_used,"
          "GOES_class_time_of_flare,GOES_flux_time_of_flare,flare_id")


def test_malformed_rows_refused_with_reasons(tmp_path):
    lines = STIX_FILE.read_text(encoding="utf-8").splitlines()
    assert lines[0] == HEADER
    good = next(line for line in lines[1:] if line.endswith(",2301311057"))
    f = good.split(",")

    def variant(**cols) -> str:
        g = list(f)
        for name, value in cols.items():
            g[HEADER.split(",").index(name)] = value
        return ",".join(g)

    bad = [
        variant(end_UTC="2023-01-31T10:00:00.000", flare_id="1"),  # end before start
        variant(peak_UTC="2023-01-31T25:61:00.000", flare_id="2"),
        variant(**{"4-10 keV": "many"}, flare_id="3"),
        variant(hpc_x_earth="", flare_id="4"),  # said visible, no Earth position
        variant(visible_from_earth="maybe", flare_id="5"),
        variant(flare_id=""),
        ",".join(f[:10]),  # short row
        good,  # the flare id again
    ]
    p = tmp_path / "stix" / "STIX_flarelist_test.csv"
    p.parent.mkdir()
    p.write_text("\n".join([HEADER, good, *bad]) + "\n", encoding="utf-8")
    r = parse_catalogue("stix", tmp_path)
    assert (r.rows_in, len(r.events), len(r.refused)) == (9, 1, 8)
    why = dict(r.refused)
    assert "end_UTC 2023-01-31T10:00:00 before start_UTC" in why["STIX_flarelist_test.csv:3"]
    assert "unreadable peak_UTC" in why["STIX_flarelist_test.csv:4"]
    assert "4-10 keV 'many' is not a number" in why["STIX_flarelist_test.csv:5"]
    assert "visible_from_earth is True but hpc_x_earth" in why["STIX_flarelist_test.csv:6"]
    assert "is not True/False" in why["STIX_flarelist_test.csv:7"]
    assert why["STIX_flarelist_test.csv:8"] == "no flare_id"
    assert "fewer than the 32 columns" in why["STIX_flarelist_test.csv:9"]
    assert why["STIX_flarelist_test.csv:10"] == "repeats STIX_flarelist_test.csv:2 verbatim"

    other = tmp_path / "not_stix.csv"
    other.write_text("a,b,c\n1,2,3\n", encoding="utf-8")
    with pytest.raises(CatalogueError, match="not a STIX flare list: no column"):
        parse_stix(other)


def test_registered_and_found_in_the_events_folder():
    assert CATALOGUES["stix"].folder == "stix" and CATALOGUES["stix"].parse.resolve() is parse_stix
    assert parse_catalogue("stix", EVENTS).rows_in == 6429


def test_import_is_idempotent_and_names_solar_orbiter_stix(db_session):
    first = import_catalogue(db_session, "stix", STIX_FILE)
    assert (first.rows_in, first.stored, len(first.refused), first.skipped_existing) == (6429, 6429, 0, 0)
    db_session.commit()
    again = import_catalogue(db_session, "stix", EVENTS)
    assert (again.stored, again.skipped_existing) == (0, 6429)
    n = db_session.scalar(select(func.count()).select_from(Event).where(Event.source == "stix"))
    assert n == 6429
    e = db_session.scalars(select(Event).where(Event.source == "stix", Event.source_key == "2301311057")).one()
    assert observation(e) == ("Solar Orbiter", "STIX", "4-10 keV")
    assert e.goes_class is None and e.goes_flux is None  # not matched by min_goes_class
    assert e.attributes["visible_from_earth"] is True and e.peak_time.tzinfo is not None


def test_wst_and_goes_flares_linked_to_stix_but_not_to_flares_hidden_from_earth(db_session, goes_2022):  # noqa: F811
    s = db_session
    import_catalogue(s, "lst_wst", WST_FILE)
    import_catalogue(s, "goes_xrs", goes_2022)
    import_catalogue(s, "stix", STIX_FILE)
    associate_events(s, start=dt.datetime(2022, 11, 1, tzinfo=UTC), end=dt.datetime(2023, 5, 31, tzinfo=UTC))

    def one(source, key):
        return s.scalars(select(Event).where(Event.source == source, Event.source_key == key)).one()

    def stix_links(e):
        return {(o.source_key, k) for o, k in associated_events(s, e.id) if o.source == "stix"}

    # X1.0 of 2023-01-10 (WST 22:46-23:00, N22E62) and STIX flare 2301102246, 7 arcsec apart
    assert stix_links(one("lst_wst", "2023-01-10T22:46/N22E62")) == {("2301102246", SAME_FLARE)}
    stix = one("stix", "2301102246")
    assert any(o.source == "lst_wst" and k == SAME_FLARE for o, k in associated_events(s, stix.id))
    # M1.8 of 2023-04-27 (S22E05 from Earth): the only STIX flare then was behind the limb for Earth
    hidden = one("stix", "2304271119")
    assert hidden.attributes["visible_from_earth"] is False and hidden.hpc_x is None
    assert stix_links(one("lst_wst", "2023-04-27T11:13/S22E05")) == set()
    assert associated_events(s, hidden.id) == []
    # a GOES report row with a location (M4.5 S21W48, 2022-12-14) and STIX 2212142205
    goes = one("goes_xrs", next(k for k in s.scalars(select(Event.source_key).where(Event.source == "goes_xrs"))
                                if "M4.5" in k))
    assert ("2212142205", SAME_FLARE) in stix_links(goes)
    assert associate_events(s) == 0  # idempotent


def test_import_all_imports_the_stix_folder(db_session, tmp_path):
    import shutil

    shutil.copytree(EVENTS / "stix", tmp_path / "stix")
    (r,) = import_all(db_session, tmp_path)
    assert (r.source, r.stored, r.files) == ("stix", 6429, [str(tmp_path / "stix" / STIX_FILE.name)])


def test_the_demo_wst_frame_day_is_an_observing_window_with_three_stix_flares(db_session):
    """Demo coherence: the WST frame of 2023-01-31 03:39:23 (from the HMI JPEG 2000) now meets events."""
    from backend.services.observing_windows import observing_windows
    from tests.test_api import make_frame

    make_frame(db_session, "WST", dt.datetime(2023, 1, 31, 3, 39, 23, tzinfo=UTC))
    import_catalogue(db_session, "stix", STIX_FILE)
    import_catalogue(db_session, "lst_wst", WST_FILE)
    (w,) = [w for w in observing_windows(db_session) if w.day == dt.date(2023, 1, 31)]
    assert w.frames == {"WST": 1} and w.events == {"stix": 3}


def _shifted(line: str, days: int) -> str:
    """A real row moved ``days`` later, with the flare id of its new peak (YYMMDDHHMM)."""
    cols = line.split(",")
    names = HEADER.split(",")
    for c in ("start_UTC", "end_UTC", "peak_UTC"):
        i = names.index(c)
        cols[i] = (utc(cols[i]) + dt.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    cols[names.index("flare_id")] = utc(cols[names.index("peak_UTC")]).strftime("%y%m%d%H%M")
    return ",".join(cols)


def test_a_newer_list_adds_only_its_new_flares(db_session, tmp_path):
    """Newer versions of the list keep its columns and add rows: an older cut of the real file,
    then the real file, then a newer copy with two more flares (real rows of April 2023 moved
    30 days on, into May 2023) add only what is new each time; every row is counted."""
    from backend.models import CatalogueCoverage

    header, *rows = STIX_FILE.read_text(encoding="utf-8").splitlines()
    starts = [r.split(",")[0] for r in rows]
    old_rows = [r for r, s in zip(rows, starts) if s < "2023-04-01"]
    assert 0 < len(old_rows) < len(rows)
    older = tmp_path / "v0" / "STIX_flarelist_w_locations_20210214_20230331_version1.csv"
    newer = tmp_path / "v2" / "STIX_flarelist_w_locations_20210214_20230530_version1.csv"
    added = [_shifted(rows[-1], 30), _shifted(rows[-2], 30)]
    for path, body in ((older, old_rows), (newer, rows + added)):
        path.parent.mkdir()
        path.write_text("\n".join([header, *body]) + "\n", encoding="utf-8")

    first = import_catalogue(db_session, "stix", older)
    assert (first.rows_in, first.stored, first.skipped_existing, len(first.refused)) == (len(old_rows),) * 2 + (0, 0)
    real = import_catalogue(db_session, "stix", STIX_FILE)
    assert (real.rows_in, real.stored, real.skipped_existing) == (6429, 6429 - len(old_rows), len(old_rows))
    new = import_catalogue(db_session, "stix", newer.parent)
    assert (new.rows_in, new.stored, new.skipped_existing, len(new.refused)) == (6431, 2, 6429, 0)
    assert new.lines()[0].split() == ["stix", "rows", "in", "6431", "stored", "2", "already", "there", "6429",
                                      "refused", "0"]
    stored = set(db_session.scalars(select(Event.source_key).where(Event.source == "stix")))
    assert len(stored) == 6431 and {a.split(",")[-1] for a in added} <= stored
    again = import_catalogue(db_session, "stix", newer)
    assert (again.stored, again.skipped_existing) == (0, 6431)
    # each version's own period is recorded (file names), the newest reaching 2023-05-30
    ends = {c.file: c.covers_end for c in db_session.scalars(select(CatalogueCoverage)
                                                             .where(CatalogueCoverage.source == "stix"))}
    assert ends[newer.name].date() == dt.date(2023, 5, 31) and ends[older.name].date() == dt.date(2023, 4, 1)
