"""The Python client (``clients/python``, package ``lstdp_client``) against a live server of
ours (``tests/client/conftest.py``: uvicorn in a thread, a real worker, real products and
catalogue events). Each result is checked against what the API itself answers to the same
request made with plain HTTP."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import astropy.units as u
import httpx
import numpy as np
import pytest
from astropy.time import Time

from lstdp_client import (
    AuthenticationError,
    Client,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    ValidationError,
)
from tests.client.conftest import SDI_FRAMES

pytestmark = pytest.mark.slow


def _api(live, path: str, params=None, **kw) -> httpx.Response:
    return httpx.get(f"{live.url}/api/v1{path}", params=params, timeout=30, **kw)


def _sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _t(iso: str | None) -> Time | None:
    return None if iso is None else Time(iso.replace("Z", ""), format="isot", scale="utc")


def test_search_events_pages_by_cursor_and_returns_a_qtable_with_units(live):
    params = {"type": "FL", "source": "goes_xrs", "start": "2004-03-01T00:00:00Z", "end": "2004-03-08T00:00:00Z"}
    whole = _api(live, "/events", {**params, "limit": 500}).json()
    assert not whole["truncated"] and whole["total"] == len(whole["items"]) > 10, whole["total"]

    with Client(live.url) as c:
        t = c.search_events(type="FL", source="goes_xrs", start="2004-03-01", end=Time("2004-03-08T00:00:00"),
                            page_size=4)
    assert t.meta["pages"] == math.ceil(len(whole["items"]) / 4) > 1
    assert list(t["id"]) == [e["id"] for e in whole["items"]]  # every page, in the API's order, once
    assert isinstance(t["start_time"], Time) and t["start_time"].scale == "utc"
    assert t["goes_flux"].unit == u.W / u.m**2 and t["hpc_x"].unit == u.arcsec
    for row, e in zip(t, whole["items"], strict=True):
        assert abs((row["start_time"] - _t(e["start_time"])).to_value(u.s)) < 1e-3
        if e["peak_time"] is None:
            assert row["peak_time"].mask
        else:
            assert abs((row["peak_time"] - _t(e["peak_time"])).to_value(u.s)) < 1e-3
        assert row["goes_class"] == e["goes_class"]
        assert row["goes_flux"].to_value(u.W / u.m**2) == pytest.approx(e["goes_flux"], rel=1e-12)
        assert row["source"] == "goes_xrs" and row["event_type"] == "FL"


def test_search_events_converts_quantities_to_the_api_units(live):
    """hpc bounds as Quantities in arcmin are sent in arcsec: the same events as the API's arcsec query."""
    api = _api(live, "/events", {"source": "hek", "hpc_x_min": -600, "hpc_x_max": 600, "limit": 500}).json()
    assert api["total"] > 0
    with Client(live.url) as c:
        t = c.search_events(source="hek", hpc_x_min=-10 * u.arcmin, hpc_x_max=0.1667 * u.deg, page_size=3)
        every = c.search_events(source="hek")
    assert list(t["id"]) == [e["id"] for e in api["items"]]
    assert len(every) > len(t)  # the box did filter
    for row, e in zip(t, api["items"], strict=True):
        assert row["hpc_x"].to_value(u.arcsec) == pytest.approx(e["hpc_x"])
        assert row["hpc_y"].to_value(u.arcsec) == pytest.approx(e["hpc_y"])
        assert -600 <= row["hpc_x"].to_value(u.arcsec) <= 600
        for k in ("hgs_lat", "hgs_lon"):
            if e[k] is None:
                assert np.isnan(row[k].value)
            else:
                assert row[k].to_value(u.deg) == pytest.approx(e[k])


def test_search_products_lists_every_page_and_maps_open_with_date_and_detector(live, tmp_path):
    api = _api(live, "/products", {"channel": "SDI", "state": "written", "calibration_set": live.job["calibration_sets"][0],
                                   "limit": 500}).json()
    assert api["total"] == SDI_FRAMES
    with Client(live.url) as c:
        prods = c.search_products(channel="sdi", state="written", calibration_set=live.job["calibration_sets"][0],
                                  page_size=5)
        assert list(prods["id"]) == [p["id"] for p in api["items"]]
        assert isinstance(prods["date_obs"], Time)
        assert all(str(url).startswith(live.url + "/api/v1/products/") for url in prods["fits_url"])
        maps = c.maps(prods[:4], path=tmp_path, progress=False)
    assert len(maps) == 4
    for m, row in zip(maps, prods[:4], strict=True):
        assert abs((m.date - row["date_obs"]).to_value(u.s)) < 1e-3
        assert m.detector == "SDI" and m.instrument.upper().startswith("LST")
        assert m.unit is not None
        # one map per product, its UNCERT and DQ attached (lstdp_client.open_l2)
        assert m.uncertainty is not None and m.uncertainty.array.shape == m.data.shape
        assert m.mask is not None and m.mask.shape == m.data.shape and m.mask.any() and not m.mask.all()
    for f in tmp_path.iterdir():
        assert _sha256(f) in set(prods["sha256"])


