"""L2 product compression (``PRODUCT_COMPRESSION``, :mod:`pipelines.compression`; issue 29.3).

Each mode read back by astropy, sunpy and the project's own readers; ``lossless`` exact,
``noise`` within its stated error in units of each pixel's UNCERT, with the step set from
UNCERT (not from the data's scatter); DQ exact; header keywords as measured; CHECKSUM of the
compressed tables verified; fitsverify accepts both."""

from __future__ import annotations

import dataclasses
import io
import shutil
import subprocess
import warnings

import numpy as np
import pytest
from astropy.io import fits

from pipelines.calibration.l2.flow import calibrate_frame
from pipelines.compression import QSTEP_DATA, QSTEP_UNCERT, TILE, compress_product_hdul
from pipelines.errors import FitsReadError
from pipelines.fitsio import read_image, verify_checksums, write_fits_atomic
from pipelines.products import build_product_hdul, read_product, read_uncertainty
from tests.test_calibration_steps import _synthetic_wst
from tests.conftest import require
from tests.test_api import client, settings  # noqa: F401 - fixtures (client needs settings)

N = 70  # not a multiple of the 32-pixel tiles: edge tiles are narrower and shorter


@pytest.fixture(scope="module")
def result():
    raw, h, cals, _ = _synthetic_wst(N, roll=8.0)
    res = calibrate_frame(raw, h, cals)
    data = np.array(res.data, dtype=np.float32)
    data[5, 7:12] = 0.0  # exact zeros: SUBTRACTIVE_DITHER_2 keeps them
    data[60, 3] = np.nan
    dq = np.array(res.dq, dtype=np.uint8)
    dq[10:14, 20:25] |= 8
    return dataclasses.replace(res, data=data, dq=dq)


@pytest.fixture(scope="module")
def written(result, tmp_path_factory):
    root = tmp_path_factory.mktemp("compression")
    out = {}
    for mode in ("none", "lossless", "noise"):
        out[mode] = root / f"l2_{mode}.fits"
        write_fits_atomic(compress_product_hdul(build_product_hdul(result, "test"), mode), out[mode])
    return out


def _planes(path):
    with fits.open(path, memmap=False) as h:
        i = 0 if h[0].data is not None else 1
        return np.array(h[i].data), np.array(h["UNCERT"].data), np.array(h["DQ"].data), h[0].header.copy(), \
            [x.header.copy() for x in h]


def test_none_is_the_product_unchanged(result, written):
    hdul = build_product_hdul(result, "test")
    assert compress_product_hdul(hdul, "none") is hdul
    with fits.open(written["none"]) as h:
        assert [x.name for x in h] == ["PRIMARY", "UNCERT", "DQ"] and "CMPMODE" not in h[0].header
    with pytest.raises(ValueError, match="unknown product compression"):
        compress_product_hdul(hdul, "rice")


def test_lossless_is_bit_exact_and_smaller(result, written):
    data, sigma, dq, h0, headers = _planes(written["lossless"])
    with fits.open(written["lossless"]) as h:
        assert [x.name for x in h] == ["PRIMARY", "SCI", "UNCERT", "DQ"]
        assert all(isinstance(x, fits.CompImageHDU) for x in h[1:])
    with fits.open(written["lossless"], disable_image_compression=True) as h:
        assert [x.header["ZCMPTYPE"] for x in h[1:]] == ["GZIP_2", "GZIP_2", "PLIO_1"]
    np.testing.assert_array_equal(data.view(np.uint32), np.asarray(result.data, np.float32).view(np.uint32))
    np.testing.assert_array_equal(sigma.view(np.uint32), np.asarray(result.uncertainty, np.float32).view(np.uint32))
    np.testing.assert_array_equal(dq, result.dq)
    assert h0["CMPMODE"] == "lossless" and headers[1]["CMPMODE"] == "lossless"


@pytest.mark.parametrize("mode", ["lossless", "noise"])
def test_header_bytes_per_pixel_is_what_the_tables_hold(written, mode):
    with fits.open(written[mode], disable_image_compression=True) as h:
        sizes = [x.header["NAXIS1"] * x.header["NAXIS2"] + x.header["PCOUNT"] for x in h[1:]]
        cmp = [x.header["CMPBPP"] for x in h[1:]]
        total = h[0].header["CMPBPP"]
    assert cmp == pytest.approx([s / N**2 for s in sizes], abs=1e-4)
    assert total == pytest.approx(sum(sizes) / N**2, abs=1e-4)


