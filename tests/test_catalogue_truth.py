"""Truthful catalogue import: what the importer reads, refuses, repairs and reports.

Fixtures are the real sample catalogues (``sample-data/real/events``) or small files
written here in the catalogues' own formats from realistic rows (the M1.3/M1.5 flare of
2024-05-10 in NOAA AR 13664, SRS rows of June 2002 when the region numbers passed 9999).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import types
import warnings

import pytest
from sqlalchemy import select

from backend.models import Event
from backend.services.event_search import EventFilters, search_events
from backend.services.events import SAME_FLARE, associate_events, associated_events, import_all, import_catalogue
from pipelines.catalogues import CatalogueError, full_noaa_number, parse_catalogue, parse_hek, parse_noaa_srs
from pipelines.catalogues.goes_xrs import parse_goes_xrs
from pipelines.catalogues.records import goes_class_to_flux, goes_flux_or_none
from pipelines.detect.associate import same_flare
from pipelines.errors import CatalogueWarning, LSTDPWarning
from tests.conftest import SAMPLE
from tests.test_event_import import goes_line

EVENTS = SAMPLE / "events"
HEK_FILE = EVENTS / "hek" / "hek-events_2024-05-10.json"
UTC = dt.UTC


def T(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s).replace(tzinfo=UTC)


def hek_doc() -> dict:
    return json.loads(HEK_FILE.read_text(encoding="utf-8"))


def by_key(session, source, key):
    return session.scalars(select(Event).where(Event.source == source, Event.source_key == key)).one()


# -- 8. HEK JSON that is not UTF-8 --------------------------------------------------------------


def _hek_with_lone_c5(tmp_path):
    """The real response with a lone 0xC5 byte (Latin-1 'Å', as in 'Ångström') in a free-text
    field of the CACTus CME: the way real HEK answers carry it."""
    doc = hek_doc()
    for e in doc["result"]:
        if e["event_type"] == "CE":
            e["event_description"] = "CME seen in LASCO C2, speed from height-time fit (PLACEHOLDER A)"
    raw = json.dumps(doc, ensure_ascii=False).encode("utf-8").replace(b"PLACEHOLDER A", b"\xc5ngstr\xf6m")
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    p = tmp_path / "hek" / "hek-latin1.json"
    p.parent.mkdir(parents=True)
    p.write_bytes(raw)
    return p


def test_hek_not_utf8_is_decoded_with_a_warning_and_every_event_kept(tmp_path):
    p = _hek_with_lone_c5(tmp_path)
    with pytest.warns(CatalogueWarning, match=r"0xC5.*Latin-1"):
        r = parse_hek(p)
    assert issubclass(CatalogueWarning, LSTDPWarning)
    assert (r.rows_in, len(r.events), r.refused) == (5, 5, [])
    cme = next(e for e in r.events if e.event_type == "CE")
    assert "Ångström" in cme.attributes["event_description"]
    assert r.repairs and "Latin-1" in r.repairs[0]


def test_hek_not_utf8_does_not_roll_back_the_other_catalogues(db_session, tmp_path):
    _hek_with_lone_c5(tmp_path)
    shutil.copytree(EVENTS / "aso-s_lst_wst", tmp_path / "aso-s_lst_wst")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CatalogueWarning)
        run = {r.source: r for r in import_all(db_session, tmp_path)}
    assert (run["hek"].stored, run["hek"].error) == (5, None)
    assert run["lst_wst"].stored == 39
    assert any("Latin-1" in line for line in run["hek"].lines())


# -- 9. one transaction per catalogue, skipped folders named, refusals shown ------------------------


def test_bad_catalogue_is_reported_and_the_others_stored(db_session, tmp_path):
    shutil.copytree(EVENTS / "hek", tmp_path / "hek")
    (tmp_path / "donki").mkdir()
    (tmp_path / "donki" / "cmes.json").write_text('{"activityID": ', encoding="utf-8")  # cut short
    (tmp_path / "cactus").mkdir()
    (tmp_path / "cactus" / "cmecat.txt").write_text("# CACTus\n", encoding="utf-8")
    run = import_all(db_session, tmp_path)
    reports = {r.source: r for r in run}
    assert reports["hek"].stored == 5 and reports["hek"].error is None
    assert reports["donki"].error and reports["donki"].stored == 0
    assert [r.source for r in run.failed] == ["donki"]
    assert ("cactus/", "no parser for this catalogue") in run.skipped
    lines = run.lines()
    assert "skipped cactus/: no parser for this catalogue" in lines
    assert any(line.startswith("donki") and "FAILED" in line for line in lines)
    db_session.expire_all()
    assert len(db_session.scalars(select(Event).where(Event.source == "hek")).all()) == 5


def test_file_with_every_row_refused_is_an_error(db_session, tmp_path):
    srs = tmp_path / "noaa_srs" / "20020624SRS.txt"
    srs.parent.mkdir()
    srs.write_text(
        ":Product: 20020624SRS.txt\n:Issued: 2002 Jun 24 0030 UTC\n"
        "I.  Regions with Sunspots.  Locations Valid at 23/2400Z\n"
        "Nmbr Location  Lo  Area  Z   LL   NN Mag Type\nNONE\n"
        "II. Regions Due to Return 24 Jun to 26 Jun\nNmbr Lat    Lo\n9987 S15    144\n9993 N06    149\n",
        encoding="ascii",
    )
    with pytest.raises(CatalogueError, match=r"every one of the 2 rows of 20020624SRS.txt.*2 x section II"):
        parse_catalogue("noaa_srs", srs)
    shutil.copytree(EVENTS / "hek", tmp_path / "hek")
    run = {r.source: r for r in import_all(db_session, tmp_path)}
    assert "every one of the 2 rows" in run["noaa_srs"].error
    assert run["hek"].stored == 5


def test_report_lines_show_a_sample_of_refusal_reasons_with_counts(db_session):
    r = import_catalogue(db_session, "noaa_srs", EVENTS / "noaa_srs")
    assert len(r.refused) == 14
    sample = r.refusal_sample()
    assert sample[0][1] == sum(1 for _, why in r.refused if why.startswith("section II"))
    assert sum(n for _, n, _ in sample) <= len(r.refused)
    lines = r.lines()
    assert any("refused" in line and " x section II" in line and "e.g. " in line for line in lines[1:])


# -- 10. NOAA region numbers and the same flare across sources --------------------------------------


def test_srs_region_0000_after_june_2002_is_region_10000(tmp_path):
    assert full_noaa_number(0, T("2002-06-24T00:00")) == 10000
    assert full_noaa_number(0, T("1996-01-06T00:00")) is None
    assert full_noaa_number(3664, T("2024-05-10T00:00")) == full_noaa_number(13664, T("2024-05-10T00:00")) == 13664
    srs = tmp_path / "20020616SRS.txt"
    srs.write_text(
        ":Product: 20020616SRS.txt\n:Issued: 2002 Jun 16 0030 UTC\n"
        "I.  Regions with Sunspots.  Locations Valid at 15/2400Z\n"
        "Nmbr Location  Lo  Area  Z   LL   NN Mag Type\n"
        "9999 S05W30   123  0090 Dso  05   06 Beta\n"
        "0000 N15E10   083  0040 Cro  04   03 Beta\n"
        "0001 S20E45   048  0010 Axx  01   01 Alpha\n",
        encoding="ascii",
    )
    r = parse_noaa_srs(srs)
    assert [e.noaa_ar for e in r.events] == [9999, 10000, 10001]
    assert r.events[1].source_key == "2002-06-16/10000"


def test_same_flare_compares_full_region_numbers():
    def row(**kw):
        base = dict(start_time=T("2024-05-10T00:10"), peak_time=T("2024-05-10T00:14"),
                    end_time=T("2024-05-10T00:22"), hpc_x=None, hpc_y=None, noaa_ar=None)
        base.update(kw)
        return types.SimpleNamespace(**base)

    swpc = row(noaa_ar=13664)
    ssw = row(peak_time=T("2024-05-10T00:18"), noaa_ar=3664)
    assert same_flare(swpc, ssw, require_place=True)
    assert not same_flare(swpc, row(noaa_ar=3663), require_place=True)
    assert not same_flare(swpc, row(noaa_ar=None), require_place=True)  # no place to compare
    assert not same_flare(swpc, row(noaa_ar=3664, start_time=T("2024-05-10T03:00"),
                                    peak_time=T("2024-05-10T03:05"), end_time=T("2024-05-10T03:10")))


def test_hek_swpc_and_ssw_latest_events_flare_are_associated_with_the_goes_report(db_session, tmp_path):
    # the M1.3 (SWPC, region 13664, no position) and M1.5 (SSW Latest Events, region 3664 at
    # S17W33) of 2024-05-10 00:10 in the real HEK response, plus the NOAA report of that flare
    goes = tmp_path / "goes_xrs_reports" / "goes-xrs-report_2024.txt"
    goes.parent.mkdir()
    goes.write_text(goes_line("240510", "0010", "0022", "0014", "M1.3", "S17W33", "3664") + "\n"
                    + goes_line("240510", "0610", "0630", "0620", "C2.0", "N20E40", "3666") + "\n",
                    encoding="ascii")
    shutil.copytree(EVENTS / "hek", tmp_path / "hek")
    import_all(db_session, tmp_path)
    associate_events(db_session)
    swpc = by_key(db_session, "hek", "ivo://helio-informatics.org/FL_SWPC_20240510_065326_20240510001000")
    ssw = by_key(db_session, "hek", "ivo://helio-informatics.org/FL_SSWLatestEvents_gev_20240510_0010")
    report = by_key(db_session, "goes_xrs", "2024-05-10T0010/0022/0014/M1.3")
    assert swpc.noaa_ar == ssw.noaa_ar == report.noaa_ar == 13664
    linked = {e.id: k for e, k in associated_events(db_session, swpc.id)}
    assert linked.get(ssw.id) == SAME_FLARE and linked.get(report.id) == SAME_FLARE
    other = by_key(db_session, "goes_xrs", "2024-05-10T0610/0630/0620/C2.0")
    assert associated_events(db_session, other.id) == []
    assert associate_events(db_session) == 0  # idempotent


# -- 11. GOES values the instrument cannot report -----------------------------------------------------


@pytest.mark.parametrize("cls", ["M0.0", "C0.0", "B0.6", "M10.0", "C12.5", "X0.5", "A0.0"])
def test_impossible_goes_classes_have_no_flux(cls):
    with pytest.raises(ValueError, match="GOES class"):
        goes_class_to_flux(cls)
    assert goes_flux_or_none(cls) is None


def test_possible_goes_classes_keep_their_flux():
    assert goes_flux_or_none("X28") == pytest.approx(2.8e-3)  # X is open-ended
    assert goes_flux_or_none("M9.9") == pytest.approx(9.9e-5)
    assert goes_flux_or_none("A0.6") == pytest.approx(6e-9)  # below A1: sub-A flux, as sunpy writes it


def test_goes_report_impossible_class_and_hek_fill_flux_are_flagged_and_not_filtered(db_session, tmp_path):
    goes = tmp_path / "goes_xrs_reports" / "goes-xrs-report_2012.txt"
    goes.parent.mkdir()
    goes.write_text("\n".join([
        goes_line("120307", "0002", "0040", "0024", "X5.4", "N17E27", "1429"),
        goes_line("120308", "1000", "1030", "1015", "M12.0", "N17E15", "1429"),  # M12.0: no such class
        goes_line("120309", "0322", "0418", "0353", "M0.0", "N15W03", "1429"),
    ]) + "\n", encoding="ascii")
    r = parse_goes_xrs(goes)
    m12, m0 = r.events[1], r.events[2]
    assert (m12.goes_class, m12.peak_value) == (None, None)
    assert "xray_class_impossible:M12.0" in m12.flags and "xray_class_impossible:M0.0" in m0.flags
    hek = hek_doc()
    swpc = next(e for e in hek["result"] if e["frm_name"] == "SWPC")
    swpc.update(fl_goescls="M0.0", fl_peakflux=-9999, fl_peakfluxunit="W/m^2")
    fd = next(e for e in hek["result"] if e["frm_name"].startswith("Flare Detective"))
    fd.update(fl_peakflux=0.0, fl_peakfluxunit="DN/s")
    (tmp_path / "hek").mkdir()
    (tmp_path / "hek" / "hek.json").write_text(json.dumps(hek), encoding="utf-8")
    import_all(db_session, tmp_path)
    e = by_key(db_session, "hek", swpc["kb_archivid"])
    assert (e.goes_class, e.goes_flux, e.peak_value) == (None, None, None)
    assert "goes_class_impossible:M0.0" in e.attributes["flags"] and "peak_flux_fill:-9999" in e.attributes["flags"]
    assert by_key(db_session, "hek", fd["kb_archivid"]).peak_value is None
    stored = by_key(db_session, "goes_xrs", "2012-03-08T1000/1030/1015/-")
    assert (stored.goes_class, stored.goes_flux) == (None, None)
    page = search_events(db_session, EventFilters(min_goes_flux=1e-9), limit=100)
    keys = {x.source_key for x in page.items}
    assert "2012-03-07T0002/0040/0024/X5.4" in keys
    assert not keys & {"2012-03-08T1000/1030/1015/-", "2012-03-09T0322/0418/0353/-", swpc["kb_archivid"]}
    x1 = search_events(db_session, EventFilters(min_goes_flux=1e-4), limit=100)
    assert {x.source_key for x in x1.items} == {"2012-03-07T0002/0040/0024/X5.4"}


# -- 12. a truncated HEK response ---------------------------------------------------------------------


def test_hek_overmax_is_reported_as_truncated(db_session, tmp_path):
    doc = hek_doc()
    doc["overmax"] = True
    (tmp_path / "hek").mkdir()
    (tmp_path / "hek" / "hek.json").write_text(json.dumps(doc), encoding="utf-8")
    assert parse_hek(tmp_path / "hek" / "hek.json").truncated
    assert not parse_hek(HEK_FILE).truncated  # the real file says overmax: false
    (r,) = import_all(db_session, tmp_path)
    assert r.stored == 5 and len(r.truncated) == 1 and "overmax" in r.truncated[0]
    assert any("TRUNCATED" in line and "overmax" in line for line in r.lines())


# -- the CLI prints what the report says ------------------------------------------------------------


def test_cli_import_events_names_skipped_folders_failures_refusals_and_truncation(sqlite_env, tmp_path, capsys):
    from backend.cli import main

    doc = hek_doc()
    doc["overmax"] = True
    (tmp_path / "hek").mkdir()
    (tmp_path / "hek" / "hek.json").write_text(json.dumps(doc), encoding="utf-8")
    shutil.copytree(EVENTS / "noaa_srs", tmp_path / "noaa_srs")
    (tmp_path / "cdaw").mkdir()
    (tmp_path / "cdaw" / "univ_all.txt").write_text("not a CDAW table\nat all\n", encoding="ascii")
    (tmp_path / "cactus").mkdir()
    rc = main(["import-events", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1  # a catalogue failed
    assert "skipped cactus/: no parser for this catalogue" in out
    assert any(line.startswith("cdaw") and "FAILED" in line for line in out)
    assert any(line.startswith("hek") and "stored      5" in line for line in out)
    assert any("TRUNCATED" in line and "overmax" in line for line in out)
    assert any("refused" in line and " x section II" in line for line in out)
    # the import leaves the planner's statistics of the events (issue 25: SQLite had none)
    import sqlite3

    from backend.settings import get_settings

    db = sqlite3.connect(get_settings().sqlalchemy_url.removeprefix("sqlite:///"))
    try:
        assert db.execute("SELECT count(*) FROM sqlite_stat1 WHERE tbl = 'events'").fetchone()[0] > 0
    finally:
        db.close()
