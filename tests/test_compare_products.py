"""scripts/compare_products.py finds every kind of difference between two product trees."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from astropy.io import fits

from pipelines.products import dq_table_hdu

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("compare_products", ROOT / "scripts" / "compare_products.py")
cp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cp)


def _write(path: Path, data: np.ndarray, dq: np.ndarray, date: str = "2026-01-01T00:00:00", **cards) -> None:
    h = fits.Header()
    h["LEVEL"] = ("L2", "calibrated")
    h["DATE"] = (date, "[UTC] file creation time")
    for k, v in cards.items():
        h[k] = v
    path.parent.mkdir(parents=True, exist_ok=True)
    hdul = fits.HDUList([fits.PrimaryHDU(data=data, header=h), dq_table_hdu(dq)])
    hdul.writeto(path, checksum=True)


def test_identical_trees_agree_despite_creation_time_and_checksums(tmp_path):
    data = np.arange(16, dtype=np.float32).reshape(4, 4)
    data[0, 0] = np.nan
    dq = np.zeros((4, 4), np.uint8)
    _write(tmp_path / "a" / "SDI" / "p.fits", data, dq)
    _write(tmp_path / "b" / "SDI" / "p.fits", data.copy(), dq, date="2027-05-05T10:00:00")
    assert cp.compare_trees(tmp_path / "a", tmp_path / "b") == (1, [])
    assert cp.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0


def test_every_difference_is_found(tmp_path):
    data = np.ones((4, 4), np.float32)
    dq = np.zeros((4, 4), np.uint8)
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a / "x.fits", data, dq, BUNIT="MSB")
    _write(b / "x.fits", np.nextafter(data, 2), dq, BUNIT="MSB")  # one ulp
    _write(a / "y.fits", data, dq)
    _write(b / "y.fits", data, dq + np.eye(4, dtype=np.uint8))  # DQ
    _write(a / "z.fits", data, dq, BUNIT="MSB")
    _write(b / "z.fits", data, dq, BUNIT="erg cm-2 s-1 sr-1")  # a header value
    _write(a / "only_old.fits", data, dq)
    n, lines = cp.compare_trees(a, b)
    assert n == 3
    text = "\n".join(lines)
    assert "x.fits: HDU 0 (PRIMARY) data differ" in text
    assert "y.fits: HDU 1 (DQ) data differ" in text
    assert "z.fits: HDU 0 header: card" in text and "BUNIT" in text
    assert "only_old.fits" in text
    assert cp.main([str(a), str(b)]) == 1


def _write_l2(path: Path, data: np.ndarray, sigma: np.ndarray, dq: np.ndarray, nodata_history: int) -> None:
    h = fits.Header()
    h["LEVEL"] = ("L2", "calibrated")
    h.add_history(f"{nodata_history} pixels without data")
    path.parent.mkdir(parents=True, exist_ok=True)
    fits.HDUList([fits.PrimaryHDU(data=data, header=h), fits.ImageHDU(sigma, name="UNCERT"),
                  fits.ImageHDU(dq, name="DQ")]).writeto(path, checksum=True)


def test_tolerance_mode_allows_rounding_and_edge_fills_only(tmp_path):
    n = 12
    rng = np.random.default_rng(0)
    data = (rng.normal(0, 1, (n, n)) * 1000).astype(np.float32)
    sigma = np.abs(data) + np.float32(5)
    dq = np.zeros((n, n), np.uint8)
    dq[:, -2:] = cp.NO_DATA
    data[dq != 0] = np.nan
    sigma[dq != 0] = np.nan
    _write_l2(tmp_path / "a" / "W" / "p.fits", data, sigma, dq, int((dq != 0).sum()))
    # new: one column of slivers filled (edge fill), values moved by 1e-7 of the local scale
    d2, s2, q2 = data.copy(), sigma.copy(), dq.copy()
    q2[:, -2] = 0
    d2[:, -2] = 1.0
    s2[:, -2] = 2.0
    d2[3, 3] += np.float32(1e-7) * np.float32(np.abs(data[2:7, 1:6]).max())
    s2[4, 4] *= np.float32(1 + 5e-7)
    _write_l2(tmp_path / "b" / "W" / "p.fits", d2, s2, q2, int((q2 != 0).sum()))
    assert cp.compare_trees(tmp_path / "a", tmp_path / "b", tolerance=True) == (1, [])
    assert cp.main(["--tolerance", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert len(cp.compare_trees(tmp_path / "a", tmp_path / "b")[1]) >= 3  # the exact mode sees every change
    # beyond tolerance: data by 1e-6 of the local scale, UNCERT by 3e-6, a DQ bit inside the frame
    for what in ("data", "uncert", "dq", "fill-inside"):
        d3, s3, q3 = d2.copy(), s2.copy(), q2.copy()
        if what == "data":
            d3[6, 6] += np.float32(1e-6) * np.float32(np.abs(data[4:9, 4:9]).max())
        elif what == "uncert":
            s3[6, 6] *= np.float32(1 + 3e-6)
        elif what == "dq":
            q3[5, 5] = 32
        else:  # a NO_DATA pixel filled away from every remaining NO_DATA pixel is not an edge fill
            q3[:, -1] = 0
            d3[:, -1] = 1.0
            s3[:, -1] = 1.0
        _write_l2(tmp_path / what / "W" / "p.fits", d3, s3, q3, int((q3 != 0).sum()))
        n_cmp, lines = cp.compare_trees(tmp_path / "a", tmp_path / what, tolerance=True)
        assert n_cmp == 1 and lines, what
