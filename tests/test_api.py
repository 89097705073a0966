"""REST API on real PostgreSQL (per-test rollback): filters, pagination, downloads, light
curves, jobs, and clear 4xx answers (never 500) for bad requests.

The app's session dependency yields the test's ``db_session``; rows are inserted here
(channels come from the migration), with small real FITS files and PNG quicklooks written
to ``tmp_path``. ``POST /jobs`` goes to the real Celery app on the default ``filesystem://``
broker in a temporary DATA_DIR (no worker runs): the job stays ``queued`` and its message
sits in ``DATA_DIR/broker/in``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
from astropy.io import fits
from fastapi.testclient import TestClient
from sqlalchemy import select

from backend.api.app import create_app
from backend.api.deps import get_session
from backend.models import (
    CalibrationFile,
    CalibrationKind,
    Event,
    EventAssociation,
    EventFrame,
    EventProduct,
    Frame,
    Job,
    JobState,
    Product,
    ProductCalibrationFile,
    ProductState,
)
from backend.services.products import disk_integrated_mean
from pipelines.products import dq_table_hdu, read_product
from tests.conftest import auth_headers, authorize, shared_app

pytestmark = pytest.mark.postgres

T0 = dt.datetime(2024, 5, 14, 16, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)
RADIANCE = "erg cm-2 s-1 sr-1"

# geometry of the small test products: 64 x 64 pixels of 40 arcsec, Sun of 800 arcsec
# (20 pixels) centred on pixel (31.5, 31.5) (0-based)
N = 64
CDELT = 40.0
RSUN_ARCSEC = 800.0


# -- factories (also used by test_browser.py) -----------------------------------------------


def make_frame(session, channel: str, date_obs: dt.datetime, **kw) -> Frame:
    """A frame row (its raw file is not needed by the API)."""
    key = uuid.uuid4().hex
    f = Frame(
        channel_code=channel, date_obs=date_obs, exposure_s=kw.pop("exposure_s", 1.0), level="L1",
        naxis1=N, naxis2=N, path=f"/nonexistent/raw/{key}.fits", original_name=f"{channel.lower()}_{key[:8]}.fits",
        sha256=hashlib.sha256(key.encode()).hexdigest(), size_bytes=N * N * 4,
        header=kw.pop("header", {"DATE-OBS": date_obs.isoformat(), "INSTRUME": "LST", "DETECTOR": channel}),
        **kw,
    )
    session.add(f)
    session.flush()
    return f


def product_image(disk_value: float, *, off_disk: float = 5000.0, hot: float = 1.0e6) -> tuple[np.ndarray, np.ndarray]:
    """A 64x64 float32 image: ``disk_value`` on the disk, ``off_disk`` outside, masked hot pixels.

    Returns the image and its DQ mask (non-zero = do not use): two on-disk hot pixels are
    flagged in DQ and one on-disk pixel is NaN, so only the DQ/NaN handling keeps the mean
    at ``disk_value``.
    """
    yy, xx = np.mgrid[0:N, 0:N]
    r = np.hypot(xx - 31.5, yy - 31.5) * CDELT
    data = np.where(r <= RSUN_ARCSEC, disk_value, off_disk).astype(np.float32)
    dq = np.zeros((N, N), dtype=np.uint8)
    data[30, 30] = hot
    data[33, 28] = hot
    dq[30, 30] = 1
    dq[33, 28] = 4
    data[31, 33] = np.nan
    return data, dq


def write_product_fits(path: Path, data: np.ndarray, dq: np.ndarray, date_obs: dt.datetime, *, bunit: str = RADIANCE) -> Path:
    """An L2 product file as the pipeline writes it: float32 primary + ``DQ`` table extension."""
    h = fits.Header()
    h["DATE-OBS"] = date_obs.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    h["BUNIT"] = bunit
    h["LEVEL"] = "L2"
    for ax, ctype in (("1", "HPLN-TAN"), ("2", "HPLT-TAN")):
        h[f"CTYPE{ax}"] = ctype
        h[f"CUNIT{ax}"] = "arcsec"
        h[f"CDELT{ax}"] = CDELT
        h[f"CRPIX{ax}"] = 32.5  # 1-based FITS pixel of the disk centre
        h[f"CRVAL{ax}"] = 0.0
    h["RSUN_OBS"] = RSUN_ARCSEC
    hdul = fits.HDUList([fits.PrimaryHDU(data.astype(np.float32), header=h), dq_table_hdu(dq)])
    path.parent.mkdir(parents=True, exist_ok=True)
    hdul.writeto(path, checksum=True, overwrite=True)
    return path


def write_png(path: Path, value: float = 0.5) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(path, np.full((16, 16), value), cmap="gray", vmin=0, vmax=1)
    return path


def make_product(
    session,
    frame: Frame,
    folder: Path | None,
    *,
    disk_value: float = 100.0,
    version: int = 1,
    state: ProductState = ProductState.written,
    quicklook: bool = True,
    bunit: str = RADIANCE,
) -> Product:
    """A product row; when ``folder`` is given and the state is written, its FITS file and quicklook too."""
    p = Product(
        frame_id=frame.id, level="L2", version=version, calibration_key=f"cal-v{version}",
        params_hash=uuid.uuid4().hex, parameters={}, software_version="0.1.0", state=state,
        header={"BUNIT": bunit}, stats={"mean": disk_value},
    )
    if folder is not None and state == ProductState.written:
        stem = f"lst_{frame.channel_code.lower()}_l2_{frame.id}_v{version}"
        data, dq = product_image(disk_value)
        fpath = write_product_fits(folder / f"{stem}.fits", data, dq, frame.date_obs, bunit=bunit)
        p.path = str(fpath)
        p.sha256 = hashlib.sha256(fpath.read_bytes()).hexdigest()
        if quicklook:
            p.quicklook_path = str(write_png(folder / f"{stem}.png"))
    session.add(p)
    session.flush()
    return p


def make_event(session, event_type: str, start: dt.datetime, peak=None, end=None, *, source="goes_xrs", **kw) -> Event:
    e = Event(event_type=event_type, source=source, source_key=uuid.uuid4().hex, start_time=start,
              peak_time=peak, end_time=end, attributes=kw.pop("attributes", {}), **kw)
    session.add(e)
    session.flush()
    return e


def make_calibration(session, channel: str, kind: CalibrationKind, version: int) -> CalibrationFile:
    c = CalibrationFile(channel_code=channel, kind=kind, version=version, valid_from=T0 - dt.timedelta(days=30),
                        valid_to=None, path=f"/cal/{channel}_{kind.value}_v{version}.fits",
                        sha256=hashlib.sha256(f"{channel}{kind}{version}".encode()).hexdigest(),
                        parameters={"n_frames": 16}, description=f"master {kind.value} v{version}")
    session.add(c)
    session.flush()
    return c


def route_celery_to_this_data_dir() -> None:
    """Point the Celery app at the current settings' broker (``DATA_DIR/broker/in`` for filesystem://).

    ``backend.broker.ensure_configured`` reconfigures the app when the settings
    change, but Celery keeps its producer pool (``app.amqp._producer_pool``), which still
    holds the transport options (broker folder) of the first test that sent a message;
    forget it so this test's messages land in this test's folder.
    """
    from backend.broker import app, ensure_configured

    ensure_configured()
    app.amqp._producer_pool = None


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def settings(settings_env):
    """Embedded-mode settings in a temporary DATA_DIR (product store, filesystem broker)."""
    return settings_env()


@pytest.fixture
def client(db_session, settings):
    def _session():
        yield db_session

    with shared_app() as app:  # one app per test process (tests/conftest.py)
        app.dependency_overrides[get_session] = _session
        with TestClient(app, raise_server_exceptions=False) as c:
            authorize(c, db_session)  # user "tester" with jobs:submit and jobs:cancel (POST /jobs needs a token)
            yield c


def test_the_shared_app_is_handed_out_once_at_a_time_and_refuses_a_test_that_changes_it():
    from starlette.routing import Route

    with shared_app() as app:
        with pytest.raises(RuntimeError, match="in use already"), shared_app():
            pass
    extra = Route("/nowhere", lambda request: None)
    try:
        with pytest.raises(AssertionError, match="changed the shared app"), shared_app() as app:
            app.router.routes.append(extra)
    finally:
        if extra in app.router.routes:
            app.router.routes.remove(extra)
    with shared_app() as again:
        assert again is app and not again.dependency_overrides


def assert_error(resp, status: int, *needles: str) -> dict:
    """``resp`` is a JSON error with ``status`` whose detail contains every needle."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert isinstance(body["detail"], str) and body["detail"]
    for n in needles:
        assert n in body["detail"], (n, body["detail"])
    return body


