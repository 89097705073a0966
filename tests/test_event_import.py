"""Event import service on PostgreSQL (per-test rollback) and, once, on SQLite.

The real catalogues come from ``sample-data/real/events``. The GOES reports shipped there
end in 2014 while the WST flares are of 2022-2023, so the WST-GOES links are tested with a
GOES report written here in the NOAA fixed-width format, its rows taken from the GOES
columns of the WST table (class, peak time, location) plus decoys.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pytest
from sqlalchemy import func, select

from backend.models import Event, EventAssociation
from backend.services.events import (
    SAME_FLARE,
    associated_events,
    get_event,
    import_all,
    import_catalogue,
    link_wst_goes,
    list_events,
)
from pipelines.catalogues import CatalogueError
from tests.conftest import SAMPLE

EVENTS = SAMPLE / "events"
WST_FILE = EVENTS / "aso-s_lst_wst" / "jing2024_wst_whitelight_flares_table2.txt"
HEK_FILE = EVENTS / "hek" / "hek-events_2024-05-10.json"
UTC = dt.UTC


def T(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s).replace(tzinfo=UTC)


def goes_line(ymd: str, start: str, end: str, peak: str, cls: str, loc: str = "", noaa: str = "") -> str:
    """One row of a NOAA GOES XRS report (columns of NGDC's xray.fmt)."""
    letter, value = cls[0], cls[1:]
    cols = [" "] * 85
    def put(col: int, text: str) -> None:  # 1-based column
        cols[col - 1:col - 1 + len(text)] = list(text)
    put(1, "31777" + ymd)
    put(14, start)
    put(19, end)
    put(24, peak)
    put(29, loc)
    put(60, letter)
    put(61, f"{round(float(value) * 10):3d}")
    put(68, "G16 ")
    put(81, noaa.rjust(5))
    return "".join(cols)


@pytest.fixture
def goes_2022(tmp_path):
    """A GOES report for WST flare days: the real flares' GOES rows and decoys."""
    rows = [
        # 07.11.2022 N12E56 M5.2, GOES peak 00:11, WL 00:07-00:13
        goes_line("221107", "0005", "0020", "0011", "M5.2", "N12E56", "3141"),
        # 14.12.2022 S21W48 M4.5, GOES peak 22:06 (1 min before the WL start 22:07, 9 min from its peak)
        goes_line("221214", "2158", "2218", "2206", "M4.5", "S21W48", "3165"),
        # decoy in the WL window (22:07-22:39) but of another class
        goes_line("221214", "2215", "2226", "2220", "C1.2"),
        # decoy far in time
        goes_line("221214", "0300", "0320", "0310", "C3.0"),
        # 16.12.2022 S21W64 M3.5, GOES peak 02:01; WL 01:40..01:54 (end before peak)
        goes_line("221216", "0135", "0210", "0201", "M3.5", "S21W64"),
        # 10.01.2023 S13E71 M5.1 peaks at 00:16; this M5.1 of the day before is 21 min away
        goes_line("230109", "2350", "0005", "2355", "M5.1"),
    ]
    folder = tmp_path / "goes_xrs_reports"
    folder.mkdir()
    f = folder / "goes-xrs-report_2022.txt"
    f.write_text("\r\n".join(rows) + "\r\n\x1a")
    return f


def count(session, source: str) -> int:
    return session.scalar(select(func.count()).select_from(Event).where(Event.source == source))


def by_key(session, source: str, key: str) -> Event:
    return session.scalars(select(Event).where(Event.source == source, Event.source_key == key)).one()


# -- the real catalogues ----------------------------------------------------------------------


@pytest.mark.slow
def test_import_all_real_catalogues_twice_adds_nothing_the_second_time(db_session):
    first = {r.source: r for r in import_all(db_session, EVENTS)}
    assert list(first) == ["lst_wst", "goes_xrs", "cdaw", "hek", "donki", "noaa_srs", "stix"]
    expect = {  # rows in, stored, refused
        "lst_wst": (39, 39, 0), "goes_xrs": (47399, 47100, 299), "cdaw": (22375, 22375, 0),
        "hek": (5, 5, 0), "donki": (3402, 3402, 0), "noaa_srs": (88, 74, 14), "stix": (6429, 6429, 0),
    }
    for src, (rows_in, stored, refused) in expect.items():
        r = first[src]
        assert (r.rows_in, r.stored, len(r.refused), r.skipped_existing) == (rows_in, stored, refused, 0), src
        assert count(db_session, src) == stored
        assert all(why for _, why in r.refused)
    assert len(first["goes_xrs"].files) == 25 and len(first["noaa_srs"].files) == 12
    # the HEK chain's other coronal holes are not in the file: reported, not stored
    assert first["hek"].associations_added == 0 and len(first["hek"].associations_unresolved) == 2
    db_session.commit()

    second = import_all(db_session, EVENTS)
    for r in second:
        assert r.stored == 0 and r.skipped_existing == first[r.source].stored, r.source
        assert len(r.refused) == len(first[r.source].refused)
    assert db_session.scalar(select(func.count()).select_from(Event)) == sum(v[1] for v in expect.values())
    assert db_session.scalar(select(func.count()).select_from(EventAssociation)) == 0

    # values survive the round trip through PostgreSQL
    e = by_key(db_session, "goes_xrs", "2003-10-28T0951/1124/1110/X17.2")
    assert (e.goes_class, e.noaa_ar, e.hgs_lat, e.hgs_lon) == ("X17.2", 10486, -16.0, -8.0)
    assert e.peak_time == T("2003-10-28T11:10") and e.peak_time.tzinfo is not None
    halo = by_key(db_session, "cdaw", "2003-10-28T11:30:05/MPA15")
    assert halo.position_angle is None and halo.angular_width == 360 and halo.attributes["halo"] is True


# -- WST <-> GOES same_flare links --------------------------------------------------------------


def _assert_wst_goes_links(session):
    pairs = {
        "2022-11-07T00:07/N12E56": "2022-11-07T0005/0020/0011/M5.2",
        "2022-12-14T22:07/S21W48": "2022-12-14T2158/2218/2206/M4.5",
        "2022-12-16T01:40/S21W64": "2022-12-16T0135/0210/0201/M3.5",
    }
    for wkey, gkey in pairs.items():
        w, g = by_key(session, "lst_wst", wkey), by_key(session, "goes_xrs", gkey)
        assert [(e.id, k) for e, k in associated_events(session, w.id)] == [(g.id, SAME_FLARE)], wkey
        assert [(e.id, k) for e, k in associated_events(session, g.id)] == [(w.id, SAME_FLARE)], gkey
    # not linked: another day's M5.1 21 min before the WST peak, and the decoys
    w = by_key(session, "lst_wst", "2023-01-10T00:14/S13E71")
    assert associated_events(session, w.id) == []
    for gkey in ("2023-01-09T2350/0005/2355/M5.1", "2022-12-14T2215/2226/2220/C1.2", "2022-12-14T0300/0320/0310/C3.0"):
        assert associated_events(session, by_key(session, "goes_xrs", gkey).id) == []
    assert session.scalar(select(func.count()).select_from(EventAssociation)) == 2 * len(pairs)


def test_wst_flares_linked_to_their_goes_flares_both_ways(db_session, goes_2022):
    wst = import_catalogue(db_session, "lst_wst", WST_FILE)
    assert wst.associations_added == 0  # no GOES flares yet
    goes = import_catalogue(db_session, "goes_xrs", goes_2022)
    assert (goes.rows_in, goes.stored) == (6, 6)
    assert goes.associations_added == 6  # three links, both ways
    _assert_wst_goes_links(db_session)
    # again: nothing new
    assert import_catalogue(db_session, "goes_xrs", goes_2022).associations_added == 0
    assert import_catalogue(db_session, "lst_wst", WST_FILE).associations_added == 0
    assert link_wst_goes(db_session) == 0
    _assert_wst_goes_links(db_session)


def test_wst_goes_links_do_not_depend_on_import_order(db_session, goes_2022):
    import_catalogue(db_session, "goes_xrs", goes_2022)
    assert import_catalogue(db_session, "lst_wst", WST_FILE).associations_added == 6
    _assert_wst_goes_links(db_session)


# -- HEK associations ---------------------------------------------------------------------------


def test_hek_associations_stored_both_ways_when_both_ends_exist(db_session, tmp_path):
    r = import_catalogue(db_session, "hek", HEK_FILE)
    assert r.associations_added == 0 and len(r.associations_unresolved) == 2
    assert all("not stored" in why for _, why in r.associations_unresolved)

    # a second response holding the two neighbouring SPoCA coronal holes of the chain
    doc = json.loads(HEK_FILE.read_text())
    ch = next(e for e in doc["result"] if e["event_type"] == "CH")
    base = "ivo://helio-informatics.org/CH_SPoCA_20240516_"
    neighbours = []
    for ivorn, start, end in ((base + "143017_20240509T204241_0", "2024-05-09T16:42:41", "2024-05-09T20:42:41"),
                              (base + "143508_20240510T054241_0", "2024-05-10T01:42:41", "2024-05-10T05:42:41")):
        n = dict(ch, kb_archivid=ivorn, event_starttime=start, event_endtime=end)
        neighbours.append(n)
    other = tmp_path / "hek-neighbours.json"
    other.write_text(json.dumps({"result": neighbours, "association": doc["association"], "overmax": False}))
    r2 = import_catalogue(db_session, "hek", other)
    assert (r2.stored, r2.associations_added, r2.associations_unresolved) == (2, 4, [])

    middle = by_key(db_session, "hek", base + "143156_20240510T004241_0")
    got = [(e.source_key, k) for e, k in associated_events(db_session, middle.id)]
    assert got == [(base + "143017_20240509T204241_0", "is_preceded_by"),
                   (base + "143508_20240510T054241_0", "is_followed_by")]
    first = by_key(db_session, "hek", base + "143017_20240509T204241_0")
    assert [(e.id, k) for e, k in associated_events(db_session, first.id)] == [(middle.id, "is_followed_by")]
    # re-importing either file adds neither events nor links
    assert import_catalogue(db_session, "hek", HEK_FILE).associations_added == 0
    assert import_catalogue(db_session, "hek", other).stored == 0


# -- queries ------------------------------------------------------------------------------------


@pytest.fixture
def some_events(db_session):
    for src, path in (("lst_wst", WST_FILE), ("hek", HEK_FILE), ("noaa_srs", EVENTS / "noaa_srs"),
                      ("goes_xrs", EVENTS / "goes_xrs_reports" / "goes-xrs-report_2003.txt")):
        import_catalogue(db_session, src, path)
    return db_session


def test_list_events_filters_and_totals(some_events):
    s = some_events
    rows, total = list_events(s, source="lst_wst", limit=10)
    assert total == 39 and len(rows) == 10
    assert [r.start_time for r in rows] == sorted(r.start_time for r in rows)
    page2, total2 = list_events(s, source="lst_wst", limit=10, offset=10)
    assert total2 == 39 and not {r.id for r in rows} & {r.id for r in page2}
    assert list_events(s, source="lst_wst", limit=100, offset=35)[0].__len__() == 4

    # by type: FL from three sources; AR from the SRS; CE and CH from HEK
    assert list_events(s, event_type="FL")[1] == 39 + 3 + 2394
    assert list_events(s, event_type="AR")[1] == 74
    assert list_events(s, event_type="CE")[1] == 1 and list_events(s, event_type="CH")[1] == 1
    assert list_events(s, event_type="FL", source="hek")[1] == 3

    # by LST channel
    assert list_events(s, channel="WST")[1] == 39
    assert list_events(s, channel="SDI")[1] == 0

    # time overlap: [01:45, 01:46] on 2022-12-16 hits the WST flare 01:40-01:48 only
    rows, total = list_events(s, start=T("2022-12-16T01:45"), end=T("2022-12-16T01:46"))
    assert total == 1 and rows[0].source_key == "2022-12-16T01:40/S21W64"
    # an open-ended range: everything from 2024 on is the 5 HEK events
    assert list_events(s, start=T("2024-01-01"))[1] == 5
    # the CH of 2024-05-09 20:42 - 2024-05-10 00:42 overlaps a window ending before its end
    rows, _ = list_events(s, event_type="CH", start=T("2024-05-09T23:00"), end=T("2024-05-09T23:30"))
    assert len(rows) == 1
    # an event without end time (the CME) counts from its start only: 07:12:07 .. 08:48:07 given
    assert list_events(s, event_type="CE", start=T("2024-05-10T08:50"))[1] == 0
    # active regions last the day the SRS locations are valid for
    rows, total = list_events(s, event_type="AR", start=T("2015-01-01T12:00"), end=T("2015-01-01T13:00"))
    assert total == 8 and {r.noaa_ar for r in rows} >= {12246, 12253}
    # a GOES flare crossing midnight is found from the next day
    rows, total = list_events(s, source="goes_xrs", start=T("2003-10-29T00:00"), end=T("2003-10-29T00:00"))
    assert total == 0 or all(r.start_time < T("2003-10-29") for r in rows)


def test_get_event(some_events):
    s = some_events
    e = by_key(s, "hek", "ivo://helio-informatics.org/FL_SWPC_20240510_065326_20240510001000")
    got = get_event(s, e.id)
    assert got is e and got.goes_class == "M1.3" and got.noaa_ar == 13664
    assert get_event(s, 2_000_000_000) is None


def test_concurrent_writers_do_not_fail_each_other(db_session, monkeypatch):
    """Rows stored by another process between our key preload and our insert are skipped."""
    from backend.services import events as svc
    from pipelines.catalogues import parse_lst_wst

    rows = [dict(e.as_row(), created_at=T("2026-01-01")) for e in parse_lst_wst(WST_FILE).events[:5]]
    svc.insert_ignoring_conflicts(db_session, Event.__table__, rows, ["source", "source_key"])
    svc.insert_ignoring_conflicts(db_session, Event.__table__, rows, ["source", "source_key"])
    assert count(db_session, "lst_wst") == 5
    # the preload sees nothing (as if the other process committed right after it)
    real_scalars = db_session.scalars

    def blind_preload(stmt, *a, **kw):
        if "events.source_key" in str(stmt) and "count" not in str(stmt):
            return iter(())
        return real_scalars(stmt, *a, **kw)

    monkeypatch.setattr(db_session, "scalars", blind_preload)
    r = import_catalogue(db_session, "lst_wst", WST_FILE)
    assert (r.stored, r.skipped_existing, r.refused) == (34, 5, [])
    assert count(db_session, "lst_wst") == 39


def test_import_errors(db_session, tmp_path):
    with pytest.raises(KeyError):
        import_catalogue(db_session, "cactus", EVENTS)
    with pytest.raises(CatalogueError):
        import_all(db_session, tmp_path)  # no catalogue folder in it
    with pytest.raises(CatalogueError):
        import_all(db_session, tmp_path / "missing")


# -- the embedded mode (SQLite) -------------------------------------------------------------------


def test_import_on_sqlite_is_idempotent_and_links(sqlite_env, goes_2022, tmp_path):
    from backend.db import session_scope

    events = tmp_path / "events"
    shutil.copytree(EVENTS / "aso-s_lst_wst", events / "aso-s_lst_wst")
    shutil.copytree(EVENTS / "hek", events / "hek")
    shutil.copytree(goes_2022.parent, events / "goes_xrs_reports")
    with session_scope() as s:
        first = {r.source: r for r in import_all(s, events)}
    assert {k: v.stored for k, v in first.items()} == {"lst_wst": 39, "goes_xrs": 6, "hek": 5}
    with session_scope() as s:
        second = import_all(s, events)
        assert [r.stored for r in second] == [0, 0, 0]
        _assert_wst_goes_links(s)
        rows, total = list_events(s, start=T("2022-12-16T01:45"), end=T("2022-12-16T01:46"), channel="WST")
        assert total == 1 and rows[0].source_key == "2022-12-16T01:40/S21W64"
