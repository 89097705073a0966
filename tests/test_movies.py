"""Movies (issue 11 item 2): the player's frames and markers, the difference images, the MP4 job.

A store of real products: the simulator's 13-frame SDI series (EIT-based, with its injected
flare) ingested and calibrated in this process by ``calibrate_product`` (the real L2
writer) on SQLite, served by the real app through a TestClient. The MP4 is made by running
the task's function in-process and read back with imageio-ffmpeg (ffmpeg's own decoder).
"""

from __future__ import annotations

import datetime as dt
import io
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from sqlalchemy import func, select

from backend.broker import InFlight, TaskName
from backend.models import Event, Frame, Movie, MovieState, Product, ProductState
from backend.settings import Settings
from backend.state import IllegalTransition, move_movie
from tests.conftest import _migrate_sqlite, _sqlite_path

SIZE = 128
SIM_SETTINGS = Settings(TASK_TIME_LIMIT_S=100, TASK_SOFT_TIME_LIMIT_S=90, RECONCILE_INTERVAL_S=5, MAX_DELIVERIES=3)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from pipelines.simulation import simulate

    return simulate(tmp_path_factory.mktemp("movie_sim"), channels=("SDI",), naxis=SIZE, noise=False, seed=11,
                    sdi_sequence=True)


def build_store(settings, simulated) -> SimpleNamespace:
    """Ingest and calibrate the simulated SDI series into ``settings``' store (real L2 files),
    and add the injected flare as a GOES-like FL event and a CME without a position."""
    from backend.db import session_scope
    from backend.services.ingest import ingest_path
    from backend.worker.processing import calibrate_product, plan_product

    with session_scope() as s:
        for p in [c.path for c in simulated.calibration_files] + list(simulated.raw_files):
            out = ingest_path(s, p, settings, move=False)
            assert out.status in ("ingested", "calibration"), out
    with session_scope() as s:
        ids = [plan_product(s, f, pinned=None, options={}, job_id=None)[0].id
               for f in s.scalars(select(Frame).order_by(Frame.date_obs))]
    with session_scope() as s:
        for pid in ids:
            prod = calibrate_product(s, pid, settings)
            assert prod.state == ProductState.written, prod.error
    fl = simulated.flare
    def t(v):
        return dt.datetime.fromisoformat(v).replace(tzinfo=dt.UTC)
    with session_scope() as s:
        dates = [r for r in s.scalars(select(Frame.date_obs).order_by(Frame.date_obs))]
        flare = Event(event_type="FL", source="goes_xrs", source_key="sim-flare", start_time=t(fl.start),
                      peak_time=t(fl.peak), end_time=t(fl.end), hpc_x=fl.hpc_x, hpc_y=fl.hpc_y, goes_class="M2.0")
        cme = Event(event_type="CE", source="cdaw", source_key="sim-cme", start_time=t(fl.peak),
                    end_time=t(fl.end) + dt.timedelta(hours=2), position_angle=80.0, angular_width=60.0)
        s.add_all([flare, cme])
        s.flush()
        return SimpleNamespace(products=ids, dates=[d.replace(tzinfo=dt.UTC) if d.tzinfo is None else d
                                                    for d in dates],
                               flare=flare.id, cme=cme.id, truth=fl)


@pytest.fixture(scope="module")
def store_template(tmp_path_factory, simulated, run_cache):
    """The store built once for the module: ``build_store`` run in ``work`` (a DATA_DIR at a
    fixed path, since the rows name absolute paths under it), then ``work`` copied whole to
    ``pristine``. Returns (work, pristine, what ``build_store`` returned)."""
    from backend import db as dbmod
    from backend.settings import get_settings

    root = tmp_path_factory.mktemp("movie_store")
    work, pristine = root / "var", root / "pristine"
    with pytest.MonkeyPatch.context() as mp:
        for k in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATA_DIR"):
            mp.delenv(k, raising=False)
            mp.delenv(f"LSTDP_{k}", raising=False)
        mp.setenv("DATA_DIR", str(work))
        get_settings.cache_clear()
        dbmod.reset_caches()
        settings = get_settings()
        settings.ensure_dirs()
        shutil.copyfile(run_cache.get("sqlite-migrated", _migrate_sqlite) / "lstdp.sqlite3",
                        _sqlite_path(settings))
        try:
            built = build_store(settings, simulated)
        finally:
            dbmod.reset_caches()  # every connection closed: the folder is the whole store
            get_settings.cache_clear()
    shutil.copytree(work, pristine)
    return work, pristine, built


