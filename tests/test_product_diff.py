"""Diffs between two product versions of one frame: header keyword diff, image difference
and ratio statistics (checked against NumPy on the files), PNGs, the page, the errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
from astropy.io import fits
from sqlalchemy import select

from backend.models import Frame, Product, ProductState
from backend.services import product_diff
from tests.live import ingest_simulated


@pytest.fixture(scope="module")
def sim_dir(simulated_dataset):
    return simulated_dataset(naxis=128, noise=True, seed=3).out_dir  # shared, read-only


@pytest.fixture
def two_versions(sqlite_env, sim_dir):
    """An SDI frame calibrated twice in this process: ``a`` with the default options, ``b``
    without the bad-pixel flags and with linear resampling; ``other``: a product of another
    frame; ``planned``: a third version of the first frame, not written."""
    from backend.db import session_scope
    from backend.worker.processing import calibrate_product, plan_product

    ingest_simulated(sim_dir)
    with session_scope() as s:
        frames = list(s.scalars(select(Frame).where(Frame.channel_code == "SDI").order_by(Frame.date_obs)))
        f, g = frames[0], frames[1]
        a, _ = plan_product(s, f, pinned=None, options=None, job_id=None)
        b, _ = plan_product(s, f, pinned=None, options={"flag_bad_pixels": False, "interpolation_order": 1},
                            job_id=None)
        other, _ = plan_product(s, g, pinned=None, options=None, job_id=None)
        planned, _ = plan_product(s, f, pinned=None, options={"interpolation_order": 0}, job_id=None)
        s.commit()
        ids = {"frame": f.id, "a": a.id, "b": b.id, "other": other.id, "planned": planned.id}
    for key in ("a", "b", "other"):
        with session_scope() as s:
            prod = calibrate_product(s, ids[key], sqlite_env)
            assert prod.state == ProductState.written, prod.error
    with session_scope() as s:
        ids["paths"] = {k: s.get(Product, ids[k]).path for k in ("a", "b")}
    return ids


@pytest.fixture
def client(sqlite_env):
    """An admin's client: ``b`` and ``planned`` were planned with non-default options and no
    owner, so they belong to a set that is neither public nor anyone's (an admin's to see; the
    product rule makes them 404 to everyone else, tested in test_access_matrix)."""
    from fastapi.testclient import TestClient

    from backend.api.app import create_app
    from backend.db import session_scope
    from tests.conftest import make_token

    with session_scope() as s:
        token = make_token(s, "ops", ("admin",))
        s.commit()
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        c.headers["Authorization"] = f"Bearer {token}"
        yield c


def _arrays(path):
    from pipelines.products import read_product

    data, dq, header = read_product(path, dtype=np.float64)
    return data, dq, header


def test_image_stats_on_known_arrays():
    a = np.array([[1.0, 2.0, 4.0], [8.0, 0.0, np.nan]], dtype=np.float32)
    b = np.array([[1.0, 3.0, 2.0], [8.0, 5.0, 1.0]], dtype=np.float32)
    dq_a = np.array([[0, 0, 0], [1, 0, 0]], dtype=np.uint8)  # (1, 0) bad in a
    dq_b = np.zeros((2, 3), dtype=np.uint8)
    st = product_diff.image_stats(a, dq_a, b, dq_b)
    # good in both and finite: (0,0) (0,1) (0,2) (1,1); differences 0, 1, -2, 5
    d = st["difference"]
    assert st["n_good_both"] == 4 and st["n_pixels"] == 6 and st["dq_differs"] == 1
    assert d["count"] == 4 and d["n_differing"] == 3 and d["max_abs_diff"] == 5.0
    assert d["mean"] == pytest.approx(1.0) and d["median"] == pytest.approx(0.5)
    assert d["std"] == pytest.approx(np.std([0, 1, -2, 5])) and (d["min"], d["max"]) == (-2.0, 5.0)
    assert d["p01"] == pytest.approx(np.percentile([0, 1, -2, 5], 1))
    assert d["p99"] == pytest.approx(np.percentile([0, 1, -2, 5], 99))
    # the ratio leaves out a == 0 at (1,1): 1, 1.5, 0.5
    r = st["ratio"]
    assert r["count"] == 3 and r["n_zero_reference"] == 1
    assert r["mean"] == pytest.approx(1.0) and r["median"] == pytest.approx(1.0)
    assert (r["min"], r["max"]) == (0.5, 1.5)


def test_image_stats_with_no_good_pixel_say_none():
    a = np.ones((2, 2), np.float32)
    st = product_diff.image_stats(a, np.ones((2, 2), np.uint8), a, np.zeros((2, 2), np.uint8))
    assert st["difference"]["count"] == 0 and st["difference"]["mean"] is None
    assert st["difference"]["max_abs_diff"] is None and st["ratio"]["median"] is None


def test_header_diff_marks_volatile_keywords():
    a = fits.Header([("DATE", "2026-01-01T00:00:00"), ("PRODID", 1), ("CALFLAT", "flat_v1.fits"), ("OLD", 1)])
    b = fits.Header([("DATE", "2026-01-02T00:00:00"), ("PRODID", 2), ("CALFLAT", "flat_v2.fits"), ("NEW", "x")])
    a.add_history("step one")
    b.add_history("step one")
    b.add_history("step two")
    hd = product_diff.header_diff(a, b)
    changed = {r["keyword"]: r for r in hd["changed"]}
    assert changed["DATE"]["volatile"] and changed["PRODID"]["volatile"]
    assert changed["CALFLAT"] == {"keyword": "CALFLAT", "a": "flat_v1.fits", "b": "flat_v2.fits", "volatile": False}
    assert hd["added"] == [{"keyword": "NEW", "a": None, "b": "x", "volatile": False}]
    assert hd["removed"] == [{"keyword": "OLD", "a": 1, "b": None, "volatile": False}]
    assert hd["history"] == {"added": ["step two"], "removed": []}
    assert (hd["n_volatile"], hd["n_other"]) == (2, 3)


def test_diff_of_two_versions_matches_numpy(two_versions, client):
    v = two_versions
    r = client.get(f"/api/v1/frames/{v['frame']}/diff", params={"a": v["a"], "b": v["b"]})
    assert r.status_code == 200, r.text
    rep = r.json()
    a, dqa, ha = _arrays(v["paths"]["a"])
    b, dqb, hb = _arrays(v["paths"]["b"])
    good = (dqa == 0) & (dqb == 0) & np.isfinite(a) & np.isfinite(b)
    d = (b - a)[good]
    got = rep["image"]["difference"]
    assert got["count"] == int(good.sum()) > 1000
    assert got["mean"] == pytest.approx(d.mean(), rel=1e-9, abs=1e-12)
    assert got["median"] == pytest.approx(np.median(d), rel=1e-9, abs=1e-12)
    assert got["std"] == pytest.approx(d.std(), rel=1e-9)
    assert (got["min"], got["max"]) == (pytest.approx(d.min()), pytest.approx(d.max()))
    assert got["p01"] == pytest.approx(np.percentile(d, 1)) and got["p99"] == pytest.approx(np.percentile(d, 99))
    assert got["n_differing"] == int(np.count_nonzero(d)) > 0  # linear vs cubic resampling differs
    assert got["max_abs_diff"] == pytest.approx(np.abs(d).max())
    ok = good & (a != 0)
    ratio = b[ok] / a[ok]
    assert rep["image"]["ratio"]["median"] == pytest.approx(np.median(ratio), rel=1e-9)
    assert rep["image"]["ratio"]["count"] == int(ok.sum())
    # bad pixels are flagged in a (flag_bad_pixels) and not in b
    assert rep["image"]["dq_differs"] == int(np.count_nonzero(dqa != dqb)) > 0
    # header: the product ids and sets differ and are volatile; HISTORY says what changed
    changed = {c["keyword"]: c for c in rep["header"]["changed"]}
    for key in ("PRODID", "PRODVER", "CALSET", "FILENAME"):
        assert changed[key]["volatile"] is True, key
        assert changed[key]["a"] == ha[key] and changed[key]["b"] == hb[key]
    assert changed["PRODID"]["a"] == v["a"] and changed["PRODID"]["b"] == v["b"]
    assert all(not c["volatile"] for c in rep["header"]["changed"] if c["keyword"] not in product_diff.VOLATILE)
    assert rep["header"]["history"]["added"] or rep["header"]["history"]["removed"]
    assert rep["a"]["options"] == {} and rep["b"]["options"] == {"flag_bad_pixels": False, "interpolation_order": 1}


def test_diff_pngs_are_diverging_and_symmetric(two_versions, client):
    from matplotlib import colormaps
    from matplotlib.image import imread

    v = two_versions
    q = {"a": v["a"], "b": v["b"]}
    a, dqa, _ = _arrays(v["paths"]["a"])
    b, dqb, _ = _arrays(v["paths"]["b"])
    good = (dqa == 0) & (dqb == 0) & np.isfinite(a) & np.isfinite(b)
    for name in ("difference", "ratio"):
        r = client.get(f"/api/v1/frames/{v['frame']}/diff/{name}.png", params=q)
        assert r.status_code == 200 and r.headers["content-type"] == "image/png", r.text
        img = imread(io.BytesIO(r.content))
        assert img.shape[:2] == a.shape
        half = float(r.headers["X-Limits-Half-Width"])
        assert half > 0
        # pixels not good in both are grey; origin lower: row 0 of the array is the last image row
        rgb = (img[::-1, :, :3] * 255).round().astype(int)
        assert (rgb[~good] == 128).all()
    diff = np.where(good, b - a, np.nan)
    assert half > 0
    r = client.get(f"/api/v1/frames/{v['frame']}/diff/difference.png", params=q)
    half = float(r.headers["X-Limits-Half-Width"])
    assert half == pytest.approx(np.percentile(np.abs(diff[good]), 99), rel=1e-5)
    img = (imread(io.BytesIO(r.content))[::-1, :, :3] * 255).round().astype(int)
    # the pixel of largest positive difference within the limits is red-ish, the most negative blue-ish
    inside = good & (np.abs(np.nan_to_num(diff)) <= half)
    pos = np.unravel_index(np.argmax(np.where(inside, diff, -np.inf)), diff.shape)
    neg = np.unravel_index(np.argmin(np.where(inside, diff, np.inf)), diff.shape)
    want_pos = np.round(np.array(colormaps["RdBu_r"](0.5 + diff[pos] / (2 * half))[:3]) * 255)
    assert np.abs(img[pos] - want_pos).max() <= 2
    assert img[pos][0] > img[pos][2] and img[neg][2] > img[neg][0]


def test_diff_errors(two_versions, client):
    v = two_versions
    url = f"/api/v1/frames/{v['frame']}/diff"
    r = client.get(url, params={"a": v["a"], "b": v["other"]})
    assert r.status_code == 422 and f"product {v['other']}" in r.json()["detail"] and "not of frame" in r.json()["detail"]
    r = client.get(url, params={"a": v["a"], "b": 999999})
    assert r.status_code == 404 and "no product with id 999999" in r.json()["detail"]
    r = client.get("/api/v1/frames/999999/diff", params={"a": v["a"], "b": v["b"]})
    assert r.status_code == 404 and "no frame" in r.json()["detail"]
    r = client.get(url, params={"a": v["a"], "b": v["planned"]})
    assert r.status_code == 409 and "planned, not written" in r.json()["detail"]
    r = client.get(f"{url}/ratio.png", params={"a": v["planned"], "b": v["a"]})
    assert r.status_code == 409
    r = client.get(url, params={"a": v["a"]})
    assert r.status_code == 422


def test_diff_page_renders_tables_and_images(two_versions, client):
    v = two_versions
    r = client.get(f"/frames/{v['frame']}/diff", params={"a": v["a"], "b": v["b"]})
    assert r.status_code == 200, r.text
    html = r.text
    assert 'data-keyword="CALSET"' in html and "volatile" in html
    assert f"/api/v1/frames/{v['frame']}/diff/difference.png?a={v['a']}&amp;b={v['b']}" in html
    assert 'id="diff-ratio"' in html and 'data-stat="difference"' in html
    rep = client.get(f"/api/v1/frames/{v['frame']}/diff", params={"a": v["a"], "b": v["b"]}).json()
    assert str(rep["image"]["difference"]["count"]) in html
    assert f"{rep['image']['difference']['max_abs_diff']:.6g}" in html
    # the other versions of the frame and the product page link here
    r = client.get(f"/frames/{v['frame']}/diff", params={"a": v["a"], "b": 999999})
    assert r.status_code == 404
    view = client.get(f"/products/{v['a']}/view")
    assert view.status_code == 200
    assert f"/frames/{v['frame']}/diff?a={v['a']}&amp;b={v['b']}" in view.text