def test_noise_error_is_within_its_bound_and_as_recorded(result, written):
    data, sigma, dq, h0, headers = _planes(written["noise"])
    want = np.asarray(result.data, np.float32)
    s = np.asarray(result.uncertainty, np.float32)
    np.testing.assert_array_equal(dq, result.dq)
    np.testing.assert_array_equal(np.isnan(data), np.isnan(want))
    assert np.all(data[5, 7:12] == 0.0)
    ok = np.isfinite(want) & np.isfinite(s) & (s > 0)
    rel = (data[ok].astype(np.float64) - want[ok]) / s[ok]
    assert np.max(np.abs(rel)) <= QSTEP_DATA / 2 * (1 + 1e-4)  # |err| <= step/2, step <= QSTEP x sigma
    rms = float(np.sqrt(np.mean(rel**2)))
    assert 0.03 < rms <= QSTEP_DATA / np.sqrt(12) + 0.005  # uniform error; quantization happened
    assert h0["CMPMODE"] == "noise" and headers[1]["CMPQSTEP"] == QSTEP_DATA
    assert h0["CMPQERR"] == pytest.approx(rms, abs=2e-5) and headers[1]["CMPQERR"] == h0["CMPQERR"]
    assert headers[1]["CMPQMAX"] == pytest.approx(np.max(np.abs(rel)), abs=2e-5)
    oku = np.isfinite(s) & (s > 0)
    relu = (sigma[oku].astype(np.float64) - s[oku]) / s[oku]
    assert np.max(np.abs(relu)) <= QSTEP_UNCERT / 2 * (1 + 1e-4)
    assert headers[2]["CMPUERR"] == pytest.approx(np.sqrt(np.mean(relu**2)), abs=2e-5)
    with fits.open(written["noise"], disable_image_compression=True) as h:
        assert h["SCI"].header["ZQUANTIZ"] == "SUBTRACTIVE_DITHER_2" and h["SCI"].header["ZCMPTYPE"] == "RICE_1"
        assert h["DQ"].header["ZCMPTYPE"] == "PLIO_1" and "ZQUANTIZ" not in h["DQ"].header


def test_noise_step_is_set_from_uncert_not_from_the_data(result):
    """Left tiles: sigma 1 and data with that scatter; right tiles: sigma 100 and data with no
    scatter at all. A step from the data's own noise (astropy's ``quantize_level``) would make
    the right half nearly exact; a step from one sigma for the whole frame would make it
    exact to 1 % of its sigma. Only a step from each tile's UNCERT gives err/sigma ~ 0.087 in
    both halves."""
    rng = np.random.default_rng(3)
    n = 64
    sigma = np.where(np.arange(n)[None, :] < 32, 1.0, 100.0) * np.ones((n, 1))
    data = 1000.0 + np.where(sigma == 1.0, rng.normal(0, 1, (n, n)), 0.0) + np.arange(n)[None, :] * 0.01
    hdr = result.header.copy()
    res = dataclasses.replace(result, data=data.astype(np.float32), uncertainty=sigma.astype(np.float32),
                              dq=np.zeros((n, n), np.uint8), header=hdr)
    hdul = compress_product_hdul(build_product_hdul(res, "test"), "noise")
    buf = io.BytesIO()
    hdul.writeto(buf)
    buf.seek(0)
    with fits.open(buf) as h:
        got = np.array(h[1].data, np.float64)
    rel = (got - data.astype(np.float32)) / sigma
    for half in (slice(0, 32), slice(32, n)):
        rms = float(np.sqrt(np.mean(rel[:, half] ** 2)))
        assert 0.07 < rms < 0.1, (half, rms)
    zscale = np.array(hdul[1].data["ZSCALE"])
    tiles_min = [sigma[j:j + TILE[0], i:i + TILE[1]].min() for j in range(0, n, TILE[0]) for i in range(0, n, TILE[1])]
    np.testing.assert_allclose(zscale, QSTEP_DATA * np.array(tiles_min), rtol=1e-6)


@pytest.mark.parametrize("mode", ["lossless", "noise"])
def test_project_readers_and_sunpy_read_a_compressed_product(result, written, mode):
    import sunpy.map

    from backend.render.image import open_product
    from pipelines.io import load_l2

    data, dq, header = read_product(written[mode])
    ref, _, ref_header = read_product(written["none"])
    assert data.shape == ref.shape and np.array_equal(dq, result.dq)
    tol = 0 if mode == "lossless" else QSTEP_DATA / 2 * np.nanmax(result.uncertainty)
    np.testing.assert_allclose(data, ref, atol=tol, rtol=0)
    assert read_uncertainty(written[mode]).shape == ref.shape
    for key in ("DATE-OBS", "CRVAL1", "CRPIX1", "CDELT1", "PC1_2", "BUNIT", "CALDARK", "LEVEL"):
        if key in ref_header:
            assert header[key] == ref_header[key], key
            assert fits.getheader(written[mode], 0)[key] == ref_header[key], key  # readers of HDU 0's header
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = sunpy.map.Map(written[mode], hdus=1)
        m0 = sunpy.map.Map(written["none"], hdus=0)
        both = sunpy.map.Map(written[mode])
    assert m.data.shape == m0.data.shape and m.wcs.to_header_string() == m0.wcs.to_header_string()
    np.testing.assert_allclose(m.data, m0.data, atol=tol, rtol=0)
    assert m.date == m0.date and m.unit == m0.unit
    assert len(both) == 3  # SCI, UNCERT, DQ (the header-only primary is no map)
    lm = load_l2(written[mode])
    assert lm.uncertainty is not None and np.array_equal(lm.mask, (result.dq != 0) | ~np.isfinite(ref))
    img = open_product(written[mode])
    np.testing.assert_allclose(np.asarray(img.data), ref, atol=tol, rtol=0)
    assert np.array_equal(np.asarray(img.dq), result.dq)
    raw = read_image(written[mode])  # the raw-frame reader: first 2-D image, checksums verified
    assert raw.data.shape == ref.shape