@pytest.fixture
def store(settings_env, store_template):
    """A fresh copy of the module's store (``store_template``) at the path its rows name, and
    the settings pointing at it."""
    work, pristine, built = store_template
    shutil.rmtree(work, ignore_errors=True)
    # new files, new mtimes: the caches keyed on (path, mtime, size) miss as they did when each
    # test built its own store
    shutil.copytree(pristine, work, copy_function=shutil.copyfile)
    settings = settings_env(DATA_DIR=str(work))
    return SimpleNamespace(settings=settings, **vars(built))


@pytest.fixture
def client(store):
    from fastapi.testclient import TestClient

    from tests.conftest import shared_app
    from tests.test_api import route_celery_to_this_data_dir

    route_celery_to_this_data_dir()
    with shared_app() as app, TestClient(app, raise_server_exceptions=False) as c:
        c.headers["Authorization"] = f"Bearer {submit_token()}"  # POST /movies needs jobs:submit
        yield c


def submit_token(user: str = "tester") -> str:
    """A committed token of ``user`` with scope jobs:submit, on the current settings' database."""
    from backend.db import session_scope
    from tests.conftest import make_token

    with session_scope() as s:
        return make_token(s, user, ("jobs:submit",))


def submit_session(user: str = "tester") -> str:
    """A session cookie value (``lstdp_session``) of a new token of ``user`` with scope
    jobs:submit, committed on the current settings' database."""
    from backend.db import session_scope
    from tests.conftest import make_session_cookie, make_token

    with session_scope() as s:
        return make_session_cookie(s, make_token(s, user, ("jobs:submit",)))


def _iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _window(store) -> dict:
    return {"channel": "SDI", "start": _iso(store.dates[0] - dt.timedelta(minutes=1)),
            "end": _iso(store.dates[-1] + dt.timedelta(minutes=1))}


def _broker(settings) -> list[str]:
    return [p.read_text() for p in sorted((settings.broker_dir / "in").glob("*.msg"))]


# ------------------------------------------------------------------------------ pure steps
def test_difference_scale_is_symmetric_about_zero():
    from pipelines.movies import difference_image, display_array, signed_unit_image

    a = np.full((8, 8), 10.0)
    b = a.copy()
    b[2, 3], b[5, 5] = 14.0, 6.0  # +4 and -4
    d = difference_image(b, a)
    img, limit = signed_unit_image(d, percentile=100)
    assert limit == pytest.approx(4.0)
    assert img[2, 3] == pytest.approx(1.0) and img[5, 5] == pytest.approx(0.0) and img[0, 0] == pytest.approx(0.5)
    # masked pixels stay masked, and a block with half its pixels masked is still averaged
    dq = np.zeros((8, 8), np.uint8)
    dq[0, 0] = 1
    data = np.arange(64, dtype=np.float32).reshape(8, 8)
    small = display_array(data, dq, size=4)
    assert small.shape == (4, 4) and small[0, 0] == pytest.approx((1 + 8 + 9) / 3)
    with pytest.raises(Exception, match="shapes"):
        difference_image(np.zeros((4, 4)), np.zeros((4, 5)))


def test_marker_fraction_follows_the_wcs():
    from astropy.io import fits

    from pipelines.movies import hpc_to_fraction

    h = fits.Header({"NAXIS": 2, "NAXIS1": 1024, "NAXIS2": 1024, "CTYPE1": "HPLN-TAN", "CTYPE2": "HPLT-TAN",
                     "CUNIT1": "arcsec", "CUNIT2": "arcsec", "CDELT1": 2.0, "CDELT2": 2.0, "CRPIX1": 512.5,
                     "CRPIX2": 512.5, "CRVAL1": 0.0, "CRVAL2": 0.0})
    fx, fy = hpc_to_fraction(h, 0.0, 0.0)
    assert (fx, fy) == (pytest.approx(0.5), pytest.approx(0.5))
    fx, fy = hpc_to_fraction(h, -512.0, 256.0)  # 256 px left, 128 px up (north up: nearer the top)
    assert fx == pytest.approx(0.25, abs=1e-4) and fy == pytest.approx(0.375, abs=1e-4)
    assert hpc_to_fraction(h, 5000.0, 0.0) is None


def test_movie_state_machine():
    m = Movie(id="m", state=MovieState.queued)
    move_movie(m, MovieState.running)
    assert m.started_at is not None
    with pytest.raises(IllegalTransition):
        move_movie(m, MovieState.failed)  # a failure needs its reason
    move_movie(m, MovieState.failed, "broken")
    assert m.error == "broken" and m.finished_at is not None
    with pytest.raises(IllegalTransition):
        move_movie(m, MovieState.running)