def test_download_is_parallel_and_resumes(live, tmp_path):
    with Client(live.url) as c:
        prods = c.search_products(channel="SDI", state="written", calibration_set=live.job["calibration_sets"][0])
        first = c.download(prods, tmp_path, progress=False)
        assert not first.errors and len(first) == SDI_FRAMES
        files = sorted(Path(f) for f in first)
        assert {_sha256(f) for f in files} == set(prods["sha256"])
        # an interrupted download (half a file), a lost file, the others complete
        cut, lost, kept = files[0], files[1], files[2:]
        cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
        lost.unlink()
        stamps = {f: f.stat().st_mtime_ns for f in kept}
        again = c.download(prods, tmp_path, progress=False)
    assert not again.errors and sorted(Path(f) for f in again) == files
    assert {_sha256(f) for f in files} == set(prods["sha256"])  # the partial one was downloaded again
    assert {f: f.stat().st_mtime_ns for f in kept} == stamps  # complete files were not fetched again


def test_job_submitted_and_followed_to_its_end(live):
    created, events = live.created, live.job_events
    assert created["state"] in ("queued", "running") and created["total"] >= 0
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "end" and kinds.count("end") == 1 and set(kinds[:-1]) == {"progress"}
    fractions = [e["progress"] for e in events]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert events[-1]["state"] == "succeeded" and events[-1]["done"] == SDI_FRAMES
    assert live.job["done"] == SDI_FRAMES and live.job["owner"] == "ada"


def test_cancel_a_running_job_and_follow_it_to_cancelled(live):
    with Client(live.url, token=live.token) as c:
        # other options: another calibration set, so every frame has to be calibrated again
        job = c.submit_job("SDI", live.span[0], live.span[1], options={"remove_cosmic_rays": True})
        answer = None
        seen = []
        for ev in c.follow_job(job["id"], timeout=300):
            seen.append(ev)
            if answer is None:
                answer = c.cancel_job(job["id"])
                assert answer["state"] == "cancelled" or answer["cancel_requested_at"] is not None, answer
        final = c.job(job["id"])
        assert seen[-1]["event"] == "end" and seen[-1]["state"] == "cancelled"
        assert final["state"] == "cancelled" and final["cancelled_by"] == "ada"
        assert final["done"] + final["failed"] + final["skipped"] + final["cancelled"] == final["total"]
        assert final["done"] < SDI_FRAMES  # stopped before the end (cancelled before planning: total 0)
        with pytest.raises(ConflictError) as exc:
            c.cancel_job(job["id"])
    direct = httpx.post(f"{live.url}/api/v1/jobs/{job['id']}/cancel", headers={"Authorization": f"Bearer {live.token}"})
    assert exc.value.status == direct.status_code == 409
    assert exc.value.detail == direct.json()["detail"] and exc.value.detail in str(exc.value)


def test_errors_carry_the_api_message(live, monkeypatch):
    with Client(live.url) as c:
        with pytest.raises(ValidationError) as exc:
            c.search_events(type="XX")
        api = _api(live, "/events", {"type": "XX"})
        assert exc.value.status == api.status_code == 422
        assert exc.value.detail == api.json()["detail"] and "XX" in str(exc.value)
        assert exc.value.errors and exc.value.errors[0]["loc"][-1] == "type"

        with pytest.raises(NotFoundError) as exc:
            c.job("no-such-job")
        assert exc.value.detail == _api(live, "/jobs/no-such-job").json()["detail"]
        with pytest.raises(NotFoundError):
            list(c.follow_job("no-such-job"))
        with pytest.raises(NotFoundError) as exc:
            c.product(2_000_000)
        assert "no product with id 2000000" in str(exc.value)

        with pytest.raises(AuthenticationError) as exc:  # no token
            c.submit_job("SDI", live.span[0], live.span[1])
        direct = httpx.post(f"{live.url}/api/v1/jobs", json={"channels": ["SDI"], "start": "2004-03-01",
                                                               "end": "2004-03-02"})
        assert exc.value.status == direct.status_code == 401 and exc.value.detail == direct.json()["detail"]

    from backend.db import session_scope
    from tests.conftest import make_token

    with session_scope() as s:
        reader = make_token(s, "rita", ("jobs:cancel",))
    with Client(live.url, token=reader) as c, pytest.raises(PermissionDeniedError) as exc:
        c.submit_job("SDI", live.span[0], live.span[1])
    assert exc.value.status == 403 and "jobs:submit" in exc.value.detail

    with Client(live.url, token=live.token) as c:
        with pytest.raises(ValidationError) as exc:
            c.submit_job("EUV", live.span[0], live.span[1])
        assert "unknown channel 'EUV'" in exc.value.detail
        # over the frames-per-day quota (ada calibrated the series today): 429 with Retry-After
        from backend.settings import get_settings

        monkeypatch.setattr(get_settings(), "quota_frames_per_day", SDI_FRAMES + 1)
        with pytest.raises(RateLimitedError) as exc:
            c.submit_job("SDI", live.span[0], live.span[1], options={"flag_bad_pixels": False})
    assert exc.value.status == 429 and exc.value.retry_after is not None and exc.value.retry_after > 0
    assert "QUOTA_FRAMES_PER_DAY" in exc.value.detail


def test_paging_parameters_are_the_clients_and_the_url_may_come_from_the_environment(live, monkeypatch):
    monkeypatch.setenv("LSTDP_URL", live.url + "/api/v1")
    with Client() as c:
        assert c.base_url == live.url
        with pytest.raises(ValueError, match="cursor"):
            c.search_events(cursor="abc")
        assert len(c.search_events(source="hek", page_size=500)) == _api(live, "/events", {"source": "hek",
                                                                                           "limit": 500}).json()["total"]
