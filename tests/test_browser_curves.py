"""The event page's curves in a real Chromium: a flare page shows the LST light curves and the GOES
XRS curve on one UTC axis (the M2.5 flare of 2011-06-07 with the real GOES-15 XRS file).

The app is served by uvicorn on a temporary SQLite database (``tests.test_browser`` helpers);
screenshots go to each test's ``tmp_path``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backend.db import session_scope
from backend.models import EventAssociation
from backend.services import xray as xray_service
from tests.test_api import make_event
from tests.test_browser import served_app, browser, page  # noqa: F401 - fixtures
from tests.test_xray import FITS_2011, FLARE, MIN, make_flare_day

pytestmark = pytest.mark.browser


@pytest.fixture
def live(sqlite_env, curves_read_unbudgeted):
    ids = SimpleNamespace()
    with session_scope() as s:
        fl, prods, other, cals = make_flare_day(s, sqlite_env.products / "SDI")
        hek = make_event(s, "FL", FLARE["start"] + MIN, FLARE["peak"] + MIN, FLARE["end"], source="hek",
                         frm_name="SWPC", noaa_ar=11226, hpc_x=-630.0, hpc_y=-330.0)
        quiet = make_event(s, "FL", FLARE["start"].replace(year=2016), FLARE["peak"].replace(year=2016),
                           FLARE["end"].replace(year=2016), goes_class="C1.0")
        s.add_all([EventAssociation(event_id=fl.id, other_event_id=hek.id, kind="same_flare",
                                    reason="same flare in GOES and HEK (SWPC): peaks 60 s apart, both NOAA AR 11226, "
                                           "28\u2033 apart"),
                   EventAssociation(event_id=hek.id, other_event_id=fl.id, kind="same_flare")])
        ids.fl, ids.hek, ids.quiet, ids.products = fl.id, hek.id, quiet.id, [p.id for p in prods]
        assert xray_service.ingest_xray_file(s, FITS_2011, sqlite_env).status == "ingested"
    with served_app() as url:
        yield SimpleNamespace(url=url, ids=ids, settings=sqlite_env)


def _figure_state(page):
    return page.evaluate("""() => {
        const gd = document.getElementById('curves-figure');
        const fl = gd._fullLayout;
        return {
            names: gd.data.map(t => t.name),
            axes: gd.data.map(t => [t.xaxis || 'x', t.yaxis || 'y']),
            x1: fl.xaxis.range.slice(), x2: fl.xaxis2.range.slice(),
            matches: [fl.xaxis.matches || null, fl.xaxis2.matches || null],
            y2type: fl.yaxis2.type,
            shapes: (gd.layout.shapes || []).map(s => s.name),
            nulls: gd.data.map(t => t.y.filter(v => v === null).length),
            lengths: gd.data.map(t => t.y.length),
        };
    }""")


def test_flare_page_shows_lst_and_goes_curves_on_one_axis(live, page, tmp_path):
    page.goto(f"{live.url}/events/{live.ids.fl}")
    page.wait_for_selector("#curves-figure.js-plotly-plot")
    st = _figure_state(page)
    assert st["names"][:2] == ["LST SDI ROI (-650\u2033, -350\u2033) \u00b160\u2033", "LST SDI disk"]
    assert st["names"][2:] == ["GOES 1-8 \u00c5 (GOES-15)", "GOES 0.5-4 \u00c5 (GOES-15)"]
    assert st["axes"] == [["x", "y"], ["x", "y"], ["x2", "y2"], ["x2", "y2"]]
    assert "x2" in st["matches"] or "x" in st["matches"]  # the two time axes are one
    assert st["x1"] == st["x2"] and st["y2type"] == "log"
    assert {"start", "peak", "end"} <= set(st["shapes"])
    assert st["nulls"][1] == 1  # the all-NaN product is a gap in the disk curve
    assert st["lengths"][2] > 2900  # 2.048-s GOES-15 samples over 1 h 43 min
    # the lines are drawn: both rows have visible paths, three event lines cross the plot
    assert page.locator("#curves-figure .subplot.xy .scatterlayer .trace").count() == 2
    assert page.locator("#curves-figure .subplot.x2y2 .scatterlayer .trace").count() == 2
    assert page.locator("#curves-figure .subplot.x2y2 .js-line").first.get_attribute("d").count("L") > 100  # plotly simplifies the path
    text = page.locator("#curves-figure").inner_text()
    assert "calibration set: dark #" in text and "go1520110607.fits" in text
    page.locator("#event-curves").screenshot(path=str(tmp_path / "flare-curves-first.png"))
    labels = page.locator("#curves-figure .annotation-text").evaluate_all("els => els.map(e => e.textContent)")
    assert {"A", "B", "C", "M", "X"} <= set(labels), labels
    # zooming the LST row zooms the GOES row too (one UTC axis)
    page.evaluate("""() => Plotly.relayout('curves-figure', {'xaxis.range': ['2011-06-07 06:20', '2011-06-07 07:00']})""")
    try:  # the GOES row follows (however long a loaded machine takes to redraw); the assert says how far it got
        page.wait_for_function("""() => { const fl = document.getElementById('curves-figure')._fullLayout;
            return String(fl.xaxis2.range[0]).startsWith('2011-06-07 06:20'); }""", timeout=10_000)
    except Exception as e:  # playwright's TimeoutError
        if type(e).__name__ != "TimeoutError":
            raise
    st2 = _figure_state(page)
    assert st2["x1"] == st2["x2"] and st2["x2"][0].startswith("2011-06-07 06:20")
    page.evaluate("""() => Plotly.relayout('curves-figure', {'xaxis.autorange': true})""")  # awaits the redraw
    reasons = page.locator("#associated-events .association-reason").inner_text()
    assert "same flare in GOES and HEK (SWPC): peaks 60 s apart, both NOAA AR 11226, 28\u2033 apart" in reasons
    assert "SDI: 10 frames, 10 L2 products" in page.locator("#linked-window").inner_text()
    assert page.locator("#curves-fits").get_attribute("href") == f"/api/v1/events/{live.ids.fl}/curves?format=fits"
    page.locator("#event-curves").screenshot(path=str(tmp_path / "flare-curves.png"))
    page.screenshot(path=str(tmp_path / "flare-page.png"), full_page=True)
    # the CSV and FITS links answer
    for fmt, ctype in (("csv", "text/csv"), ("fits", "application/fits")):
        r = page.request.get(f"{live.url}/api/v1/events/{live.ids.fl}/curves?format={fmt}")
        assert r.status == 200 and r.headers["content-type"].startswith(ctype)
    # the reverse link, made before reasons were stored, says so instead of inventing one
    page.goto(f"{live.url}/events/{live.ids.hek}")
    assert "before reasons were recorded" in page.locator("#associated-events").inner_text()
    assert page.js_errors == []


def test_window_without_xrs_says_so(live, page, tmp_path):
    page.goto(f"{live.url}/events/{live.ids.quiet}")
    page.wait_for_selector("#curves-figure.js-plotly-plot")
    text = page.locator("#curves-figure").inner_text()
    assert "No GOES XRS series stored for this window" in text
    assert "GOES-15 2011-06-06 23:59" in text  # what the store does cover
    st = _figure_state(page)
    assert st["x1"] == st["x2"] and st["x2"][0].startswith("2016-06-07T05:46")  # the window, not plotly's default
    assert "No written SDI L2 products in this window" in text
    assert "no LST frame has DATE-OBS in this window" in page.locator("#linked-data").inner_text()
    page.locator("#event-curves").screenshot(path=str(tmp_path / "no-xrs.png"))
    assert page.js_errors == []