# ------------------------------------------------------------------------------------- API
@pytest.mark.parametrize("body, needles", [
    ({"channel": "XRT", "start": "2004-03-01T00:00:00Z", "end": "2004-03-01T12:00:00Z"}, ["unknown channel"]),
    ({"channel": "SDI", "start": "2004-03-01T12:00:00Z", "end": "2004-03-01T00:00:00Z"}, ["end is before start"]),
    ({"channel": "SDI", "start": "2004-03-01T00:00:00Z", "end": "2004-03-01T12:00:00Z", "diff": "ratio"},
     ["unknown difference"]),
    ({"channel": "SDI", "start": "2004-03-01T00:00:00Z", "end": "2004-03-01T12:00:00Z", "fps": 0}, ["fps"]),
    ({"channel": "SDI", "start": "yesterday", "end": "2004-03-01T12:00:00Z"}, ["start"]),
    ({"channel": "SDI", "start": "2004-03-01T00:00:00Z", "end": "2004-03-01T12:00:00Z", "speed": 3}, ["speed"]),
])
def test_bad_movie_requests_are_422(client, store, body, needles):
    r = client.post("/api/v1/movies", json=body)
    assert r.status_code == 422, r.text
    for n in needles:
        assert n in r.json()["detail"], r.json()["detail"]


def test_a_movie_needs_jobs_submit_and_belongs_to_the_tokens_user(client, store):
    from backend.db import session_scope

    body = {**_window(store), "diff": "none"}
    r = client.post("/api/v1/movies", json=body, headers={"Authorization": ""})
    assert r.status_code == 401 and "jobs:submit" in r.json()["detail"], r.text
    r = client.post("/api/v1/movies", json={**body, "owner": "someone"})
    assert r.status_code == 422 and "owner" in r.json()["detail"]
    r = client.post("/api/v1/movies", json=body)
    assert r.status_code == 202, r.text
    with session_scope() as s:
        assert s.get(Movie, r.json()["id"]).owner == "tester"


def test_an_empty_window_is_422_with_the_frame_count(client, store):
    r = client.post("/api/v1/movies", json={"channel": "WST", **{k: v for k, v in _window(store).items()
                                                                  if k != "channel"}})
    assert r.status_code == 422 and r.json()["frames"] == 0 and "empty movie" in r.json()["detail"]
    one = {"channel": "SDI", "start": _iso(store.dates[0]), "end": _iso(store.dates[0]), "diff": "running"}
    r = client.post("/api/v1/movies", json=one)
    assert r.status_code == 422 and r.json()["frames"] == 0 and "at least two frames" in r.json()["detail"]
    assert client.post("/api/v1/movies", json={**one, "diff": "none"}).json()["frames_total"] == 1


def test_player_frames_markers_and_difference_png(client, store):
    from PIL import Image

    body = client.get("/api/v1/movies/frames", params={**_window(store), "diff": "running"}).json()
    assert body["count"] == len(store.dates) - 1 and body["diff"] == "running"
    assert [f["date_obs"] for f in body["frames"]] == [_iso(d) for d in store.dates[1:]]
    assert [f["ref"] for f in body["frames"]] == store.products[:-1]
    assert {e["id"] for e in body["events"]} == {store.flare, store.cme}
    # the flare's marker is where the product's WCS puts its helioprojective position
    with_marker = [f for f in body["frames"] if str(store.flare) in f["markers"]]
    assert len(with_marker) == len(body["frames"])  # the disk imager sees the position in every frame
    f0 = with_marker[0]
    import astropy.units as u
    import sunpy.map
    from astropy.coordinates import SkyCoord

    from backend.db import session_scope

    with session_scope() as s:
        path = s.get(Product, f0["product_id"]).path
    m = sunpy.map.Map(path, hdus=0)  # sunpy's own WCS of the product, independent of the code under test
    px, py = m.world_to_pixel(SkyCoord(store.truth.hpc_x * u.arcsec, store.truth.hpc_y * u.arcsec,
                                       frame=m.coordinate_frame))
    nx, ny = m.data.shape[1], m.data.shape[0]
    assert f0["markers"][str(store.flare)] == [pytest.approx((px.value + 0.5) / nx, abs=1e-3),
                                               pytest.approx(1 - (py.value + 0.5) / ny, abs=1e-3)]
    assert str(store.cme) not in f0["markers"]  # no position, no marker

    # the running difference of the peak frame is brightest at the flare's marker
    peak = dt.datetime.fromisoformat(store.truth.peak).replace(tzinfo=dt.UTC)
    k = min(range(len(body["frames"])), key=lambda i: abs(dt.datetime.fromisoformat(
        body["frames"][i]["date_obs"].replace("Z", "+00:00")) - peak))
    f = body["frames"][k]
    r = client.get(f["url"])
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    img = np.asarray(Image.open(io.BytesIO(r.content)).convert("L"), dtype=float)
    ny, nx = img.shape
    mx, my = f["markers"][str(store.flare)]
    box = img[int(my * ny) - 1:int(my * ny) + 2, int(mx * nx) - 1:int(mx * nx) + 2]
    assert box.min() > 240, box  # the flare kernel saturates the symmetric scale's bright end
    flipped = img[::-1][int(my * ny) - 1:int(my * ny) + 2, int(mx * nx) - 1:int(mx * nx) + 2]
    assert flipped.mean() < 200  # not there upside down: the image is north up as the markers are
    assert abs(np.median(img) - 128) < 12  # zero change is mid-grey

    # quicklooks without a difference; bad references are 4xx
    plain = client.get("/api/v1/movies/frames", params={**_window(store)}).json()
    assert plain["count"] == len(store.dates) and plain["frames"][0]["url"].endswith("/quicklook.png")
    assert client.get(f"/api/v1/movies/frames/{store.products[1]}.png?ref=999999").status_code == 404
    assert client.get(f"/api/v1/movies/frames/{store.products[1]}.png").status_code == 422
    ev = client.get("/api/v1/movies/frames", params={"event": store.flare}).json()
    assert ev["channel"] == "SDI" and ev["event"] == store.flare and ev["count"] >= 1
    assert client.get("/api/v1/movies/frames", params={"event": 999999}).status_code == 404
    assert client.get("/api/v1/movies/frames", params={"channel": "SDI"}).status_code == 422


