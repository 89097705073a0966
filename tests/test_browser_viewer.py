"""The image viewer and the event page's context images in a real Chromium (Debian's, via
Playwright), on SDI products calibrated by the real chain from the simulator's series
(:func:`tests.test_viewer.simulate_sdi`) and a flare at the injected flare's position.

The flare's marker is read off the screen (the SVG point's bounding box and the Plotly
axis ranges of the plot area), turned back into helioprojective arcsec and then into a
pixel with astropy's WCS of the FITS file, and compared with the pixel computed here
independently (sunpy's ``solar_rotate_coordinate`` to the frame's time, astropy's WCS).
Screenshots go to each test's ``tmp_path``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from backend.db import session_scope
from tests.test_browser import served_app, TIMEOUT_MS, boxes_in_one_layout, browser  # noqa: F401 - the browser fixture
from tests.test_viewer import add_flare, expected_rotated, simulate_sdi, store_product

pytestmark = pytest.mark.browser

#: Side of the simulated frames [pixel]: larger than the plot at this viewport, so the whole
#: frame comes reduced (1:2) and a zoom brings a full-resolution region.
N_BROWSER = 768
VIEWPORT = {"width": 1000, "height": 800}


@pytest.fixture(scope="module")
def simulated_big(tmp_path_factory):
    return simulate_sdi(tmp_path_factory.mktemp("viewer_browser_sim"), naxis=N_BROWSER)


@pytest.fixture
def live(sqlite_env, simulated_big):

    with session_scope() as s:
        prods = [store_product(s, sqlite_env.products, f, l2) for f, l2 in simulated_big.frames]
        fl = add_flare(s, simulated_big.flare)
        ids = SimpleNamespace(products=[p.id for p in prods], paths=[Path(p.path) for p in prods], fl=fl.id,
                              hpc=(fl.hpc_x, fl.hpc_y), peak=fl.peak_time)
    with served_app() as url:
        yield SimpleNamespace(url=url, ids=ids)


@pytest.fixture
def page(browser):  # noqa: F811 - the imported fixture
    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    pg.js_errors = errors
    yield pg
    context.close()


def _wcs_pixel(fits_path: Path, tx: float, ty: float) -> tuple[float, float]:
    """0-based pixel of helioprojective (tx, ty) [arcsec] by astropy's WCS of the file."""
    from astropy.io import fits
    from astropy.wcs import WCS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, y = WCS(fits.getheader(fits_path, 0)).world_to_pixel_values(tx / 3600.0, ty / 3600.0)
    return float(x), float(y)


def _screen_to_arcsec(page, cx: float, cy: float) -> tuple[float, float]:
    """Data coordinates of a screen point from the plot area's box and Plotly's axis ranges."""
    box = page.locator("#viewer-plot .nsewdrag").first.bounding_box()
    xr, yr = page.evaluate("() => { const fl = document.getElementById('viewer-plot')._fullLayout;"
                           " return [fl.xaxis.range, fl.yaxis.range]; }")
    tx = xr[0] + (cx - box["x"]) / box["width"] * (xr[1] - xr[0])
    ty = yr[1] - (cy - box["y"]) / box["height"] * (yr[1] - yr[0])
    return tx, ty


def _marker_centre(page, trace_name: str) -> tuple[float, float]:
    """Screen centre of the first point of the scatter trace named ``trace_name``."""
    index = page.evaluate(f"() => document.getElementById('viewer-plot').data.findIndex(t => t.name === '{trace_name}')")
    assert index >= 0, f"no trace {trace_name}"
    point = page.locator("#viewer-plot .scatterlayer .trace").nth(index).locator("path.point").first
    b = point.bounding_box()
    return b["x"] + b["width"] / 2, b["y"] + b["height"] / 2


def _requests(page) -> list[dict]:
    return page.evaluate("() => window.lstViewer.requests.map(r => ({kind: r.kind, factor: r.factor, "
                         "region: r.region, size: r.size}))")