# -- health, channels -----------------------------------------------------------------------


def test_health(client):
    r = client.get("/api/v1/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["database"] == "ok" and body["broker"] == "ok"


def test_health_reports_a_broker_that_is_down_on_its_own(client, settings_env):
    """The database answers, the broker does not: 503 naming the broker, within about 1 s
    (issue 10: /health said ok while Redis was down)."""
    import time

    settings_env(CELERY_BROKER_URL="redis://127.0.0.1:1/0", CELERY_RESULT_BACKEND="redis://127.0.0.1:1/0")
    t0 = time.perf_counter()
    r = client.get("/api/v1/health")
    took = time.perf_counter() - t0
    body = r.json()
    assert r.status_code == 503 and body["status"] == "error"
    assert body["database"] == "ok" and body["broker"].startswith("broker unreachable"), body
    assert took < 5.0
    settings_env()
    assert client.get("/api/v1/health").json()["broker"] == "ok"


def test_openapi_lists_every_resource(client):
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    for p in ("/api/v1/channels", "/api/v1/frames/{frame_id}", "/api/v1/products/{product_id}/fits",
              "/api/v1/calibration-files", "/api/v1/events/{event_id}/lightcurve", "/api/v1/jobs/{job_id}"):
        assert p in paths
    assert client.get("/docs").status_code == 200


def test_openapi_light_curve_routes_document_the_same_query_parameters(client):
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    data = paths["/api/v1/events/{event_id}/lightcurve"]["get"]["parameters"]
    figure = paths["/api/v1/events/{event_id}/lightcurve/figure"]["get"]["parameters"]
    assert [(p["in"], p["name"]) for p in data] == [
        ("path", "event_id"), ("query", "channel"), ("query", "margin_min"), ("query", "region"),
        ("query", "context_frames"), ("query", "calibration_set")]
    assert figure == data
    by_name = {p["name"]: p for p in data}
    assert by_name["channel"]["schema"]["default"] == "SDI"
    assert (by_name["margin_min"]["schema"]["minimum"], by_name["margin_min"]["schema"]["maximum"]) == (0, 1440)
    assert by_name["region"]["schema"]["enum"] == ["auto", "disk", "roi"]
    assert by_name["context_frames"]["schema"]["default"] == 3


def test_channels(client):
    body = client.get("/api/v1/channels").json()
    assert body["total"] == 4
    assert [c["code"] for c in body["items"]] == ["SCI-UV", "SCI-WL", "SDI", "WST"]
    sci = client.get("/api/v1/channels/sci_uv").json()
    assert sci["code"] == "SCI-UV" and sci["bunit"] == "MSB" and sci["fov_rsun_min"] == 1.1
    assert sci["wavelength_nm"] == 121.6
    assert_error(client.get("/api/v1/channels/EIT"), 404, "unknown LST channel")


# -- frames ---------------------------------------------------------------------------------


def test_frames_filters_and_pagination(client, db_session):
    sdi = [make_frame(db_session, "SDI", T0 + i * 10 * MIN) for i in range(5)]
    make_frame(db_session, "WST", T0 + 5 * MIN)
    make_frame(db_session, "WST", T0 + 15 * MIN)

    body = client.get("/api/v1/frames", params={"channel": "sdi"}).json()
    assert body["total"] == 5 and body["limit"] == 50 and body["offset"] == 0
    assert [f["id"] for f in body["items"]] == [f.id for f in sdi]
    assert body["items"][0]["date_obs"] == "2024-05-14T16:00:00Z"
    assert "header" not in body["items"][0]

    body = client.get("/api/v1/frames", params={"limit": 2, "offset": 2}).json()
    assert body["total"] == 7 and body["limit"] == 2 and body["offset"] == 2
    assert len(body["items"]) == 2
    # DATE-OBS order across channels: 16:00 SDI, 16:05 WST, 16:10 SDI, 16:15 WST, ...
    assert [f["channel"] for f in body["items"]] == ["SDI", "WST"]

    body = client.get("/api/v1/frames", params={
        "channel": "SDI", "start": "2024-05-14T16:10:00Z", "end": "2024-05-14T16:30:00"}).json()
    assert [f["id"] for f in body["items"]] == [sdi[1].id, sdi[2].id, sdi[3].id]
    # offsets other than UTC are converted
    body = client.get("/api/v1/frames", params={"channel": "SDI", "start": "2024-05-15T00:35:00+08:00"}).json()
    assert [f["id"] for f in body["items"]] == [sdi[4].id]
    assert client.get("/api/v1/frames", params={"offset": 100}).json() == {
        "items": [], "total": 7, "limit": 50, "offset": 100}


def test_frame_detail_has_header(client, db_session):
    f = make_frame(db_session, "SCI-UV", T0, header={"DATE-OBS": "2024-05-14T16:00:00", "WAVELNTH": 121.6})
    body = client.get(f"/api/v1/frames/{f.id}").json()
    assert body["channel"] == "SCI-UV"
    assert body["header"]["WAVELNTH"] == 121.6
    assert body["sha256"] == f.sha256
    assert_error(client.get(f"/api/v1/frames/{f.id + 1000}"), 404, f"no frame with id {f.id + 1000}")


# -- bad requests: 4xx with a message, never 500 ---------------------------------------------


BAD_REQUESTS = [
    ("/api/v1/frames?channel=EIT", 422, ["query.channel", "unknown LST channel 'EIT'"]),
    ("/api/v1/products?channel=HXI", 422, ["unknown LST channel"]),
    ("/api/v1/events?channel=sdi2", 422, ["unknown LST channel"]),
    ("/api/v1/frames?start=2024-05-02T00:00:00&end=2024-05-01T00:00:00", 422, ["query.end", "is before start"]),
    ("/api/v1/events?start=2024-05-02&end=2024-05-01", 422, ["is before start"]),
    ("/api/v1/frames?limit=0", 422, ["query.limit", "greater than or equal to 1"]),
    ("/api/v1/frames?limit=10000", 422, ["query.limit", "less than or equal to 500"]),
    ("/api/v1/products?limit=-5", 422, ["query.limit"]),
    ("/api/v1/events?limit=501", 422, ["query.limit"]),
    ("/api/v1/jobs?limit=0", 422, ["query.limit"]),
    ("/api/v1/frames?offset=-1", 422, ["query.offset"]),
    ("/api/v1/frames?offset=99999999999999999999", 422, ["query.offset"]),
    ("/api/v1/frames?start=yesterday", 422, ["query.start"]),
    ("/api/v1/frames?end=2024-13-45T99:00", 422, ["query.end"]),
    ("/api/v1/events?start=not-a-time", 422, ["query.start"]),
    ("/api/v1/frames/abc", 422, ["path.frame_id"]),
    ("/api/v1/frames/0", 422, ["path.frame_id"]),
    ("/api/v1/frames/99999999999", 422, ["path.frame_id", "less than or equal to 2147483647"]),
    ("/api/v1/products?state=done", 422, ["query.state", "planned"]),
    ("/api/v1/products?frame_id=x", 422, ["query.frame_id"]),
    ("/api/v1/calibration-files?kind=bias", 422, ["query.kind", "dark"]),
    ("/api/v1/events?type=XX", 422, ["unknown HEK event type 'XX'"]),
    ("/api/v1/events/timeline/figure?limit=0", 422, ["query.limit"]),
    ("/api/v1/events/timeline/figure?type=flare", 422, ["unknown HEK event type"]),
    ("/api/v1/events/1/lightcurve?channel=AIA", 422, ["unknown LST channel 'AIA'"]),
    ("/api/v1/events/1/lightcurve?margin_min=-3", 422, ["query.margin_min"]),
    ("/api/v1/events/1/lightcurve/figure?margin_min=1e9", 422, ["query.margin_min"]),
    ("/api/v1/events/1/lightcurve/figure?channel=AIA", 422, ["unknown LST channel 'AIA'"]),
    ("/api/v1/events/1/lightcurve?region=box", 422, ["query.region"]),
    ("/api/v1/events/1/lightcurve/figure?context_frames=51", 422, ["query.context_frames"]),
    ("/api/v1/frames/424242", 404, ["no frame with id 424242"]),
    ("/api/v1/products/424242", 404, ["no product with id 424242"]),
    ("/api/v1/products/424242/fits", 404, ["no product with id 424242"]),
    ("/api/v1/products/424242/quicklook.png", 404, ["no product with id 424242"]),
    ("/api/v1/calibration-files/424242", 404, ["no calibration file with id 424242"]),
    ("/api/v1/events/424242", 404, ["no event with id 424242"]),
    ("/api/v1/events/424242/lightcurve", 404, ["no event with id 424242"]),
    ("/api/v1/events/424242/lightcurve/figure", 404, ["no event with id 424242"]),
    ("/api/v1/jobs/00000000-0000-0000-0000-000000000000", 404, ["no job with id"]),
    ("/api/v1/jobs/" + "x" * 80, 404, ["no job with id"]),
    ("/api/v1/jobs/%00", 404, ["no job with id"]),
    ("/api/v1/events?source=goes%00xrs", 422, ["query.source"]),
    ("/api/v1/nothing-here", 404, ["Not Found"]),
]


@pytest.mark.parametrize("url,status,needles", BAD_REQUESTS, ids=[u for u, _, _ in BAD_REQUESTS])
def test_bad_requests_are_4xx_with_a_message(client, url, status, needles):
    body = assert_error(client.get(url), status, *needles)
    if status == 422 and "errors" in body:
        assert all({"loc", "msg", "type"} <= set(e) for e in body["errors"])


def test_far_timezone_offsets_are_not_a_server_error(client):
    r = client.get("/api/v1/frames", params={"start": "0001-01-01T00:00:00+05:00"})
    assert r.status_code == 422 and "out of range" in r.json()["detail"]
    r = client.get("/api/v1/frames", params={"end": "9999-12-31T23:59:59-05:00"})
    assert r.status_code == 422


# -- products -------------------------------------------------------------------------------


def test_products_filters_and_detail(client, db_session, tmp_path):
    f1 = make_frame(db_session, "SDI", T0)
    f2 = make_frame(db_session, "SDI", T0 + 10 * MIN)
    f3 = make_frame(db_session, "SCI-WL", T0 + 5 * MIN)
    dark = make_calibration(db_session, "SDI", CalibrationKind.dark, 2)
    flat = make_calibration(db_session, "SDI", CalibrationKind.flat, 1)
    p1 = make_product(db_session, f1, tmp_path)
    db_session.add_all([ProductCalibrationFile(product_id=p1.id, calibration_file_id=dark.id),
                        ProductCalibrationFile(product_id=p1.id, calibration_file_id=flat.id)])
    p1b = make_product(db_session, f1, tmp_path, version=2, disk_value=120.0)
    p2 = make_product(db_session, f2, None, state=ProductState.failed)
    p3 = make_product(db_session, f3, tmp_path, bunit="MSB")
    db_session.flush()

    body = client.get("/api/v1/products").json()
    assert body["total"] == 4
    assert [p["id"] for p in body["items"]] == [p1.id, p1b.id, p3.id, p2.id]
    item = body["items"][0]
    assert item["channel"] == "SDI" and item["date_obs"] == "2024-05-14T16:00:00Z"
    assert item["fits_url"] == f"/api/v1/products/{p1.id}/fits"
    assert item["quicklook_url"] == f"/api/v1/products/{p1.id}/quicklook.png"
    assert "quicklook_path" not in item

    def ids(**params):
        return [p["id"] for p in client.get("/api/v1/products", params=params).json()["items"]]

    assert ids(channel="SCI_WL") == [p3.id]
    assert ids(state="failed") == [p2.id]
    assert ids(frame_id=f1.id) == [p1.id, p1b.id]
    assert ids(channel="SDI", start="2024-05-14T16:05:00Z") == [p2.id]
    assert ids(limit=1, offset=1) == [p1b.id]
    assert client.get("/api/v1/products", params={"state": "written", "limit": 1}).json()["total"] == 3

    d = client.get(f"/api/v1/products/{p1.id}").json()
    assert d["frame_id"] == f1.id and d["version"] == 1 and d["state"] == "written"
    assert sorted((c["kind"], c["version"]) for c in d["calibration_files"]) == [("dark", 2), ("flat", 1)]
    assert d["header"] == {"BUNIT": RADIANCE}
    failed = client.get(f"/api/v1/products/{p2.id}").json()
    assert failed["fits_url"] is None and failed["quicklook_url"] is None and failed["calibration_files"] == []


def test_product_fits_and_quicklook_downloads(client, db_session, tmp_path, settings):
    f = make_frame(db_session, "SDI", T0)
    p = make_product(db_session, f, settings.products / "SDI", disk_value=42.0)
    r = client.get(f"/api/v1/products/{p.id}/fits")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/fits"
    assert Path(p.path).name in r.headers["content-disposition"]
    assert hashlib.sha256(r.content).hexdigest() == p.sha256
    out = tmp_path / "downloaded.fits"
    out.write_bytes(r.content)
    from pipelines.products import read_product

    data, dq, _ = read_product(out)
    assert data.dtype.name == "float32" and dq.shape == (N, N)

    r = client.get(f"/api/v1/products/{p.id}/quicklook.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.content[:8] == b"\x89PNG\r\n\x1a\n"

    planned = make_product(db_session, f, None, version=2, state=ProductState.planned)
    assert_error(client.get(f"/api/v1/products/{planned.id}/fits"), 404, "is planned", "not written")
    assert_error(client.get(f"/api/v1/products/{planned.id}/quicklook.png"), 404, "has no quicklook")

    Path(p.path).unlink()
    Path(p.quicklook_path).unlink()
    assert_error(client.get(f"/api/v1/products/{p.id}/fits"), 404, "missing from the product store")
    assert_error(client.get(f"/api/v1/products/{p.id}/quicklook.png"), 404, "missing from the product store")


def test_a_stored_path_outside_the_product_store_is_never_served(client, db_session, settings, tmp_path):
    """Issue 10 (limits): the row's path is not trusted: a file outside the store (an
    absolute path elsewhere, ``..`` out of it, a link pointing out) is a 404, not served."""
    f = make_frame(db_session, "SDI", T0)
    outside = make_product(db_session, f, tmp_path / "elsewhere", disk_value=1.0)  # a real file, not in the store
    assert Path(outside.path).is_file()
    assert_error(client.get(f"/api/v1/products/{outside.id}/fits"), 404, "missing from the product store")
    assert_error(client.get(f"/api/v1/products/{outside.id}/quicklook.png"), 404, "missing from the product store")
    inside = make_product(db_session, f, settings.products / "SDI", version=2, disk_value=2.0)
    inside.path = os.path.relpath(outside.path, settings.products)  # '../../elsewhere/...': climbs out
    assert inside.path.startswith("..") and (settings.products / inside.path).resolve().is_file()
    link = settings.products / "SDI" / "link.png"
    link.symlink_to(outside.quicklook_path)
    inside.quicklook_path = str(link)
    db_session.flush()
    assert client.get(f"/api/v1/products/{inside.id}/fits").status_code == 404
    assert client.get(f"/api/v1/products/{inside.id}/quicklook.png").status_code == 404


def test_relative_product_paths_resolve_in_the_product_store(client, db_session, settings):
    f = make_frame(db_session, "WST", T0)
    p = make_product(db_session, f, settings.products / "WST", disk_value=7.0)
    p.path = str(Path(p.path).relative_to(settings.products))
    p.quicklook_path = str(Path(p.quicklook_path).relative_to(settings.products))
    db_session.flush()
    assert client.get(f"/api/v1/products/{p.id}/fits").status_code == 200
    assert client.get(f"/api/v1/products/{p.id}/quicklook.png").status_code == 200


# -- calibration files ----------------------------------------------------------------------


def test_calibration_files(client, db_session):
    d1 = make_calibration(db_session, "SDI", CalibrationKind.dark, 1)
    d2 = make_calibration(db_session, "SDI", CalibrationKind.dark, 2)
    fl = make_calibration(db_session, "SDI", CalibrationKind.flat, 1)
    sl = make_calibration(db_session, "SCI-UV", CalibrationKind.stray_light, 3)
    body = client.get("/api/v1/calibration-files", params={"channel": "SDI", "kind": "dark"}).json()
    assert body["total"] == 2
    assert [(c["id"], c["version"]) for c in body["items"]] == [(d2.id, 2), (d1.id, 1)]  # newest first
    assert client.get("/api/v1/calibration-files", params={"channel": "SDI"}).json()["total"] == 3
    assert [c["id"] for c in client.get("/api/v1/calibration-files", params={"kind": "stray_light"}).json()["items"]] == [sl.id]
    one = client.get(f"/api/v1/calibration-files/{fl.id}").json()
    assert one["kind"] == "flat" and one["channel"] == "SDI" and one["parameters"] == {"n_frames": 16}
    assert one["valid_from"] == "2024-04-14T16:00:00Z" and one["valid_to"] is None


# -- events ---------------------------------------------------------------------------------


@pytest.fixture
def events(db_session):
    """A flare with its associated CME and a WST flare, an unrelated later flare, a prominence."""
    fl = make_event(db_session, "FL", T0, T0 + 12 * MIN, T0 + 30 * MIN, goes_class="M1.2", hpc_x=-420.5,
                    hpc_y=310.0, noaa_ar=13664, frm_name="SWPC", channels=None)
    ce = make_event(db_session, "CE", T0 + 20 * MIN, None, T0 + 200 * MIN, source="cdaw", position_angle=285.0,
                    angular_width=120.0, speed_km_s=950.0)
    wfl = make_event(db_session, "FL", T0 + 2 * MIN, T0 + 10 * MIN, T0 + 25 * MIN, source="lst_wst",
                     channels="WST", frm_name="LST WST flare list")
    late = make_event(db_session, "FL", T0 + dt.timedelta(days=2), T0 + dt.timedelta(days=2, minutes=5),
                      T0 + dt.timedelta(days=2, minutes=9), goes_class="C2.0")
    pr = make_event(db_session, "PR", T0 + 300 * MIN, None, None, source="detected", channels="SCI-UV",
                    position_angle=80.0, frm_name="lstdp-prominence", frm_version="0.1")
    # associations are stored both ways, as the catalogue import does
    db_session.add_all([EventAssociation(event_id=fl.id, other_event_id=ce.id, kind="flare_cme"),
                        EventAssociation(event_id=ce.id, other_event_id=fl.id, kind="cme_flare"),
                        EventAssociation(event_id=wfl.id, other_event_id=fl.id, kind="same_flare"),
                        EventAssociation(event_id=fl.id, other_event_id=wfl.id, kind="same_flare")])
    db_session.flush()
    return {"fl": fl, "ce": ce, "wfl": wfl, "late": late, "pr": pr}


def test_events_filters_and_pagination(client, events):
    def ids(**params):
        body = client.get("/api/v1/events", params=params).json()
        return [e["id"] for e in body["items"]], body["total"]

    e = events
    all_ids, total = ids()
    assert total == 5 and set(all_ids) == {x.id for x in e.values()}
    assert ids(type="FL")[1] == 3
    assert set(ids(type="fl")[0]) == {e["fl"].id, e["wfl"].id, e["late"].id}
    assert ids(type="CE")[0] == [e["ce"].id]
    assert ids(source="cdaw")[0] == [e["ce"].id]
    assert set(ids(source="goes_xrs")[0]) == {e["fl"].id, e["late"].id}
    # overlap: the CME (16:20-19:20) overlaps 18:00-18:30; the flares (end 16:30) do not
    assert ids(start="2024-05-14T18:00:00Z", end="2024-05-14T18:30:00Z")[0] == [e["ce"].id]
    assert set(ids(type="FL", end="2024-05-14T16:01:00Z")[0]) == {e["fl"].id}
    assert ids(type="FL", start="2024-05-15T00:00:00Z")[0] == [e["late"].id]
    assert ids(channel="WST")[0] == [e["wfl"].id]
    page, total = ids(limit=2, offset=1)
    assert total == 5 and len(page) == 2


def test_event_detail_with_associations_and_links(client, db_session, events, tmp_path):
    fl = events["fl"]
    f = make_frame(db_session, "SDI", T0 + 10 * MIN)
    p = make_product(db_session, f, tmp_path)
    db_session.add_all([EventFrame(event_id=fl.id, frame_id=f.id), EventProduct(event_id=fl.id, product_id=p.id)])
    db_session.flush()
    d = client.get(f"/api/v1/events/{fl.id}").json()
    assert d["event_type"] == "FL" and d["goes_class"] == "M1.2" and d["noaa_ar"] == 13664
    assert d["hpc_x"] == -420.5 and d["hpc_y"] == 310.0
    assert d["start_time"] == "2024-05-14T16:00:00Z" and d["peak_time"] == "2024-05-14T16:12:00Z"
    assert d["frame_ids"] == [f.id] and d["product_ids"] == [p.id]
    assoc = {(a["event"]["id"], a["kind"]) for a in d["associated"]}
    assert assoc == {(events["ce"].id, "flare_cme"), (events["wfl"].id, "same_flare")}
    assert [a["event"]["id"] for a in d["associated"]] == [events["wfl"].id, events["ce"].id]  # by start time
    ce = client.get(f"/api/v1/events/{events['ce'].id}").json()
    assert ce["position_angle"] == 285.0 and ce["angular_width"] == 120.0 and ce["speed_km_s"] == 950.0
    assert fl.id in {a["event"]["id"] for a in ce["associated"]}
    assert client.get(f"/api/v1/events/{events['late'].id}").json()["associated"] == []


def test_events_timeline_figure(client, events):
    fig = client.get("/api/v1/events/timeline/figure").json()
    assert set(fig) >= {"data", "layout"}
    assert fig["layout"]["title"]["text"] == "Event timeline: 5 events"
    names = {t["name"] for t in fig["data"] if t["type"] == "bar"}
    assert names == {"FL (Flare)", "CE (Coronal mass ejection)"}
    ids = {i for t in fig["data"] if t["type"] == "scatter" for i in t["customdata"]}
    assert ids == {e.id for e in events.values()}

    fig = client.get("/api/v1/events/timeline/figure", params={"type": "FL", "limit": 2}).json()
    assert fig["layout"]["title"]["text"] == "Event timeline: newest 2 of 3 events shown (capped)"
    drawn = {i for t in fig["data"] if t["type"] == "scatter" for i in t["customdata"]}
    fl3 = sorted((events[k] for k in ("fl", "wfl", "late")), key=lambda e: e.start_time)
    assert drawn == {fl3[1].id, fl3[2].id}, "the capped timeline keeps the newest events"


# -- light curves ---------------------------------------------------------------------------


def test_disk_integrated_mean_skips_dq_nan_and_off_disk(tmp_path):
    rng = np.random.default_rng(1)
    data, dq = product_image(0.0)
    disk = np.hypot(*np.mgrid[0:N, 0:N][::-1] - 31.5) * CDELT <= RSUN_ARCSEC
    values = rng.uniform(50, 150, (N, N)).astype(np.float32)
    data = np.where(disk, values, data)
    data[30, 30] = 1e6
    data[33, 28] = 1e6
    data[31, 33] = np.nan
    path = write_product_fits(tmp_path / "p.fits", data, dq, T0)
    m = disk_integrated_mean(path)
    good = disk & (dq == 0) & np.isfinite(data)
    assert m.on_disk_only and m.unit == RADIANCE
    assert m.n_pixels == int(good.sum()) and m.n_pixels < int(disk.sum())
    assert m.value == pytest.approx(float(data[good].astype(np.float64).mean()), rel=1e-12)
    # coronagraph mode: every usable pixel, off-disk included
    everywhere = disk_integrated_mean(path, on_disk_only=False)
    ok = (dq == 0) & np.isfinite(data)
    assert not everywhere.on_disk_only and everywhere.n_pixels == int(ok.sum())
    assert everywhere.value == pytest.approx(float(data[ok].astype(np.float64).mean()), rel=1e-12)


def test_event_lightcurve_reads_written_products(client, db_session, events, tmp_path):
    fl = events["fl"]  # 16:00 - 16:30; window with the default 30 min margin: 15:30 - 17:00
    inside = []
    for i, minutes in enumerate((-20, 0, 12, 45)):
        f = make_frame(db_session, "SDI", T0 + minutes * MIN)
        inside.append((f, make_product(db_session, f, tmp_path, disk_value=100.0 + 10 * i)))
    # a newer version of the 16:12 frame replaces its v1 point
    f12, _ = inside[2]
    newer = make_product(db_session, f12, tmp_path, version=2, disk_value=500.0)
    # not used: outside the window, another channel, not written
    make_product(db_session, make_frame(db_session, "SDI", T0 + 90 * MIN), tmp_path, disk_value=1.0)
    wst = make_product(db_session, make_frame(db_session, "WST", T0 + 5 * MIN), tmp_path, disk_value=2.0)
    make_product(db_session, make_frame(db_session, "SDI", T0 + 5 * MIN), None, state=ProductState.planned)

    disk = {"region": "disk", "context_frames": 0}
    lc = client.get(f"/api/v1/events/{fl.id}/lightcurve", params=disk).json()
    assert lc["channel"] == "SDI" and lc["unit"] == RADIANCE and lc["event_id"] == fl.id
    assert lc["window_start"] == "2024-05-14T15:30:00Z" and lc["window_end"] == "2024-05-14T17:00:00Z"
    assert lc["times"] == ["2024-05-14T15:40:00Z", "2024-05-14T16:00:00Z", "2024-05-14T16:12:00Z", "2024-05-14T16:45:00Z"]
    assert lc["product_ids"] == [inside[0][1].id, inside[1][1].id, newer.id, inside[3][1].id]
    # the DQ-flagged hot pixels, the NaN and the off-disk sky would all move these means
    assert lc["values"] == pytest.approx([100.0, 110.0, 500.0, 130.0], rel=1e-6)
    assert lc["skipped"] == []

    narrow = client.get(f"/api/v1/events/{fl.id}/lightcurve", params={"margin_min": 0, **disk}).json()
    assert narrow["product_ids"] == [inside[1][1].id, newer.id]
    other = client.get(f"/api/v1/events/{fl.id}/lightcurve", params={"channel": "wst", **disk}).json()
    assert other["channel"] == "WST" and other["product_ids"] == [wst.id] and other["values"] == pytest.approx([2.0])

    fig = client.get(f"/api/v1/events/{fl.id}/lightcurve/figure", params=disk).json()
    assert fig["data"][0]["y"] == pytest.approx([100.0, 110.0, 500.0, 130.0], rel=1e-6)
    assert [s["name"] for s in fig["layout"]["shapes"]] == ["start", "peak", "end"]
    assert fig["layout"]["yaxis"]["title"]["text"] == f"Disk-integrated mean [{RADIANCE}]"


def test_lightcurve_skips_unreadable_products(client, db_session, events, tmp_path):
    f = make_frame(db_session, "SDI", T0 + 5 * MIN)
    p = make_product(db_session, f, tmp_path)
    Path(p.path).write_bytes(b"this is not FITS at all" * 200)
    ok = make_product(db_session, make_frame(db_session, "SDI", T0 + 6 * MIN), tmp_path, disk_value=77.0)
    lc = client.get(f"/api/v1/events/{events['fl'].id}/lightcurve", params={"region": "disk"}).json()
    assert lc["product_ids"] == [ok.id] and lc["values"] == pytest.approx([77.0])
    assert [s["product_id"] for s in lc["skipped"]] == [p.id]
    assert "unreadable" in lc["skipped"][0]["reason"]


def test_lightcurve_of_event_without_products_is_empty(client, events):
    lc = client.get(f"/api/v1/events/{events['late'].id}/lightcurve").json()
    assert lc["times"] == [] and lc["values"] == [] and lc["unit"] == RADIANCE
    fig = client.get(f"/api/v1/events/{events['pr'].id}/lightcurve/figure").json()
    assert [s["name"] for s in fig["layout"]["shapes"]] == ["start"]


# -- jobs -----------------------------------------------------------------------------------


def _broker_messages(settings) -> list[str]:
    return [p.read_text() for p in sorted((settings.broker_dir / "in").glob("*")) if p.is_file()]


def test_post_job_queues_it_on_the_filesystem_broker(client, db_session, settings):
    route_celery_to_this_data_dir()
    make_calibration(db_session, "SDI", CalibrationKind.dark, 3)
    before = _broker_messages(settings)
    job = {"channels": ["sdi", "SCI_UV"], "start": "2024-05-14T15:00:00Z", "end": "2024-05-14T18:00:00",
           "pinned_calibrations": {"dark": 3}}
    # the owner is the token's user; a body that names one is refused (it would be a claim, not a fact)
    assert_error(client.post("/api/v1/jobs", json={**job, "owner": "lst-team"}), 422, "owner", "API token")
    team = auth_headers(db_session, "lst-team", ["jobs:submit"])
    r = client.post("/api/v1/jobs", json=job, headers=team)
    assert r.status_code == 202, r.text
    body = r.json()
    assert r.headers["location"] == f"/api/v1/jobs/{body['id']}"
    assert body["state"] == "queued" and body["progress"] == 0.0 and body["owner"] == "lst-team"
    assert body["parameters"]["channels"] == ["SCI-UV", "SDI"]
    assert body["parameters"]["pinned_calibrations"] == {"dark": 3}

    row = db_session.get(Job, body["id"])
    assert row is not None and row.state == JobState.queued
    new = [m for m in _broker_messages(settings) if m not in before]
    assert len(new) == 1 and body["id"] in new[0] and "pipelines.tasks.run_job" in new[0]

    got = client.get(r.headers["location"], headers=team).json()  # a user's job is theirs (and admins')
    assert got["id"] == body["id"] and got["state"] == "queued"
    assert {"total", "done", "failed", "skipped", "progress", "error", "created_at", "started_at",
            "finished_at"} <= set(got)
    listing = client.get("/api/v1/jobs", headers=team).json()
    assert listing["total"] >= 1 and body["id"] in [j["id"] for j in listing["items"]]
    assert body["id"] not in [j["id"] for j in client.get("/api/v1/jobs").json()["items"]]  # not another user's


def test_job_progress_fraction(client, db_session):
    job = Job(owner="tester", parameters={}, state=JobState.running, total=8, done=3, failed=1, skipped=2)
    done = Job(owner="tester", parameters={}, state=JobState.failed, total=0, error="no frames in the range")
    db_session.add_all([job, done])
    db_session.flush()
    body = client.get(f"/api/v1/jobs/{job.id}").json()
    assert body["progress"] == pytest.approx(6 / 8)
    assert (body["done"], body["failed"], body["skipped"], body["total"]) == (3, 1, 2, 8)
    body = client.get(f"/api/v1/jobs/{done.id}").json()
    assert body["progress"] == 1.0 and body["error"] == "no frames in the range" and body["state"] == "failed"


BAD_JOBS = [
    ({"channels": ["AIA"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z"}, ["unknown channel 'AIA'"]),
    ({"channels": [], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z"}, ["body.channels"]),
    ({"channels": ["SDI"], "start": "2024-05-15T00:00:00Z", "end": "2024-05-14T00:00:00Z"}, ["end is before start"]),
    ({"channels": ["SDI"], "start": "soon", "end": "2024-05-14T00:00:00Z"}, ["body.start"]),
    ({"channels": ["SDI"], "start": "2024-05-14T00:00:00Z"}, ["body.end", "Field required"]),
    ({"channels": ["SDI"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z",
      "pinned_calibrations": {"bias": 1}}, ["unknown calibration kind 'bias'"]),
    ({"channels": ["SDI"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z",
      "pinned_calibrations": {"flat": 0}}, ["calibration version must be between 1 and"]),
    ({"channels": ["SDI"], "start": "2024-05-14T00:00:00Z", "end": "2024-05-15T00:00:00Z",
      "pinned_calibrations": {"dark": 9}}, ["no dark calibration file version 9 for channel(s) SDI"]),
]


@pytest.mark.parametrize("payload,needles", BAD_JOBS)
def test_bad_job_requests_are_422_and_store_nothing(client, db_session, payload, needles):
    route_celery_to_this_data_dir()
    n_before = len(list(db_session.scalars(select(Job.id))))
    assert_error(client.post("/api/v1/jobs", json=payload), 422, *needles)
    assert len(list(db_session.scalars(select(Job.id)))) == n_before


def test_malformed_job_bodies_are_422(client):
    assert_error(client.post("/api/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}),
                 422, "JSON")
    assert_error(client.post("/api/v1/jobs"), 422, "body", "Field required")
    assert_error(client.post("/api/v1/jobs", json=[1, 2]), 422, "body")


def test_post_job_when_the_broker_fails_marks_it_failed(client, db_session, monkeypatch):
    def broken(job_id):
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr("backend.services.jobs.enqueue_job", broken)
    r = client.post("/api/v1/jobs", json={"channels": ["WST"], "start": "2024-05-14T00:00:00Z",
                                          "end": "2024-05-14T01:00:00Z"})
    body = assert_error(r, 503, "could not be sent to the broker", "broker unreachable")
    job_id = body["detail"].split()[1]
    row = db_session.get(Job, job_id)
    assert row.state == JobState.failed and "broker unreachable" in row.error and row.finished_at is not None


def test_no_route_answers_500_to_garbage(client, db_session, events):
    """Every GET route, fed odd values in every parameter, answers below 500."""
    odd = ["", "%00", "\x00", "a\x00b", "'; DROP TABLE events; --", "９", "1e308", "-0", "null", "𝔰𝔡𝔦", "2024-02-30"]
    routes = ["/api/v1/frames", "/api/v1/products", "/api/v1/events", "/api/v1/calibration-files", "/api/v1/jobs",
              "/api/v1/events/timeline/figure", f"/api/v1/events/{events['fl'].id}/lightcurve"]
    params = ["channel", "start", "end", "limit", "offset", "type", "source", "state", "frame_id", "kind",
              "margin_min"]
    for route in routes:
        for p in params:
            for v in odd:
                r = client.get(route, params={p: v})
                assert r.status_code < 500, (route, p, v, r.status_code, r.text)
    for v in ("%00", "%2500", "x" * 5000, "'; DROP TABLE events; --", "９", "1e308", "-0", "null", "𝔰𝔡𝔦"):
        for base in ("/api/v1/frames/", "/api/v1/products/", "/api/v1/events/", "/api/v1/jobs/",
                     "/api/v1/calibration-files/", "/api/v1/channels/"):
            r = client.get(base + v)
            assert r.status_code < 500, (base, v, r.status_code, r.text)


# -- database down, pages -------------------------------------------------------------------


def test_database_down_is_503_not_500(settings):
    from sqlalchemy.orm import Session

    from backend.db import make_engine

    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/nowhere")  # nothing listens on port 1
    app = create_app()

    def _session():
        with Session(engine) as s:
            yield s

    app.dependency_overrides[get_session] = _session
    try:
        with TestClient(app, raise_server_exceptions=False) as c:
            r = c.get("/api/v1/health")
            assert r.status_code == 503 and r.json()["status"] == "error" and r.json()["database"]
            assert_error(c.get("/api/v1/frames"), 503, "database is unavailable")
            r = c.get("/")
            assert r.status_code == 503 and "database is unavailable" in r.text and r.headers["content-type"].startswith("text/html")
    finally:
        engine.dispose()


def test_pages_render_and_bad_page_input_is_explained(client, db_session, events, tmp_path):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert f'href="/events/{events["fl"].id}"' in r.text and "/static/vendor/plotly-basic.min.js" in r.text
    # the landing timeline: all matching events (the filters without the window, which rides apart)
    assert 'data-timeline-url="/api/v1/events/histogram/figure?"' in r.text
    r = client.get("/", params={"type": "fl", "start": "2024-05-14T15:00", "source": "goes_xrs"})
    assert r.text.count("data-event-id=") == 2  # the M1.2 flare and the later C2.0, not the WST flare
    assert f'data-event-id="{events["late"].id}"' in r.text and f'data-event-id="{events["wfl"].id}"' not in r.text
    assert 'data-timeline-url="/api/v1/events/histogram/figure?type=FL&amp;source=goes_xrs"' in r.text
    assert 'data-window-start="2024-05-14T15:00:00Z"' in r.text
    r = client.get("/", params={"type": "QQ", "start": "noon", "end": "2024-01-01T00:00"})
    assert r.status_code == 200
    assert "unknown HEK event type &#39;QQ&#39;" in r.text and "start: &#39;noon&#39; is not a date and time" in r.text
    r = client.get("/", params={"start": "2024-05-15T00:00", "end": "2024-05-14T00:00"})
    assert "end is before start" in r.text and r.text.count("data-event-id=") == 5
    r = client.get("/", params={"source": "a\x00b"})
    assert r.status_code == 200 and "is not a source name" in r.text

    d = client.get(f"/events/{events['ce'].id}")
    assert d.status_code == 200
    assert "285° (CCW from solar north)" in d.text and "950 km/s" in d.text
    assert f'href="/events/{events["fl"].id}"' in d.text
    # the curves section is always there; its figure says when no SDI product is in the window
    ce_id = events["ce"].id
    assert f'data-figure-url="/api/v1/events/{ce_id}/curves/figure?channel=SDI"' in d.text
    notes = [a.get("name") for a in client.get(f"/api/v1/events/{ce_id}/curves/figure").json()["layout"]["annotations"]]
    assert "no-lst" in notes and "no-xrs" in notes

    nf = client.get("/events/424242")
    assert nf.status_code == 404 and "no event with id 424242" in nf.text and nf.headers["content-type"].startswith("text/html")
    assert client.get("/events/abc").status_code == 422
    assert client.get("/jobs/no-such-job").status_code == 404
    assert client.get("/jobs/%00").status_code == 404
    for url in ("/products", "/jobs/new", "/jobs"):
        r = client.get(url)
        assert r.status_code == 200, url
    assert client.get("/static/app.js").headers["content-type"].startswith(("application/javascript", "text/javascript"))
    head = client.get("/static/vendor/plotly-basic.min.js").text[:200]
    assert "plotly.js (basic - minified) v" in head


def test_event_lightcurve_of_the_flare_region_with_context_frames(client, db_session, tmp_path):
    """An hourly series: the region about the flare shows it, the disk mean hardly does, and
    the window takes in three frames on each side whatever the margin."""
    ev = make_event(db_session, "FL", T0, T0 + 60 * MIN, T0 + 60 * MIN, source="detected", hpc_x=200.0, hpc_y=-120.0)
    bump = {0: 0.0, 1: 900.0, 2: 300.0}  # at 16:00, 17:00, 18:00
    made = []
    for h in range(-4, 7):  # 12:00 .. 22:00 hourly
        f = make_frame(db_session, "SDI", T0 + h * 60 * MIN)
        p = make_product(db_session, f, tmp_path, disk_value=100.0)
        data, dq, header = read_product(p.path)
        # +200" -> column 32.5 - 1 + 5 = 36.5, -120" -> row 31.5 - 3 = 28.5 (40"/px, 0-based)
        data[27:31, 35:39] += bump.get(h, 0.0)
        fits.HDUList([fits.PrimaryHDU(data, header), dq_table_hdu(dq)]).writeto(p.path, overwrite=True)
        made.append(p)
    roi = client.get(f"/api/v1/events/{ev.id}/lightcurve").json()
    assert roi["region"] == "roi" and roi["roi"] == [200.0, -120.0, 60.0]
    # 16:00-17:00 +- 30 min, widened to three frames each side: 13:00 .. 20:00
    assert roi["times"][0] == "2024-05-14T13:00:00Z" and roi["times"][-1] == "2024-05-14T20:00:00Z"
    vals = dict(zip(roi["times"], roi["values"], strict=True))
    assert vals["2024-05-14T17:00:00Z"] > 5 * vals["2024-05-14T15:00:00Z"]  # the flare, plainly
    disk = client.get(f"/api/v1/events/{ev.id}/lightcurve", params={"region": "disk"}).json()
    dvals = dict(zip(disk["times"], disk["values"], strict=True))
    assert dvals["2024-05-14T17:00:00Z"] < 1.2 * dvals["2024-05-14T15:00:00Z"]
    fig = client.get(f"/api/v1/events/{ev.id}/lightcurve/figure").json()
    assert "(200\u2033, -120\u2033) \u00b160\u2033" in fig["layout"]["yaxis"]["title"]["text"]
    nopos = make_event(db_session, "FL", T0, T0, T0, source="goes_xrs")
    r = client.get(f"/api/v1/events/{nopos.id}/lightcurve", params={"region": "roi"})
    assert_error(r, 422, "no helioprojective position")