def test_a_movie_is_made_by_the_task_and_reads_back(client, store):
    import imageio_ffmpeg

    from backend.db import session_scope
    from backend.worker.movies import make_movie

    r = client.post("/api/v1/movies", json={**_window(store), "diff": "base", "fps": 8})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["state"] == "queued" and body["frames_total"] == len(store.dates) - 1
    assert r.headers["location"] == f"/api/v1/movies/{body['id']}"
    sent = [m for m in _broker(store.settings) if body["id"] in m]
    assert len(sent) == 1 and TaskName.make_movie in sent[0]
    assert client.get(f"/api/v1/movies/{body['id']}/file").status_code == 404  # not made yet

    with session_scope() as s:
        movie = make_movie(s, body["id"], store.settings)
        assert movie.state == MovieState.succeeded, movie.error
    got = client.get(f"/api/v1/movies/{body['id']}").json()
    assert (got["state"], got["frames_done"], got["frames_total"], got["progress"]) == \
        ("succeeded", len(store.dates) - 1, len(store.dates) - 1, 1.0)
    f = client.get(got["file_url"])
    assert f.status_code == 200 and f.headers["content-type"] == "video/mp4"
    assert "attachment" in f.headers["content-disposition"] and ".mp4" in f.headers["content-disposition"]
    assert f.content[4:8] == b"ftyp"
    path = store.settings.root / "movies" / "check.mp4"
    path.write_bytes(f.content)
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    frames = [np.frombuffer(b, np.uint8).reshape(meta["size"][1], meta["size"][0], 3) for b in reader]
    # the products' own 128 px (issue 25: no longer enlarged to 512 with a caption band); 8 frames/s
    assert tuple(meta["size"]) == (SIZE, SIZE) == (got["width"], got["height"])
    assert len(frames) == len(store.dates) - 1 and meta["fps"] == pytest.approx(8)
    # the caption (the channel and DATE-OBS) at the top left, and frames differ as the flare grows
    assert frames[0][:12, :60, :].max() > 200
    assert np.abs(frames[0][16:].astype(int) - frames[5][16:].astype(int)).mean() > 1.0
    # a second delivery of the same message does nothing
    with session_scope() as s:
        assert make_movie(s, body["id"], store.settings).deliveries == 1


def test_a_failing_movie_ends_failed_with_the_reason(client, store):
    from backend.db import session_scope
    from backend.worker.movies import make_movie

    body = client.post("/api/v1/movies", json={**_window(store), "diff": "running"}).json()
    with session_scope() as s:  # a product file lost from the store after the movie was asked for
        p = s.get(Product, store.products[3])
        from pathlib import Path

        Path(p.path).unlink()
    with session_scope() as s:
        movie = make_movie(s, body["id"], store.settings)
    assert movie.state == MovieState.failed
    got = client.get(f"/api/v1/movies/{body['id']}").json()
    assert got["state"] == "failed" and "missing from the product store" in got["error"]
    r = client.get(f"/api/v1/movies/{body['id']}/file")
    assert r.status_code == 404 and "failed" in r.json()["detail"]
    assert client.get("/api/v1/movies/nope").status_code == 404
    assert not list((store.settings.root / "movies" / ".tmp").glob("*.part.mp4"))  # no partial file left