@pytest.mark.parametrize("mode", ["lossless", "noise"])
def test_checksums_of_compressed_tables_are_verified(written, tmp_path, mode):
    assert verify_checksums(written[mode]) == 4
    bad = tmp_path / f"bad_{mode}.fits"
    raw = bytearray(written[mode].read_bytes())
    with fits.open(written[mode], disable_image_compression=True) as h:
        at = h[1]._data_offset + h[1].header["NAXIS1"] * h[1].header["NAXIS2"] + 40  # a heap byte of SCI
    raw[at] ^= 0x5A
    bad.write_bytes(bytes(raw))
    with pytest.raises(FitsReadError, match="DATASUM mismatch in HDU 1"):
        verify_checksums(bad)


def test_fitsverify_accepts_compressed_products(written):
    exe = shutil.which("fitsverify")
    require(exe is not None, "Debian's fitsverify is not installed (scripts/ensure-services.sh installs it)")
    run = subprocess.run([exe, "-q", str(written["lossless"]), str(written["noise"])], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.count("verification OK") == 2, run.stdout + run.stderr


def test_setting_is_read_and_checked(monkeypatch):
    from pydantic import ValidationError

    from backend.settings import Settings

    monkeypatch.delenv("PRODUCT_COMPRESSION", raising=False)
    monkeypatch.delenv("LSTDP_PRODUCT_COMPRESSION", raising=False)
    assert Settings().product_compression == "none"
    monkeypatch.setenv("PRODUCT_COMPRESSION", "noise")
    assert Settings().product_compression == "noise"
    monkeypatch.setenv("PRODUCT_COMPRESSION", "lossy")
    with pytest.raises(ValidationError):
        Settings()


def test_noise_without_uncert_falls_back_to_lossless(result, tmp_path):
    bare = dataclasses.replace(result, uncertainty=None)
    hdul = compress_product_hdul(build_product_hdul(bare, "test"), "noise")
    assert [x.name for x in hdul] == ["PRIMARY", "SCI", "DQ"]
    assert hdul[0].header["CMPMODE"] == "lossless" and "no UNCERT" in str(hdul[0].header["HISTORY"])
    p = tmp_path / "bare.fits"
    write_fits_atomic(hdul, p)
    data, dq, _ = read_product(p)
    np.testing.assert_array_equal(data.view(np.uint32), np.asarray(result.data, np.float32).view(np.uint32))


def test_pipeline_writes_what_the_deployment_sets_and_every_route_reads_it(client, db_session, settings_env,
                                                                           simulated_dataset):
    """``PRODUCT_COMPRESSION=noise``: the calibration chain's product is compressed, its stored
    sha256 is the file's, and the product page, viewer cut-out, pixel probe and bulk archive
    read it."""
    import hashlib
    import tarfile

    from backend.models import Frame, ProductState
    from backend.services.ingest import ingest_path
    from backend.worker.processing import calibrate_product, plan_product

    s = settings_env(PRODUCT_COMPRESSION="noise")
    assert s.product_compression == "noise"
    sim = simulated_dataset(channels=("SDI",), naxis=64, noise=False, seed=5, sdi_sequence=False)
    outs = [ingest_path(db_session, p, s, move=False)
            for p in [c.path for c in sim.calibration_files] + list(sim.raw_files)[:1]]
    frame = next(db_session.get(Frame, o.frame_id) for o in outs if o.status == "ingested")
    prod, _ = plan_product(db_session, frame, pinned=None, options={}, job_id=None)
    prod = calibrate_product(db_session, prod.id, s)
    assert prod.state == ProductState.written, prod.error
    with fits.open(prod.path) as h:
        assert [x.name for x in h] == ["PRIMARY", "SCI", "UNCERT", "DQ"] and h[0].header["CMPMODE"] == "noise"
        assert h[0].header["CMPQERR"] <= 0.1
    with open(prod.path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == prod.sha256
    assert client.get(f"/api/v1/products/{prod.id}").status_code == 200
    r = client.get(f"/api/v1/products/{prod.id}/region.png", params={"x0": 8, "x1": 40, "y0": 8, "y1": 40})
    assert r.status_code == 200 and r.headers["content-type"] == "image/png", r.text
    r = client.get(f"/api/v1/products/{prod.id}/pixel", params={"x": 30, "y": 30})
    assert r.status_code == 200, r.text
    assert read_product(prod.path)[0].shape == (64, 64)
    r = client.get("/api/v1/products/archive", params={"channel": "SDI"})
    assert r.status_code == 200, r.text
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        names = [m.name for m in tar.getmembers() if m.name.endswith(".fits")]
        assert len(names) == 1
        member = tar.extractfile(names[0]).read()
    assert hashlib.sha256(member).hexdigest() == prod.sha256