def test_viewer_marks_the_flare_at_its_wcs_pixel_zooms_and_reads_out(live, page, tmp_path):
    before, before_path = live.ids.products[0], live.ids.paths[0]
    page.goto(f"{live.url}/products/{before}/view?event={live.ids.fl}")
    page.wait_for_selector("#viewer-app[data-ready='1']")
    page.screenshot(path=str(tmp_path / "viewer-event-centred.png"), full_page=True)

    # the flare, three hours before its peak: rotated to the frame's DATE-OBS by the server
    tx_exp, ty_exp, x_exp, y_exp = expected_rotated(before_path, *live.ids.hpc, live.ids.peak)
    cx, cy = _marker_centre(page, "highlight")
    tx, ty = _screen_to_arcsec(page, cx, cy)
    x, y = _wcs_pixel(before_path, tx, ty)
    assert abs(x - x_exp) <= 1.5 and abs(y - y_exp) <= 1.5, ((x, y), (x_exp, y_exp))
    # centred on it
    xr = page.evaluate("() => document.getElementById('viewer-plot')._fullLayout.xaxis.range")
    assert abs((xr[0] + xr[1]) / 2 - tx_exp) < 5
    assert page.locator(f"#viewer-event-list li.highlight[data-event-id='{live.ids.fl}']").count() == 1

    # the readout under the cursor: the pixel the server reads there, its value from the FITS
    from pipelines.products import read_product

    page.mouse.move(cx, cy)
    page.wait_for_function("() => document.getElementById('viewer-app').dataset.readout !== undefined")
    ro = page.evaluate("() => JSON.parse(document.getElementById('viewer-app').dataset.readout)")
    data, _, _ = read_product(before_path)
    assert abs(ro["x"] - x_exp) <= 1.5 and abs(ro["y"] - y_exp) <= 1.5
    assert ro["value"] == pytest.approx(float(data[ro["y"], ro["x"]]), rel=1e-6)
    assert page.locator("#ro-pixel").inner_text() == f"{ro['x']}, {ro['y']}"
    assert ro["bunit"] in page.locator("#ro-value").inner_text()
    assert "°" in page.locator("#ro-hgs").inner_text()  # on the disk: Stonyhurst lat, lon
    page.screenshot(path=str(tmp_path / "viewer-readout.png"), full_page=True)

    # a click on the marker opens the event page
    page.mouse.click(cx, cy)
    page.wait_for_url(f"{live.url}/events/{live.ids.fl}")
    assert page.js_errors == []