def test_the_reconciler_resends_a_lost_movie_and_gives_up_after_the_deliveries(store, monkeypatch):
    from backend.db import session_scope
    from backend.worker import reconcile
    from backend.worker.movies import claim_movie

    sent = []
    monkeypatch.setattr(reconcile, "send", lambda name, args=None, kwargs=None, queue="cpu":
                        sent.append((name, list(args or []))))
    now = dt.datetime.now(dt.UTC)
    old = now - dt.timedelta(minutes=5)
    with session_scope() as s:
        lost = Movie(channel_code="SDI", start_time=store.dates[0], end_time=store.dates[-1], diff="none", fps=5,
                     state=MovieState.queued, frames_total=13, sent_at=old, created_at=old)
        fresh = Movie(channel_code="SDI", start_time=store.dates[0], end_time=store.dates[-1], diff="none", fps=5,
                      state=MovieState.queued, frames_total=13, sent_at=now, created_at=now)
        queued = Movie(channel_code="SDI", start_time=store.dates[0], end_time=store.dates[-1], diff="none", fps=5,
                       state=MovieState.queued, frames_total=13, sent_at=old, created_at=old)
        s.add_all([lost, fresh, queued])
        s.flush()
        ids = SimpleNamespace(lost=lost.id, fresh=fresh.id, queued=queued.id)
    with session_scope() as s:
        report = reconcile.reconcile_once(s, SIM_SETTINGS, now=now, flight=InFlight(movies={ids.queued}))
    # the lost one is sent again; the fresh one (within the grace) and the one still queued are not
    assert report.movies_resent == [ids.lost] and sent == [(TaskName.make_movie, [ids.lost])]
    with session_scope() as s:
        assert s.get(Movie, ids.lost).sent_at.replace(tzinfo=dt.UTC) >= now - dt.timedelta(seconds=1)

    # a worker that died mid-movie: its claim is dead (a pid of this host that is gone)
    import socket
    import subprocess

    for delivery in range(1, SIM_SETTINGS.max_deliveries + 1):
        child = subprocess.Popen(["true"])  # each delivery's worker process, gone when the pass runs
        child.wait()
        dead = f"{socket.gethostname()}:{child.pid} task=x try=0"
        with session_scope() as s:
            assert claim_movie(s, ids.lost, lease_s=SIM_SETTINGS.lease_s, max_deliveries=SIM_SETTINGS.max_deliveries,
                               holder=dead).status == "claimed"
        sent.clear()
        with session_scope() as s:
            report = reconcile.reconcile_once(s, SIM_SETTINGS, now=now + dt.timedelta(minutes=delivery),
                                              flight=InFlight())
        with session_scope() as s:
            m = s.get(Movie, ids.lost)
            assert m.deliveries == delivery
            if delivery < SIM_SETTINGS.max_deliveries:
                # (the other two, past their grace now with no message in flight, are re-sent too)
                assert m.state == MovieState.running and ids.lost in report.movies_resent, report
                assert (TaskName.make_movie, [ids.lost]) in sent
            else:
                assert m.state == MovieState.failed and report.movies_failed == [ids.lost]
                assert "gave up after 3 deliveries" in m.error and (TaskName.make_movie, [ids.lost]) not in sent
    # with the broker unreadable nothing is sent
    sent.clear()
    with session_scope() as s:
        assert reconcile.reconcile_once(s, SIM_SETTINGS, now=now + dt.timedelta(hours=1), flight=None).movies_resent == []
    assert sent == []


def test_movie_page_and_event_partial(client, store):
    r = client.get("/movies", params={**_window(store), "diff": "running"})
    assert r.status_code == 200 and 'id="movie-player"' in r.text and "movie.js?v=" in r.text
    assert "/api/v1/movies/frames?channel=SDI" in r.text and "diff=running" in r.text
    bad = client.get("/movies", params={"channel": "XRT", "start": "x", "end": "2004-03-01T00:00:00"})
    assert bad.status_code == 200 and "unknown LST channel" in bad.text
    assert "is not a date and time" in bad.text and "ISO 8601" in bad.text
    ev = client.get(f"/events/{store.flare}")
    assert ev.status_code == 200 and 'id="event-movie"' in ev.text
    assert f"/api/v1/movies/frames?event={store.flare}" in ev.text
    page = client.get("/movies", params={"event": store.flare})
    assert page.status_code == 200 and "LST SDI" in page.text


