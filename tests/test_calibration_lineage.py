"""Calibration lineage on real PostgreSQL (per-test rollback).

* ``GET /calibration-files/{id}/products`` lists the products made with a file (paginated);
  ``GET /calibration-files/{id}/impact`` only those a replacement would recompute (used
  the file, frame inside its validity interval, version not pinned, written).
* Through :func:`backend.worker.processing.plan_product` / ``calibrate_product`` on
  simulated frames and masters: the product header names every calibration file used,
  PSF included; a new flat version makes a new product version and keeps the old one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid

import numpy as np
import pytest
from astropy.io import fits
from sqlalchemy import func, select

from backend.models import (
    CalibrationFile,
    CalibrationKind,
    Frame,
    Product,
    ProductCalibrationFile,
    ProductState,
)

pytestmark = pytest.mark.postgres

T0 = dt.datetime(2024, 5, 14, 16, 0, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


@pytest.fixture
def client(api_client):
    return api_client


def _frame(session, when: dt.datetime) -> Frame:
    key = uuid.uuid4().hex
    f = Frame(channel_code="SDI", date_obs=when, exposure_s=1.0, level="L1", naxis1=64, naxis2=64,
              path=f"/nonexistent/{key}.fits", original_name=f"{key[:8]}.fits",
              sha256=hashlib.sha256(key.encode()).hexdigest(), size_bytes=1, header={})
    session.add(f)
    session.flush()
    return f


def _cal(session, version: int, start: dt.datetime, end: dt.datetime | None) -> CalibrationFile:
    c = CalibrationFile(channel_code="SDI", kind=CalibrationKind.flat, version=version, valid_from=start,
                        valid_to=end, path=f"/cal/flat_v{version}.fits",
                        sha256=hashlib.sha256(f"flat{version}{uuid.uuid4()}".encode()).hexdigest(), parameters={},
                        description=f"flat v{version}")
    session.add(c)
    session.flush()
    return c


def _product(session, frame: Frame, cal: CalibrationFile, version: int | None = None, *,
             state: ProductState = ProductState.written, pinned: dict | None = None) -> Product:
    if version is None:  # the next version of this frame (unique per frame)
        version = 1 + (session.scalar(select(func.max(Product.version)).where(Product.frame_id == frame.id)) or 0)
    p = Product(frame_id=frame.id, level="L2", version=version, calibration_key=f"flat:{cal.id}",
                params_hash=uuid.uuid4().hex[:16], parameters={"options": {}, "pinned": pinned or {}},
                software_version="test", state=state)
    session.add(p)
    session.flush()
    session.add(ProductCalibrationFile(product_id=p.id, calibration_file_id=cal.id))
    session.flush()
    return p


def test_products_and_impact_of_a_calibration_file(client, db_session):
    flat1 = _cal(db_session, 1, T0 - 30 * DAY, T0 + 30 * DAY)
    flat2 = _cal(db_session, 2, T0 + 30 * DAY, None)
    f_in1, f_in2, f_late = _frame(db_session, T0), _frame(db_session, T0 + DAY), _frame(db_session, T0 + 40 * DAY)
    f_edge = _frame(db_session, T0 + 30 * DAY)  # valid_to is exclusive: flat2 serves it
    p1 = _product(db_session, f_in1, flat1)
    p1b = _product(db_session, f_in1, flat1, version=2)  # e.g. other options: also recomputed
    p2 = _product(db_session, f_in2, flat1)
    p_pin_late = _product(db_session, f_late, flat1, pinned={"flat": 1})  # outside the interval, by pin
    p_pin_in = _product(db_session, f_in2, flat1, version=2, pinned={"flat": 1})  # pinned: keeps its pin
    p_failed = _product(db_session, f_in2, flat1, version=3, state=ProductState.failed)
    p_edge = _product(db_session, f_edge, flat1, pinned={"dark": 4})  # a pin of another kind does not protect
    p_other = _product(db_session, f_late, flat2)

    body = client.get(f"/api/v1/calibration-files/{flat1.id}/products", params={"limit": 3}).json()
    assert body["total"] == 7 and body["limit"] == 3 and len(body["items"]) == 3
    ids = [p["id"] for p in body["items"]]
    ids += [p["id"] for p in client.get(f"/api/v1/calibration-files/{flat1.id}/products",
                                        params={"limit": 3, "offset": 3}).json()["items"]]
    ids += [p["id"] for p in client.get(f"/api/v1/calibration-files/{flat1.id}/products",
                                        params={"limit": 3, "offset": 6}).json()["items"]]
    assert ids == [p1.id, p1b.id, p2.id, p_pin_in.id, p_failed.id, p_edge.id, p_pin_late.id]  # by DATE-OBS, version
    assert body["items"][0]["channel"] == "SDI" and body["items"][0]["date_obs"] == "2024-05-14T16:00:00Z"

    imp = client.get(f"/api/v1/calibration-files/{flat1.id}/impact").json()
    assert [p["id"] for p in imp["items"]] == [p1.id, p1b.id, p2.id]
    assert imp["total"] == 3 and imp["calibration_file"]["id"] == flat1.id
    assert "validity interval" in imp["rule"] and "pinned" in imp["rule"]
    imp2 = client.get(f"/api/v1/calibration-files/{flat2.id}/impact").json()
    assert [p["id"] for p in imp2["items"]] == [p_other.id]
    assert client.get(f"/api/v1/calibration-files/{flat2.id}/products").json()["total"] == 1

    r = client.get("/api/v1/calibration-files/424242/impact")
    assert r.status_code == 404 and "no calibration file with id 424242" in r.json()["detail"]
    assert client.get("/api/v1/calibration-files/424242/products").status_code == 404
    assert client.get(f"/api/v1/calibration-files/{flat1.id}/products", params={"limit": 0}).status_code == 422


# -- through the processing services, on simulated files ----------------------------------------


N = 64


@pytest.fixture(scope="module")
def simulated(simulated_dataset):
    return simulated_dataset(channels=("SDI",), naxis=N, noise=False, seed=5, sdi_sequence=False)  # shared, read-only


def _ingest_all(session, paths, settings):
    from backend.services.ingest import ingest_path

    outs = [ingest_path(session, p, settings, move=False) for p in paths]
    assert all(o.status in ("ingested", "calibration") for o in outs), [(o.status, o.reason) for o in outs]
    return outs


def _psf_master(path, channel: str, version: int, valid_from: str, valid_to: str):
    from pipelines.calibration.masters.psf import gaussian_psf, psf_calibration_hdul
    from pipelines.fitsio import write_fits_atomic

    write_fits_atomic(psf_calibration_hdul(gaussian_psf(7, 1.5), channel, version, valid_from, valid_to,
                                           fwhm_px=1.5, model="gaussian", naxis=N), path)
    return path


def test_recalibration_with_a_new_flat_version_keeps_the_old_product(db_session, settings_env, simulated, tmp_path):
    from backend.worker.processing import calibrate_product, plan_product
    from pipelines.calibration.l2.flow import CAL_KEYWORDS
    from pipelines.fitsio import write_fits_atomic
    from pipelines.products import read_product

    settings = settings_env()
    cal1 = {c.kind: c for c in simulated.calibration_files}
    psf = _psf_master(tmp_path / "lst_sdi_psf_64_v01.fits", "SDI", 1, cal1["flat"].valid_from,
                      cal1["flat"].valid_to)
    _ingest_all(db_session, [c.path for c in simulated.calibration_files] + [psf], settings)
    (frame_out,) = _ingest_all(db_session, simulated.raw_files, settings)
    frame = db_session.get(Frame, frame_out.frame_id)

    prod1, new = plan_product(db_session, frame, pinned=None, options={}, job_id=None)
    assert new
    prod1 = calibrate_product(db_session, prod1.id, settings)
    assert prod1.state == ProductState.written, prod1.error
    data1, _, h1 = read_product(prod1.path)
    # the header names every calibration file and version used; a registered PSF master is
    # not part of the set unless the job asks for deconvolution
    used = {f.kind.value: f for f in prod1.calibration_files}
    assert set(used) == {"dark", "flat", "radiometric", "mask_geometry"}
    for kind, f in used.items():
        name, ver, cid, sha = CAL_KEYWORDS[kind]
        assert h1[ver] == f.version and h1[cid] == f.id and h1[sha] == f.sha256, kind
        assert h1[name] == f.path.rsplit("/", 1)[1], kind
    assert "deconvolve_psf" in "".join(str(v) for v in h1["HISTORY"])  # skipped, and said so

    # a re-plan with the same calibration set is a no-op
    same, new = plan_product(db_session, frame, pinned=None, options={}, job_id=None)
    assert same.id == prod1.id and not new

    # flat version 2: the same flat with a 2 % gain step in the left half, same validity
    with fits.open(cal1["flat"].path) as hd:
        hdul = fits.HDUList([h.copy() for h in hd])
    hdul[0].data = hdul[0].data.copy()
    hdul[0].data[:, : N // 2] *= np.float32(1.02)
    hdul[0].header["CALVER"] = 2
    for key in ("CHECKSUM", "DATASUM"):
        hdul[0].header.remove(key, ignore_missing=True)
    flat2 = tmp_path / "lst_sdi_flat_64_v02.fits"
    write_fits_atomic(hdul, flat2)
    _ingest_all(db_session, [flat2], settings)

    prod2, new = plan_product(db_session, frame, pinned=None, options={}, job_id=None)
    # versions are calibration set ids: a new set, the same meaning on every frame
    assert new and prod2.id != prod1.id and prod2.calibration_key != prod1.calibration_key
    assert prod1.version == prod1.calibration_set_id and prod2.version == prod2.calibration_set_id != prod1.version
    prod2 = calibrate_product(db_session, prod2.id, settings)
    assert prod2.state == ProductState.written, prod2.error
    data2, _, h2 = read_product(prod2.path)
    assert h2["CALFLVER"] == 2 and h1["CALFLVER"] == 1 and h2["PRODVER"] == prod2.version
    assert h2["CALSET"] == prod2.calibration_set_id and h1["CALSET"] == prod1.calibration_set_id

    # the old version is kept, file and row, unchanged
    db_session.expire_all()
    old = db_session.get(Product, prod1.id)
    assert old.state == ProductState.written and old.path != prod2.path
    again, _, _ = read_product(old.path)
    assert np.array_equal(again, data1, equal_nan=True)
    assert hashlib.sha256(open(old.path, "rb").read()).hexdigest() == old.sha256
    versions = db_session.scalars(select(Product.version).where(Product.frame_id == frame.id)
                                  .order_by(Product.version)).all()
    assert versions == sorted([prod1.version, prod2.version])
    # the new flat moved the values by its 2 % step (in the detector's left half: the frame's
    # roll is under a degree, so the L2 left and right quarters lie on either side of it)
    good = np.isfinite(data1) & np.isfinite(data2) & (data1 > 0)
    ratio = np.where(good, data2 / np.where(good, data1, 1), np.nan)
    assert np.nanmedian(ratio[:, : N // 4]) == pytest.approx(1 / 1.02, abs=2e-3)
    assert np.nanmedian(ratio[:, -N // 4:]) == pytest.approx(1.0, abs=2e-3)

    # pinning flat version 1 gives back the first product (same calibration set)
    pinned, new = plan_product(db_session, frame, pinned={"flat": 1}, options={}, job_id=None)
    assert pinned.calibration_key == prod1.calibration_key and pinned.params_hash == prod1.params_hash
    assert pinned.id == prod1.id and not new

    # the same files and options under another software version are another set (its
    # products may differ): a new release recalibrates, it never reuses the old set's id
    import backend.services.calibration_sets as sets_mod

    real = sets_mod.__version__
    sets_mod.__version__ = real + "+next"
    try:
        nxt, new = plan_product(db_session, frame, pinned={"flat": 1}, options={}, job_id=None)
    finally:
        sets_mod.__version__ = real
    assert new and nxt.calibration_key == prod1.calibration_key and nxt.params_hash == prod1.params_hash
    assert nxt.calibration_set_id != prod1.calibration_set_id and nxt.calibration_set.software_version == real + "+next"

    # PSF deconvolution asked for: the PSF master joins the set and the header names it too
    prod_psf, new = plan_product(db_session, frame, pinned=None, options={"deconvolve_psf": True}, job_id=None)
    assert new and "psf" in {f.kind.value for f in prod_psf.calibration_files}
    prod_psf = calibrate_product(db_session, prod_psf.id, settings)
    assert prod_psf.state == ProductState.written, prod_psf.error
    _, _, hp = read_product(prod_psf.path)
    for kind, f in {f.kind.value: f for f in prod_psf.calibration_files}.items():
        name, ver, cid, sha = CAL_KEYWORDS[kind]
        assert hp[ver] == f.version and hp[cid] == f.id and hp[sha] == f.sha256, kind


def test_psf_deconvolution_is_selected_per_job(db_session, settings_env, simulated, tmp_path):
    """``options={'deconvolve_psf': True}`` makes a separate product, deconvolved with the
    registered PSF master (which only that product's calibration set holds); without a PSF
    master the plan fails with the reason."""
    from backend.worker.processing import calibrate_product, plan_product
    from pipelines.errors import CalibrationMissingError
    from pipelines.products import read_product

    settings = settings_env()
    cal1 = {c.kind: c for c in simulated.calibration_files}
    _ingest_all(db_session, [c.path for c in simulated.calibration_files], settings)
    (frame_out,) = _ingest_all(db_session, simulated.raw_files, settings)
    frame = db_session.get(Frame, frame_out.frame_id)
    opts = {"deconvolve_psf": True, "psf_iterations": 5}
    with pytest.raises(CalibrationMissingError, match="psf"):
        plan_product(db_session, frame, pinned=None, options=opts, job_id=None)

    psf = _psf_master(tmp_path / "lst_sdi_psf_64_v01.fits", "SDI", 1, cal1["flat"].valid_from,
                      cal1["flat"].valid_to)
    _ingest_all(db_session, [psf], settings)
    plain, _ = plan_product(db_session, frame, pinned=None, options={}, job_id=None)
    deconv, new = plan_product(db_session, frame, pinned=None, options=opts, job_id=None)
    assert new and deconv.id != plain.id and deconv.params_hash != plain.params_hash
    plain = calibrate_product(db_session, plain.id, settings)
    deconv = calibrate_product(db_session, deconv.id, settings)
    assert plain.state == deconv.state == ProductState.written, (plain.error, deconv.error)
    d_plain, dq, h_plain = read_product(plain.path)
    d_dec, _, h_dec = read_product(deconv.path)
    assert h_dec["PSFDECON"] is True and "PSFDECON" not in h_plain and "CALPSF" not in h_plain
    assert h_dec["CALPSF"] == "lst_sdi_psf_64_v01.fits" and h_dec["CALPSVER"] == 1
    text = "".join(str(v) for v in h_dec["HISTORY"])
    assert "deconvolve_psf: Richardson-Lucy, 5 iterations, PSF 7x7 from lst_sdi_psf_64_v01.fits" in text
    good = (dq == 0) & np.isfinite(d_plain) & np.isfinite(d_dec)
    assert not np.allclose(d_dec[good], d_plain[good], rtol=1e-4)
