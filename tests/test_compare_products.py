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