@pytest.mark.slow
def test_an_embedded_worker_makes_the_movie_from_the_filesystem_broker(client, store, tmp_path):
    """The demo's path: the API sends to the filesystem broker in DATA_DIR, the embedded
    worker (``lstdp worker``, as ``lstdp demo`` starts it) takes the message and makes the MP4."""
    import os
    import signal
    import subprocess
    import sys
    import time

    r = client.post("/api/v1/movies", json={**_window(store), "diff": "running", "fps": 12})
    assert r.status_code == 202, r.text
    movie_id = r.json()["id"]
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "backend.cli", "worker", "--queues", "cpu", "--concurrency", "1",
                               "--no-reconciler", "--name", f"movies-{os.getpid()}@%h"],
                              env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        got = {}
        while time.monotonic() < deadline:
            got = client.get(f"/api/v1/movies/{movie_id}").json()
            if got["state"] in ("succeeded", "failed"):
                break
            time.sleep(0.5)
        assert got["state"] == "succeeded", (got, (tmp_path / "worker.log").read_text()[-2000:])
        assert got["frames_done"] == got["frames_total"] == len(store.dates) - 1
        assert client.get(got["file_url"]).content[4:8] == b"ftyp"
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
        log.close()


def test_the_benchmark_script_runs_at_a_tiny_size():
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "movies.py"), "--size", "128", "--frames", "3",
                        "--repeat", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    m = re.fullmatch(r"RESULT diff_png_cold_s=([\d.]+) diff_png_warm_s=([\d.]+) mp4_fps=([\d.]+) size=128",
                     r.stdout.strip().splitlines()[-1])
    assert m and all(float(g) > 0 for g in m.groups()), r.stdout


def test_an_event_ending_before_it_starts_gives_a_forward_window():
    """Catalogue rows with the end before the start exist: the movie (and light-curve) window
    of such an event runs forward from its start, never reversed."""
    from types import SimpleNamespace

    from backend.services.movies import event_movie_window

    t = dt.datetime(2011, 6, 7, 12, tzinfo=dt.UTC)
    ev = SimpleNamespace(start_time=t, end_time=t - dt.timedelta(hours=3), peak_time=None)
    a, b = event_movie_window(ev, dt.timedelta(minutes=30))
    assert (a, b) == (t - dt.timedelta(minutes=30), t + dt.timedelta(minutes=30))


# ------------------------------------------------------- issue 25: size, event marker and crop
def _mp4(client, store, body) -> tuple[dict, dict, list[np.ndarray]]:
    """Ask for a movie, make it in-process (the task's function), read the MP4 back with
    imageio-ffmpeg (ffmpeg's decoder, as the worker's encoder): (movie JSON, meta, RGB frames)."""
    import imageio_ffmpeg

    from backend.db import session_scope
    from backend.worker.movies import make_movie

    r = client.post("/api/v1/movies", json=body)
    assert r.status_code == 202, r.text
    with session_scope() as s:
        assert make_movie(s, r.json()["id"], store.settings).state == MovieState.succeeded
    got = client.get(f"/api/v1/movies/{r.json()['id']}").json()
    path = store.settings.root / "movies" / f"check-{got['id']}.mp4"
    path.write_bytes(client.get(got["file_url"]).content)
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    return got, meta, [np.frombuffer(b, np.uint8).reshape(h, w, 3).astype(int) for b in reader]


def _product_map(store, i: int = 0):
    """sunpy's map of the i-th product file (its own WCS, independent of the code under test)."""
    import sunpy.map

    from backend.db import session_scope

    with session_scope() as s:
        return sunpy.map.Map(s.get(Product, store.products[i]).path, hdus=0)


def _event_pixel(m, x: float, y: float) -> tuple[float, float]:
    import astropy.units as u
    from astropy.coordinates import SkyCoord

    px, py = m.world_to_pixel(SkyCoord(x * u.arcsec, y * u.arcsec, frame=m.coordinate_frame))
    return float(px.value), float(py.value)


def _cyan(frame: np.ndarray) -> np.ndarray:
    """Pixels of the marker's colour (0, 255, 255) after H.264: no colour map of SDI has it."""
    r, g, b = frame[..., 0], frame[..., 1], frame[..., 2]
    return (r < 110) & (g > 150) & (b > 150)


def _centre(v: np.ndarray) -> float:
    """Centre of a ring's pixels along one axis (the middle of its extent)."""
    return (float(v.min()) + float(v.max())) / 2