def test_viewer_zoom_fetches_a_full_resolution_region_and_dq_layer(live, page, tmp_path):
    peak = live.ids.products[1]
    page.goto(f"{live.url}/products/{peak}/view")
    page.wait_for_selector("#viewer-app[data-ready='1']")
    first = _requests(page)
    assert first[0]["region"] == {"x0": 0, "x1": N_BROWSER, "y0": 0, "y1": N_BROWSER} and first[0]["factor"] == 2
    assert page.locator("#viewer-plot .imagelayer image").count() >= 1  # the image under the traces
    assert page.locator("#viewer-plot .scatterlayer .trace").count() >= 4  # grid, limb, events, frame
    page.screenshot(path=str(tmp_path / "viewer-full.png"), full_page=True)

    # drag a zoom box over the south-east quadrant
    box = page.locator("#viewer-plot .nsewdrag").first.bounding_box()
    x0, y0 = box["x"] + box["width"] * 0.30, box["y"] + box["height"] * 0.55
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move(x0 + box["width"] * 0.2, y0 + box["height"] * 0.2, steps=8)
    page.mouse.up()
    page.wait_for_function("() => window.lstViewer.requests.some(r => r.kind === 'region' && r.factor === 1)")
    page.wait_for_function("() => document.getElementById('viewer-app').dataset.decimation === '1'")
    page.wait_for_function("() => document.getElementById('viewer-app').dataset.loaded"
                           " === String(window.lstViewer.requests.length)")  # the zoom's draw ended
    zoomed = [r for r in _requests(page) if r["kind"] == "region" and r["factor"] == 1][-1]
    reg = zoomed["region"]
    assert reg["x1"] - reg["x0"] < N_BROWSER / 2 and reg["y1"] - reg["y0"] < N_BROWSER / 2
    # the region asked for is the visible one: its centre is the axes' centre
    xr, yr = page.evaluate("() => { const fl = document.getElementById('viewer-plot')._fullLayout;"
                           " return [fl.xaxis.range, fl.yaxis.range]; }")
    xc, yc = _wcs_pixel(live.ids.paths[1], (xr[0] + xr[1]) / 2, (yr[0] + yr[1]) / 2)
    assert abs((reg["x0"] + reg["x1"]) / 2 - xc) <= 2 and abs((reg["y0"] + reg["y1"]) / 2 - yc) <= 2
    page.screenshot(path=str(tmp_path / "viewer-zoomed.png"), full_page=True)

    # the DQ layer for the same region, and a stretch change re-draws with new limits
    page.check("#viewer-dq")
    page.wait_for_function("() => window.lstViewer.requests.some(r => r.kind === 'dq')")
    dq = [r for r in _requests(page) if r["kind"] == "dq"][-1]
    assert dq["region"] == reg
    # the DQ re-draw ended (data-loaded: the requests made when it drew) before the next change
    page.wait_for_function("() => document.getElementById('viewer-app').dataset.loaded"
                           " === String(window.lstViewer.requests.length)")
    n = len(_requests(page))
    drawn = int(page.locator("#viewer-app").get_attribute("data-drawn"))
    page.fill("#viewer-pmax", "95")
    page.locator("#viewer-pmax").dispatch_event("change")
    page.wait_for_function(f"() => window.lstViewer.requests.length > {n + 1}")
    # the re-draw's end (viewer.js refresh: its images fetched, then drawn, or its error shown); the
    # requests alone are counted before it, when no error could show yet
    page.wait_for_function(f"() => Number(document.getElementById('viewer-app').dataset.drawn) > {drawn}"
                           " || !document.getElementById('viewer-error').hidden")
    assert "95" not in page.locator("#viewer-error").inner_text() and page.locator("#viewer-error").is_hidden()
    page.fill("#viewer-pmin", "99")  # pmin above pmax: the server's 422 message is shown
    page.locator("#viewer-pmin").dispatch_event("change")
    page.wait_for_selector("#viewer-error:not([hidden])")
    assert "below pmax" in page.locator("#viewer-error").inner_text()
    page.screenshot(path=str(tmp_path / "viewer-bad-limits.png"), full_page=True)
    assert [e for e in page.js_errors if "422" not in e] == []


def test_event_page_context_images_mark_the_flare(live, page, tmp_path):
    page.goto(f"{live.url}/events/{live.ids.fl}")
    figs = page.locator("#event-context figure.context-frame")
    assert figs.evaluate_all("fs => fs.map(f => f.dataset.role)") == ["before", "peak", "after"]
    # the context images are lazy: below the curves and the movie, they load once scrolled to
    imgs = page.locator("#event-context img")
    for k in range(imgs.count()):
        imgs.nth(k).scroll_into_view_if_needed()
    page.wait_for_function("() => [...document.querySelectorAll('#event-context img')].every(i => i.complete "
                           "&& i.naturalWidth > 0)")
    page.screenshot(path=str(tmp_path / "event-context.png"), full_page=True)
    for k, role in enumerate(("before", "peak", "after")):
        fig = page.locator(f"#event-context figure[data-role='{role}']")
        img, c = boxes_in_one_layout(page, fig.locator("img"), fig.locator("circle.context-marker"))
        cx, cy = c["x"] + c["width"] / 2, c["y"] + c["height"] / 2
        x = (cx - img["x"]) / img["width"] * N_BROWSER - 0.5
        y = N_BROWSER - 0.5 - (cy - img["y"]) / img["height"] * N_BROWSER
        _, _, x_exp, y_exp = expected_rotated(live.ids.paths[k], *live.ids.hpc, live.ids.peak)
        # the marker is drawn to 0.1 thumbnail pixel (0.3 image pixel)
        assert abs(x - x_exp) <= 1.5 and abs(y - y_exp) <= 1.5, (role, (x, y), (x_exp, y_exp))
    href = page.locator("#event-context figure[data-role='peak'] a").get_attribute("href")
    assert href == f"/products/{live.ids.products[1]}/view?event={live.ids.fl}"
    page.click("#event-context figure[data-role='peak'] a")
    page.wait_for_selector("#viewer-app[data-ready='1']")
    assert page.js_errors == []
