"""The HEK-compatible search (``GET /api/v1/hek``) against sunpy's own HEK client.

sunpy's ``sunpy.net.hek.HEKClient(url=<live server>/api/v1/hek?)`` (unchanged: it appends
HEK's urlencoded query to ``url`` and pages while ``overmax`` is true) queries a uvicorn
server of ours in a thread (``tests/test_browser.served_app``) on a temporary SQLite
database holding the real catalogues of ``sample-data`` (the NOAA GOES XRS report of 2012,
the CDAW LASCO CME list, the STIX flare list, a real HEK answer of 2024-05-10). The answers
are compared with what our own ``GET /api/v1/events`` returns for the same question, and,
for the real HEK rows, with sunpy's reading of the HEK answer itself.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import urllib.parse
from pathlib import Path

import astropy.units as u
import httpx
import pytest
from astropy.table import Table

from backend.db import session_scope
from backend.services.events import import_catalogue
from tests.conftest import SAMPLE, filled_sqlite, use_sqlite_copy
from tests.test_browser import served_app

EVENTS = SAMPLE / "events"
HEK_FILE = EVENTS / "hek" / "hek-events_2024-05-10.json"
GOES_2012 = EVENTS / "goes_xrs_reports" / "goes-xrs-report_2012.txt"

hek = pytest.importorskip("sunpy.net.hek")
from sunpy.coordinates import Helioprojective  # noqa: E402
from sunpy.net import attrs as a  # noqa: E402


def _import_catalogues(session) -> None:
    """The real catalogues (GOES XRS 2012, CDAW, STIX, the HEK sample), imported once per test
    run (``filled_sqlite``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(GOES_2012, Path(tmp) / GOES_2012.name)
        for source, path in (("goes_xrs", Path(tmp) / GOES_2012.name), ("cdaw", EVENTS / "cdaw"),
                             ("stix", EVENTS / "stix"), ("hek", HEK_FILE)):
            assert import_catalogue(session, source, path).stored > 0


@pytest.fixture
def served(sqlite_env, run_cache):
    """Our server on (this test's copy of) the real catalogues; yields its base URL."""
    use_sqlite_copy(sqlite_env, filled_sqlite(run_cache, "hek-search-catalogues", _import_catalogues))
    with served_app() as url:
        yield url


def _get(url: str, **kw) -> httpx.Response:
    """``httpx.get`` with the file's 30 s timeout: a search of the real catalogues on SQLite can
    take seconds on a busy test machine (httpx's own 5 s default once timed out in CI)."""
    return httpx.get(url, timeout=30, **kw)


def _client(url: str, **default) -> hek.HEKClient:
    c = hek.HEKClient(url=f"{url}/api/v1/hek?")
    if default:
        c.default = {**hek.HEKClient.default, **default}  # e.g. a small result_limit (page size)
    return c


def _ours(url: str, **params) -> set[int]:
    """Ids of every event ``GET /api/v1/events`` returns for ``params`` (all pages)."""
    ids: set[int] = set()
    cursor = None
    while True:
        q = {**params, "limit": 500, **({"cursor": cursor} if cursor else {})}
        body = httpx.get(f"{url}/api/v1/events", params=q, timeout=30).raise_for_status().json()
        ids |= {e["id"] for e in body["items"]}
        cursor = body["next_cursor"]
        if not cursor:
            return ids


def _ids(table) -> set[int]:
    return {int(i) for i in table["lst_id"]} if len(table) else set()


MARCH = ("2012-03-01T00:00:00", "2012-03-15T00:00:00")


def test_sunpy_hekclient_finds_the_flares_our_api_finds(served):
    url = served
    t = a.Time(*MARCH)
    flares = _client(url).search(t, a.hek.FL)
    ours = _ours(url, type="FL", start=MARCH[0], end=MARCH[1])
    assert len(ours) > 100  # the GOES report's March 2012 flares (the X5.4 of 03-07 among them)
    assert _ids(flares) == ours
    assert set(flares["event_type"]) == {"FL"}
    assert set(flares["obs_instrument"]) == {"XRS"}  # STIX's list starts in 2021, HEK's answer is of 2024
    # EventType("FL") is the same query as a.hek.FL
    assert _ids(_client(url).search(t, a.hek.EventType("FL"))) == ours

    big = _client(url).search(t, a.hek.FL, a.hek.FL.GOESCls > "M")
    ours_m = _ours(url, type="FL", start=MARCH[0], end=MARCH[1], min_goes_class="M1.0")
    assert _ids(big) == ours_m and 5 <= len(ours_m) < len(ours)
    assert all(c[0] in "MX" for c in big["fl_goescls"])
    assert "X5.4" in set(big["fl_goescls"])
    # sunpy made times and quantities of our rows
    assert big["event_starttime"][0].scale == "utc"
    assert big["fl_peakflux"].unit == u.W / u.m**2
    # a class with a number: flux comparison (X10 above X2, unlike HEK's text comparison)
    x = _client(url).search(t, a.hek.FL, a.hek.FL.GOESCls >= "X1.1")
    assert _ids(x) == _ours(url, type="FL", start=MARCH[0], end=MARCH[1], min_goes_class="X1.1")
    assert set(x["fl_goescls"]) == {"X1.1", "X1.3", "X5.4"}  # 03-05 and 03-07 (the report's X flares)
    strict = _client(url).search(t, a.hek.FL, a.hek.FL.GOESCls > "X1.1")
    assert set(strict["fl_goescls"]) == {"X1.3", "X5.4"}


def test_paging_with_a_small_result_limit(served):
    url = served
    ours = _ours(url, type="FL", start=MARCH[0], end=MARCH[1])
    # sunpy's client pages on while overmax is true: 7 rows a page
    paged = _client(url, result_limit=7).search(a.Time(*MARCH), a.hek.FL)
    assert len(paged) == len(ours) and _ids(paged) == ours  # no row twice, none lost
    q = {"cmd": "search", "type": "column", "cosec": 2, "event_type": "fl", "event_starttime": MARCH[0],
         "event_endtime": MARCH[1], "result_limit": 7}
    pages = []
    for page in range(1, 100):
        body = _get(f"{url}/api/v1/hek", params={**q, "page": page}).raise_for_status().json()
        pages.append(body)
        if not body["overmax"]:
            break
    assert len(pages) == -(-len(ours) // 7)
    assert all(len(p["result"]) == 7 for p in pages[:-1]) and 1 <= len(pages[-1]["result"]) <= 7
    starts = [r["event_starttime"] for p in pages for r in p["result"]]
    assert starts == sorted(starts)  # start-time order across pages
    # return: only the fields asked
    body = _get(f"{url}/api/v1/hek", params={**q, "return": "event_starttime,fl_goescls"}).json()
    assert set(body["result"][0]) == {"event_starttime", "fl_goescls"}


def test_cmes_and_a_spatial_query(served):
    url = served
    t = a.Time(*MARCH)
    cmes = _client(url).search(t, a.hek.CE)
    ours = _ours(url, type="CE", start=MARCH[0], end=MARCH[1])
    assert len(ours) > 20 and _ids(cmes) == ours
    assert set(cmes["obs_instrument"]) == {"LASCO"}
    fast = _client(url).search(t, a.hek.CE, a.hek.CE.RadialLinVel > 1000)
    assert 0 < len(fast) < len(cmes) and all(v > 1000 for v in fast["cme_radiallinvel"].to_value("km/s"))

    # flares of the north-east quadrant (helioprojective box, arcsec) and several types at once
    box = a.hek.SpatialRegion(x1=-1000, y1=0, x2=0, y2=1000)
    ne = _client(url).search(t, a.hek.FL, box)
    ours_ne = _ours(url, type="FL", start=MARCH[0], end=MARCH[1], hpc_x_min=-1000, hpc_x_max=0,
                    hpc_y_min=0, hpc_y_max=1000)
    assert 0 < len(ours_ne) and _ids(ne) == ours_ne
    for c in ne["event_coord"]:
        assert -1000 <= c.Tx.to_value("arcsec") <= 0 and 0 <= c.Ty.to_value("arcsec") <= 1000
    both = _client(url).search(t, a.hek.FL | a.hek.CE)
    assert _ids(both) == _ours(url, type="FL,CE", start=MARCH[0], end=MARCH[1])


def test_the_real_hek_rows_come_back_as_hek_gave_them(served):
    """Our answer for the day of the real HEK answer, read by sunpy, against sunpy's reading
    of HEK's own JSON: the same flares, times, classes, methods and places."""
    real = json.loads(HEK_FILE.read_text(encoding="utf-8"))["result"]
    theirs = hek.HEKTable._from_search(Table([{k: r.get(k) for k in
                                               ("event_starttime", "event_endtime", "fl_goescls", "frm_name",
                                                "event_coordsys", "event_coord1", "event_coord2", "event_coord3",
                                                "event_coordunit")} for r in real]))
    ours = _client(served).search(a.Time("2024-05-09T20:00", "2024-05-10T09:00"))  # event_type **: all
    assert len(ours) == len(real) == 5
    assert sorted(ours["event_type"]) == sorted(r["event_type"] for r in real) == ["CE", "CH", "FL", "FL", "FL"]
    key = lambda row: (str(row["event_starttime"].isot), row["frm_name"])  # noqa: E731
    mine = {key(r): r for r in ours}
    for r in theirs:
        m = mine[key(r)]
        assert m["event_endtime"].isot == r["event_endtime"].isot
        assert (m["fl_goescls"] or "") == (r["fl_goescls"] or "")
        # the same place on the Sun, whatever frame each row is written in (HEK: HPC or HGS)
        hpc = Helioprojective(observer="earth", obstime=r["event_starttime"])
        sep = m["event_coord"].transform_to(hpc).separation(r["event_coord"].transform_to(hpc))
        assert sep < 1 * u.arcmin, (key(r), sep)


def test_bad_queries_are_400_with_the_reason(served):
    url = served
    base = {"cmd": "search", "type": "column", "cosec": 2, "event_type": "FL",
            "event_starttime": MARCH[0], "event_endtime": MARCH[1]}

    def detail(**params) -> str:
        r = _get(f"{url}/api/v1/hek", params={**base, **params})
        assert r.status_code == 400, (params, r.status_code, r.text)
        return r.json()["detail"]

    assert "'showtests'" in detail(showtests="hide") and "'event_typo'" in detail(event_typo="FL")
    assert "our events have no such HEK attribute" in detail(param0="FL_PeakTemp", op0=">", value0="1")
    assert "missing value0" in detail(param0="FL_GOESCls", op0=">")
    assert "not a GOES class" in detail(param0="FL_GOESCls", op0=">", value0="Q5")
    assert "not an operator" in detail(param0="FL_GOESCls", op0="~", value0="M")
    assert "unknown HEK event code 'ZZ'" in detail(event_type="FL,ZZ")
    assert "only helioprojective" in detail(event_coordsys="heliographic", x1=0, x2=1, y1=0, y2=1)
    assert "x1 <= x2" in detail(x1=10, x2=-10, y1=0, y2=1)
    assert "missing y2" in detail(x1=0, x2=1, y1=0)
    assert "result_limit" in detail(result_limit=0) and "page" in detail(page="two")
    assert "before event_starttime" in detail(event_endtime="2012-02-01T00:00:00")
    assert "not a time" in detail(event_starttime="yesterday")
    assert "only cmd=search" in detail(cmd="export-voevent")
    assert "only type=column" in detail(type="contains")
    assert "unknown field(s) 'nope'" in detail(**{"return": "event_starttime,nope"})
    r = _get(f"{url}/api/v1/hek", params={"cmd": "search"})
    assert r.status_code == 400 and "event_starttime and event_endtime required" in r.json()["detail"]
    # the same parameters given to GET /events are named, not dropped
    r = _get(f"{url}/api/v1/events", params={"format": "hek", "event_type": "FL", "cosec": 2,
                                                  "param0": "FL_GOESCls", "type": "FL"})
    assert r.status_code == 400
    assert r.json()["detail"].startswith("event_type, cosec, param0: HEK query parameter(s)")
    assert "/api/v1/hek" in r.json()["detail"]


def test_anonymous_hek_search_sees_the_public_catalogue_only(served):
    from backend.models import Event

    with session_scope() as s:
        s.add(Event(event_type="FL", source="detected", source_key="private-1", owner="alice",
                    start_time=dt.datetime(2012, 3, 7, 1, tzinfo=dt.UTC), goes_class="X9.9", goes_flux=9.9e-4))
    q = urllib.parse.urlencode({"cmd": "search", "event_type": "FL", "event_starttime": "2012-03-07T00:00:00",
                                "event_endtime": "2012-03-08T00:00:00"})
    rows = _get(f"{served}/api/v1/hek?{q}").raise_for_status().json()["result"]
    assert rows and not any(r["fl_goescls"] == "X9.9" for r in rows)


def test_rows_without_a_helioprojective_position_are_written_as_hek_writes_them(served):
    """A STIX flare hidden from Earth: Stonyhurst (its heliographic place, observer-free); a
    GOES report row without a location: HEK's (0, 0) with noposition true. A box smaller than
    HEK's whole region asks for positions in it: neither is returned then."""
    url = served
    day = a.Time("2023-04-26T20:00", "2023-04-27T13:00")  # STIX flares on both sides of the limb
    rows = _client(url).search(day, a.hek.FL)
    (hidden,) = [r for r in rows if r["lst_source"] == "stix" and r["kb_archivid"].endswith("/2304271119")]
    assert hidden["event_coord"].frame.name == "heliographic_stonyhurst"
    raw = {r["kb_archivid"]: r for r in rows.raw}
    h = raw[hidden["kb_archivid"]]
    assert (h["event_coordsys"], h["noposition"], h["hpc_x"]) == ("UTC-HGS-TOPO", "false", None)
    assert (h["event_coord1"], h["event_coord2"]) == (h["hgs_x"], h["hgs_y"])
    boxed = _client(url).search(day, a.hek.FL, a.hek.SpatialRegion(x1=-1200, y1=-1200, x2=1200, y2=1200))
    seen = {k for k, r in raw.items() if r["hpc_x"] is not None}
    assert 0 < len(seen) < len(rows) and set(boxed["kb_archivid"]) == seen

    q = {"cmd": "search", "event_type": "FL", "event_starttime": MARCH[0], "event_endtime": MARCH[1]}
    result = _get(f"{url}/api/v1/hek", params={**q, "result_limit": 500}).json()["result"]
    unplaced = [r for r in result if r["hpc_x"] is None]
    assert unplaced and all((r["event_coordsys"], r["event_coord1"], r["event_coord2"], r["noposition"])
                            == ("UTC-HGS-TOPO", 0.0, 0.0, "true") for r in unplaced)
    assert all(r["noposition"] == "false" and r["event_coordsys"] == "UTC-HPC-TOPO"
               for r in result if r["hpc_x"] is not None)


def test_every_searchable_attribute_runs_on_postgresql(db_session, tmp_path):
    """Each HEK attribute and operator as SQL on PostgreSQL (the live tests above use SQLite),
    checked against the stored rows read in Python."""
    from sqlalchemy import select

    from backend.models import Event
    from backend.services.hek_search import HEK_PARAMS, hek_search, parse_hek_query

    shutil.copy(GOES_2012, tmp_path / GOES_2012.name)
    import_catalogue(db_session, "goes_xrs", tmp_path / GOES_2012.name)
    import_catalogue(db_session, "cdaw", EVENTS / "cdaw")
    base = [("cmd", "search"), ("event_starttime", MARCH[0]), ("event_endtime", MARCH[1]), ("result_limit", "500")]
    values = {"number": "10", "text": "a*", "time": "2012-03-07T00:00:00", "goes": "M"}
    for attr, spec in HEK_PARAMS.items():
        ops = ("=", "!=", "like") if spec.kind == "text" else ("=", "!=", "<", "<=", ">", ">=")
        for op in ops:
            q = parse_hek_query(base + [("param0", attr), ("op0", op), ("value0", values[spec.kind])])
            assert isinstance(hek_search(db_session, q)["result"], list), (attr, op)
    got = hek_search(db_session, parse_hek_query(base + [("event_type", "ce"), ("param0", "CME_RadialLinVel"),
                                                         ("op0", ">="), ("value0", "1000")]))["result"]
    rows = db_session.scalars(select(Event).where(Event.event_type == "CE", Event.speed_km_s >= 1000)).all()
    t0, t1 = (dt.datetime.fromisoformat(t).replace(tzinfo=dt.UTC) for t in MARCH)
    want = {e.id for e in rows if e.start_time <= t1 and (e.end_time or e.peak_time or e.start_time) >= t0}
    assert want and {r["lst_id"] for r in got} == want
    x = hek_search(db_session, parse_hek_query(base + [("param0", "fl_goescls"), ("op0", "="), ("value0", "X")]))
    assert sorted(r["fl_goescls"] for r in x["result"]) == ["X1.1", "X1.3", "X5.4"]


def test_odd_values_are_never_a_server_error(api_client):
    """Values at and past every edge: 200 or 400, never a 5xx (PostgreSQL)."""
    base = {"cmd": "search", "event_starttime": "2012-03-01T00:00:00", "event_endtime": "2012-03-02T00:00:00"}
    odd = ["", " ", "nan", "inf", "-1e400", "1e308", "\x00", "%", "*", "'; drop table events; --", "9" * 40,
           "2012-03-07T00:00:00+14:00", "0001-01-01T00:00:00", "9999-12-31T23:59:59", "M0", "X999", "a" * 300]
    names = ["event_type", "event_starttime", "event_endtime", "x1", "result_limit", "page", "return", "cosec",
             "value0"]
    for name in names:
        for v in odd:
            params = {**base, name: v}
            if name == "x1":
                params.update(x2="0", y1="0", y2="0")
            if name == "value0":
                for attr in ("FL_GOESCls", "AR_NOAANum", "FRM_Name", "Event_PeakTime", "hpc_x"):
                    r = api_client.get("/api/v1/hek", params={**params, "param0": attr, "op0": ">="
                                                               if attr != "FRM_Name" else "like"})
                    assert r.status_code in (200, 400), (attr, v, r.status_code, r.text)
                continue
            r = api_client.get("/api/v1/hek", params=params)
            assert r.status_code in (200, 400), (name, v, r.status_code, r.text)