def test_the_mp4_has_the_products_resolution_or_the_chosen_size(client, store):
    """Issue 25 (movies): the MP4 was 512x544 from 128 px products (384x416 from 1152 px):
    now the products' own size, or the size asked for (larger side)."""
    m = _product_map(store)
    ny, nx = m.data.shape
    assert (nx, ny) == (SIZE, SIZE)
    got, meta, frames = _mp4(client, store, {**_window(store), "diff": "none", "fps": 8})
    assert tuple(meta["size"]) == (nx, ny) == (got["width"], got["height"]) and got["size"] is None
    assert len(frames) == len(store.dates) and meta["fps"] == pytest.approx(8)
    assert frames[0][:12, :60].max() > 200  # the caption (channel, DATE-OBS) written at the top left
    assert not _cyan(frames[0]).any()  # no event asked for: no marker
    got, meta, frames = _mp4(client, store, {**_window(store), "diff": "running", "size": 96})
    assert tuple(meta["size"]) == (96, 96) == (got["width"], got["height"]) and got["size"] == 96
    assert len(frames) == len(store.dates) - 1
    got, meta, frames = _mp4(client, store, {**_window(store), "diff": "base", "size": 320})
    assert tuple(meta["size"]) == (320, 320) and len(frames) == len(store.dates) - 1


def test_an_event_movie_marks_the_event_where_the_wcs_puts_it_and_crops_to_its_box(client, store):
    """Issue 25 (movies): the event's marker drawn at its helioprojective position through
    the product's WCS; cropped to its box, the frame holds the flare at the marker."""
    from backend.db import session_scope

    x, y = store.truth.hpc_x, store.truth.hpc_y
    bbox = [x - 100.0, y - 60.0, x + 300.0, y + 140.0]  # off-centre: the event is not the crop's centre
    with session_scope() as s:
        s.get(Event, store.flare).attributes = {"hpc_bbox": bbox}
    m = _product_map(store)
    ny, nx = m.data.shape

    # the whole disk at full resolution, with the marker: a ring centred where sunpy puts the flare
    got, meta, frames = _mp4(client, store, {**_window(store), "diff": "none", "event": store.flare})
    assert (got["event"], got["crop"], got["crop_box"], tuple(meta["size"])) == (store.flare, False, None, (nx, ny))
    px, py = _event_pixel(m, x, y)
    col, row = px, ny - 1 - py  # the MP4 is north up: FITS row 0 at the bottom
    rows, cols = np.nonzero(_cyan(frames[0]))
    assert rows.size > 20
    mc, mr = _centre(cols), _centre(rows)
    assert abs(mc - col) <= 1.0 and abs(mr - row) <= 1.0, (mc, mr, col, row)
    assert np.hypot(cols - col, rows - row).min() > 3  # a ring: the event's own pixels stay visible

    # cropped to the box (+ the margin) and enlarged to 240 px, a base difference: the flare is white
    from pipelines.movies import CROP_MARGIN_ARCSEC  # 100 arcsec a side, documented

    size = 240
    got, meta, frames = _mp4(client, store, {**_window(store), "diff": "base", "event": store.flare,
                                             "crop": True, "size": size})
    box = [bbox[0] - CROP_MARGIN_ARCSEC, bbox[1] - CROP_MARGIN_ARCSEC, bbox[2] + CROP_MARGIN_ARCSEC,
           bbox[3] + CROP_MARGIN_ARCSEC]
    assert got["crop"] is True and got["crop_box"] == pytest.approx(box)
    w, h = meta["size"]
    assert w == size and h < size and h % 2 == 0  # the box is wider than tall: 600" x 400"
    assert abs(w / h - 600 / 400) < 0.1
    # expected place: the crop is centred on the box's centre; the event's offset from it in
    # the product's pixels (sunpy), scaled to the MP4
    cx, cy = _event_pixel(m, (box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    scale = w / ((box[2] - box[0]) / abs(m.scale.axis1.value))  # MP4 pixels per product pixel
    want_col, want_row = w / 2 + (px - cx) * scale, h / 2 - (py - cy) * scale
    peak = dt.datetime.fromisoformat(store.truth.peak).replace(tzinfo=dt.UTC)
    k = min(range(1, len(store.dates)), key=lambda i: abs(store.dates[i] - peak)) - 1  # base: frame 0 is the ref
    f = frames[k]
    rows, cols = np.nonzero(_cyan(f))
    assert rows.size > 20
    mc, mr = _centre(cols), _centre(rows)
    tol = scale / 2 + 2  # the crop starts on a whole product pixel
    assert abs(mc - want_col) < tol and abs(mr - want_row) < tol, (mc, mr, want_col, want_row, tol)
    # the image under the marker is the flare: the base difference's brightest (white) pixels
    lum = f.mean(axis=2)
    white = (lum > 235) & ~_cyan(f) & (np.abs(f[..., 0] - f[..., 2]) < 30)
    white[:30] = False  # not the caption
    wr, wc = np.nonzero(white)
    assert wr.size > 4
    assert abs(wc.mean() - mc) < 6 and abs(wr.mean() - mr) < 6, (wc.mean(), wr.mean(), mc, mr)


def test_bad_movie_sizes_and_events_are_422(client, store):
    """Issue 25 (movies): a size out of bounds or odd, a crop without an event, an unknown
    event or one without a position: 422 with the reason, nothing stored."""
    from backend.db import session_scope

    base = {**_window(store), "diff": "none"}
    with session_scope() as s:  # a private event of another user (a recalibration's detection)
        ev = Event(event_type="FL", source="detected", source_key="alice-flare", start_time=store.dates[3],
                   end_time=store.dates[5], hpc_x=-400.0, hpc_y=-350.0, owner="alice")
        s.add(ev)
        s.flush()
        private = ev.id
    for extra, needle in (({"size": 8}, "size"), ({"size": 100000}, "size"), ({"size": 301}, "odd"),
                          ({"size": "big"}, "size"), ({"crop": True}, "crop"),
                          ({"event": 999999}, "no event with id 999999"),
                          ({"event": private}, f"no event with id {private}"),  # another user's: as unknown
                          ({"event": store.cme, "crop": True}, "no helioprojective position")):
        r = client.post("/api/v1/movies", json={**base, **extra})
        assert r.status_code == 422, (extra, r.text)
        assert needle in r.json()["detail"], (extra, r.json())
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Movie)) == 0


