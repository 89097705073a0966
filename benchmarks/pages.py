"""Cold-browser timings of the event browser's pages, in Debian's Chromium (Playwright).

Seeds a temporary embedded-mode data folder (SQLite, product store; dropped at the end):
``--events`` catalogue-like events (default 73,000, the demo's count: flares with GOES
classes and helioprojective positions, CMEs with position angles, active regions...,
2010-2024), and ``--products`` SDI frames with written L2 products (small real FITS files
with a DQ extension and PNG quicklooks) around one M flare linked to them. It then serves
the app with uvicorn in a subprocess and opens, ``--repeat`` times each, in a **fresh
browser context** (empty cache, no cookies: a cold browser):

* ``events``: the events list ``/`` (the landing page, with the timeline figure);
* ``event``: the flare's page ``/events/<id>`` (quicklooks, light-curve figure);
* ``products``: ``/products`` (quicklook gallery, bulk download form);
* ``job_new``: ``/jobs/new`` (the job form and its estimate).

For each it reads the browser's own Navigation and Paint Timing entries: time to first
byte, first contentful paint (FCP: the server-rendered page drawn), DOMContentLoaded, the
load event, and for pages with a figure the time its Plotly figure was drawn
(``.js-plotly-plot``), with the bytes transferred. One line per page::

    RESULT page=<name> fcp_ms=<median> dcl_ms=<median> load_ms=<median> figure_ms=<median or -> kb=<transfer>

and a last line::

    RESULT events_fcp_ms=<median> events_load_ms=<median> worst_fcp_ms=<worst page median> target_ms=1000 ok=<0|1>

Target (issue 11): the events page drawn (FCP) within 1 s on a cold browser on this machine.

``--url URL`` measures a server already running there (the demo, for instance) instead of
seeding one: the event page is then the newest event's.

``--app-root PATH`` serves the app of another checkout on the same seeded data (its schema
must match this one's migrations), to compare before and after a change.

Run: ``.venv/bin/python benchmarks/pages.py [--events N] [--products N] [--repeat N] [--url URL]
[--app-root PATH]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
TARGET_MS = 1000.0
T_FLARE = dt.datetime(2024, 5, 14, 16, 0, tzinfo=dt.UTC)

_TIMINGS_JS = """() => {
  const n = performance.getEntriesByType('navigation')[0];
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  const bytes = performance.getEntriesByType('resource')
    .reduce((s, r) => s + (r.transferSize || 0), n.transferSize || 0);
  return {ttfb: n.responseStart, fcp: fcp ? fcp.startTime : null, dcl: n.domContentLoadedEventEnd,
          load: n.loadEventEnd, bytes: bytes};
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _seed(data_dir: Path, n_events: int, n_products: int, seed: int = 1) -> int:
    """Fill a fresh embedded-mode database in ``data_dir``; returns the id of the flare."""
    os.environ["DATA_DIR"] = str(data_dir)
    for k in ("DATABASE_URL", "LSTDP_DATABASE_URL"):
        os.environ.pop(k, None)
    import numpy as np
    from astropy.io import fits
    from sqlalchemy import insert

    from backend.db import session_scope
    from backend.migrate import upgrade
    from backend.models import Event, EventProduct, Frame, Product, ProductState
    from backend.settings import get_settings
    from pipelines.products import dq_table_hdu

    get_settings.cache_clear()
    settings = get_settings()
    settings.ensure_dirs()
    upgrade(settings.sqlalchemy_url)
    rng = random.Random(seed)
    t0, span = dt.datetime(2010, 1, 1, tzinfo=dt.UTC), 15 * 365.25 * 86400
    kinds = [("FL", "goes_xrs", 0.55), ("CE", "cdaw", 0.15), ("AR", "noaa_srs", 0.12), ("FL", "hek", 0.10),
             ("CH", "hek", 0.05), ("PR", "detected", 0.03)]
    rows = []
    for i in range(n_events):
        r, acc = rng.random(), 0.0
        for code, source, share in kinds:
            acc += share
            if r <= acc:
                break
        start = t0 + dt.timedelta(seconds=rng.random() * span)
        row = dict(event_type=code, source=source, source_key=f"bench-{i}", start_time=start, attributes={},
                   end_time=start + dt.timedelta(minutes=rng.lognormvariate(2.9, 0.6)))
        if code == "FL":
            row.update(peak_time=start + (row["end_time"] - start) / 3,
                       goes_class=f"{rng.choice('BCCCMX')}{rng.uniform(1, 9.9):.1f}",
                       hpc_x=rng.uniform(-900, 900), hpc_y=rng.uniform(-500, 500))
        elif code == "CE":
            row.update(position_angle=rng.uniform(0, 360), angular_width=rng.lognormvariate(3.8, 0.5),
                       speed_km_s=rng.lognormvariate(6.0, 0.5), end_time=None)
        rows.append(row)
    with session_scope() as s:
        for k in range(0, len(rows), 5000):
            s.execute(insert(Event), rows[k:k + 5000])
        fl = Event(event_type="FL", source="goes_xrs", source_key="bench-flare", start_time=T_FLARE,
                   peak_time=T_FLARE + dt.timedelta(minutes=12), end_time=T_FLARE + dt.timedelta(minutes=30),
                   goes_class="M2.4", hpc_x=-420.0, hpc_y=310.0, noaa_ar=13664, attributes={})
        s.add(fl)
        s.flush()
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = 256
        yy, xx = np.mgrid[0:n, 0:n]
        disk = np.hypot(xx - n / 2 + 0.5, yy - n / 2 + 0.5) <= n * 0.4
        folder = settings.products / "SDI"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n_products):
            date_obs = T_FLARE + dt.timedelta(minutes=(i - n_products // 2) * 60 / max(n_products, 1))
            data = np.where(disk, 100.0 + 30.0 * np.exp(-((i - n_products / 2) / 3) ** 2), 0.0).astype(np.float32)
            h = fits.Header()
            h["DATE-OBS"] = date_obs.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
            h["BUNIT"], h["LEVEL"], h["RSUN_OBS"] = "erg cm-2 s-1 sr-1", "L2", 960.0
            for ax, ctype in (("1", "HPLN-TAN"), ("2", "HPLT-TAN")):
                h[f"CTYPE{ax}"], h[f"CUNIT{ax}"], h[f"CDELT{ax}"] = ctype, "arcsec", 960.0 / (n * 0.4)
                h[f"CRPIX{ax}"], h[f"CRVAL{ax}"] = n / 2 + 0.5, 0.0
            path = folder / f"lst_sdi_l2_bench_{i}_v1.fits"
            fits.HDUList([fits.PrimaryHDU(data, header=h), dq_table_hdu(np.zeros((n, n), np.uint8))]).writeto(
                path, checksum=True, overwrite=True)
            png = path.with_suffix(".png")
            plt.imsave(png, data, cmap="gray")
            f = Frame(channel_code="SDI", date_obs=date_obs, exposure_s=1.0, level="L1", naxis1=n, naxis2=n,
                      path=f"/raw/bench_{i}.fits", original_name=f"bench_{i}.fits", sha256=f"{i:064x}",
                      size_bytes=n * n * 2, header={"DATE-OBS": date_obs.isoformat()})
            s.add(f)
            s.flush()
            import hashlib

            p = Product(frame_id=f.id, level="L2", version=1, calibration_key="bench", params_hash="bench",
                        parameters={}, software_version="bench", state=ProductState.written, path=str(path),
                        sha256=hashlib.sha256(path.read_bytes()).hexdigest(), quicklook_path=str(png),
                        header={"BUNIT": "erg cm-2 s-1 sr-1"})
            s.add(p)
            s.flush()
            s.add(EventProduct(event_id=fl.id, product_id=p.id))
        return fl.id


def _serve(data_dir: Path, app_root: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "DATA_DIR": str(data_dir), "PYTHONPATH": str(app_root)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "backend.api.app:app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=app_root, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/api/v1/channels", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start within 60 s")


def _measure(browser, url: str, figure: str | None) -> dict[str, float | None]:
    context = browser.new_context(viewport={"width": 1280, "height": 1000})  # a cold browser: empty cache
    try:
        page = context.new_page()
        page.goto(url, wait_until="load", timeout=60_000)
        page.wait_for_function("performance.getEntriesByType('navigation')[0].loadEventEnd > 0", timeout=60_000)
        figure_ms = None
        if figure and page.locator(f"{figure}:is([data-figure-url], [data-timeline-url])").count():  # without it: none
            page.wait_for_selector(f"{figure}.js-plotly-plot", timeout=60_000)
            figure_ms = page.evaluate("performance.now()")
        # a paint may land after the load event (a small page loads before Chromium paints it)
        page.wait_for_function("performance.getEntriesByName('first-contentful-paint').length > 0", timeout=10_000)
        t = page.evaluate(_TIMINGS_JS)
        t["figure"] = figure_ms
        return t
    finally:
        context.close()


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=73_000, help="events seeded (default 73,000)")
    ap.add_argument("--products", type=int, default=12, help="SDI products around the flare (default 12)")
    ap.add_argument("--repeat", type=int, default=5, help="cold loads of each page (default 5)")
    ap.add_argument("--url", help="measure this running server instead of seeding one")
    ap.add_argument("--app-root", type=Path, default=ROOT,
                    help="serve the app of this checkout (default this one; another one to compare)")
    args = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: install Debian's chromium package")
    from playwright.sync_api import sync_playwright

    tmp = proc = None
    try:
        if args.url:
            url = args.url.rstrip("/")
            newest = json.load(urllib.request.urlopen(url + "/api/v1/events?limit=1"))["items"]
            event_id = newest[0]["id"] if newest else 1
        else:
            tmp = Path(tempfile.mkdtemp(prefix="lstdp-pages-"))
            t = time.perf_counter()
            event_id = _seed(tmp / "data", args.events, args.products)
            print(f"seeded {args.events} events and {args.products} SDI products in {time.perf_counter() - t:.1f} s")
            proc, url = _serve(tmp / "data", args.app_root.resolve())
        pages = [("events", "/", "#timeline"), ("event", f"/events/{event_id}", "#curves-figure"),
                 ("products", "/products", None), ("job_new", "/jobs/new", None)]
        results = {}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                for name, path, figure in pages:
                    urllib.request.urlopen(url + path).read()  # the server warm, the browser cold
                    runs = []
                    for _ in range(args.repeat):
                        runs.append(_measure(browser, url + path, figure))
                    results[name] = {k: _median([r[k] for r in runs]) for k in ("ttfb", "fcp", "dcl", "load",
                                                                              "figure", "bytes")}
                    r = results[name]
                    print(f"{name:9s} {path:24s} ttfb {_fmt(r['ttfb'])} ms  fcp {_fmt(r['fcp'])} ms  "
                          f"dcl {_fmt(r['dcl'])} ms  load {_fmt(r['load'])} ms  figure {_fmt(r['figure'])} ms  "
                          f"{(r['bytes'] or 0) / 1024:.0f} kB  (median of {args.repeat})")
            finally:
                browser.close()
        for name, r in results.items():
            print(f"RESULT page={name} fcp_ms={_fmt(r['fcp'])} dcl_ms={_fmt(r['dcl'])} load_ms={_fmt(r['load'])} "
                  f"figure_ms={_fmt(r['figure'])} kb={(r['bytes'] or 0) / 1024:.0f}")
        worst = max(r["fcp"] or float("inf") for r in results.values())
        ev = results["events"]
        ok = int(ev["fcp"] is not None and ev["fcp"] <= TARGET_MS)
        print(f"RESULT events_fcp_ms={_fmt(ev['fcp'])} events_load_ms={_fmt(ev['load'])} worst_fcp_ms={worst:.0f} "
              f"target_ms={TARGET_MS:.0f} ok={ok}")
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