def test_a_movies_options_are_its_row(client, store):
    """Issue 25 (movies): ``size``, ``event`` and ``crop`` are stored in the movie's row with
    it (no file beside it); ``GET /movies/{id}`` and the worker read them from the row; the
    event's deletion sets ``event_id`` NULL and a cropped movie not yet made then fails saying so."""
    from backend.db import session_scope
    from backend.worker.movies import make_movie
    from pipelines.movies import CROP_MARGIN_ARCSEC, POINT_BOX_ARCSEC

    r = client.post("/api/v1/movies", json={**_window(store), "event": store.flare, "crop": True, "size": 128})
    assert r.status_code == 202, r.text
    mid = r.json()["id"]
    with session_scope() as s:
        m = s.get(Movie, mid)
        assert (m.size, m.event_id, m.crop) == (128, store.flare, True)
        m.size = 96  # the row is what is read back: change it and GET follows
    assert [p for p in (store.settings.root / "movies").rglob("*") if p.is_file()] == []
    got = client.get(f"/api/v1/movies/{mid}").json()
    half = POINT_BOX_ARCSEC / 2 + CROP_MARGIN_ARCSEC  # the flare has no hpc_bbox: a square around it
    x, y = store.truth.hpc_x, store.truth.hpc_y
    assert (got["size"], got["event"], got["crop"]) == (96, store.flare, True)
    assert got["crop_box"] == pytest.approx([x - half, y - half, x + half, y + half])

    plain = client.post("/api/v1/movies", json=_window(store)).json()["id"]
    with session_scope() as s:
        assert (lambda m: (m.size, m.event_id, m.crop))(s.get(Movie, plain)) == (None, None, False)
        s.delete(s.get(Event, store.flare))
    with session_scope() as s:
        assert s.get(Movie, mid).event_id is None  # ON DELETE SET NULL
    got = client.get(f"/api/v1/movies/{mid}").json()
    assert (got["size"], got["event"], got["crop"], got["crop_box"]) == (96, None, True, None)
    with session_scope() as s:
        m = make_movie(s, mid, store.settings)
        assert m.state == MovieState.failed and "the event this movie crops to was deleted" in m.error, m.error


@pytest.mark.parametrize("bbox", [[None, 1, 2, 3], [0, "a", 1, 2], "POLYGON((1 2,3 4))", [0, 0, float("nan"), 1], [True, 0, 1, 1]])
def test_an_events_malformed_box_falls_back_to_a_square_around_its_position(bbox):
    """A reviewer's case: a box that is not four finite numbers raised TypeError (a 500 on the
    movie routes, a failed movie in the worker); it is read as no box."""
    from pipelines.movies import POINT_BOX_ARCSEC, event_box

    x0, y0, x1, y1 = event_box(100.0, -50.0, bbox, margin=0.0)
    assert (x1 - x0, y1 - y0) == (POINT_BOX_ARCSEC, POINT_BOX_ARCSEC)
    assert (x0 + x1) / 2 == 100.0 and (y0 + y1) / 2 == -50.0
