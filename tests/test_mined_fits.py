"""Defects reported on public trackers (astropy, sunpy, punchbowl) in header reading, dates,
checksums, units and WCS, turned into tests of LST's raw-frame reader and L2 writer.

Each test is named after its thread; the thread's address is in the comment above it.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from astropy.io import fits
from astropy.time import Time

from pipelines import fitsio
from pipelines.calibration.l2.flow import calibrate_frame
from pipelines.errors import FitsReadError
from pipelines.fitsio import fix_header, read_image, write_fits_atomic
from pipelines.products import build_product_hdul, dq_table_hdu
from pipelines.sun import RSUN_REF_M
from tests.test_calibration_steps import _synthetic_wst, history
from tests.test_ingest import lst_raw


def _product(tmp_path: Path, drop=(), **edit) -> Path:
    raw, h, cals, _ = _synthetic_wst(48, roll=0.0)
    for k in drop:
        del h[k]
    for k, v in edit.items():
        h[k] = v
    out = tmp_path / "l2.fits"
    write_fits_atomic(build_product_hdul(calibrate_frame(raw, h, cals), software_version="test"), out)
    return out


def _map(path: Path):
    import sunpy.map

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sunpy.map.Map(path, hdus=0)  # HDU 0: the data (UNCERT and DQ are images too)


# https://github.com/astropy/astropy/issues/8115 (checksums verified only for the HDUs
# that are loaded): a corrupt extension of a raw frame must refuse the file although the
# reader only uses the primary image.
def test_astropy_8115_bad_datasum_in_an_unread_extension_is_refused(tmp_path):
    p = lst_raw(tmp_path / "f.fits")
    with fits.open(p) as h:
        hdul = fits.HDUList([fits.PrimaryHDU(h[0].data, h[0].header),
                             fits.ImageHDU(np.arange(64, dtype=np.int16).reshape(8, 8), name="HK")])
    hdul.writeto(p, checksum=True, overwrite=True)
    with fits.open(p) as h:
        off = h[1]._data_offset
    b = bytearray(p.read_bytes())
    b[off + 3] ^= 0xFF
    p.write_bytes(bytes(b))
    with pytest.raises(FitsReadError, match=r"DATASUM mismatch in HDU 1 \(HK\)"):
        read_image(p)


# https://github.com/astropy/astropy/issues/14917 (checksum=True is silent about what it
# did not verify): a header that gives only DATASUM is still verified, and a file with
# neither keyword is not reported as verified.
def test_astropy_14917_datasum_alone_is_verified_and_absence_is_not_a_pass(tmp_path):
    p = lst_raw(tmp_path / "f.fits")
    assert fitsio.verify_checksums(p) == 0  # nothing carried, nothing claimed
    with fits.open(p) as h:
        hdu = fits.PrimaryHDU(h[0].data, h[0].header)
    hdu.add_datasum()
    hdu.writeto(p, overwrite=True)
    assert "CHECKSUM" not in fits.getheader(p) and fitsio.verify_checksums(p) == 1
    with fits.open(p) as h:
        off = h[0]._data_offset
    b = bytearray(p.read_bytes())
    b[off + 1] ^= 0x10
    p.write_bytes(bytes(b))
    with pytest.raises(FitsReadError, match=r"DATASUM mismatch in HDU 0 \(PRIMARY\)"):
        read_image(p)


# https://github.com/astropy/astropy/issues/14396 (checksums of some tables fail their
# round trip): the L2 product, with its UNCERT and DQ images, verifies on read; so does the
# older layout whose DQ is a binary table.
def test_astropy_14396_product_checksums_verify_on_read(tmp_path):
    p = _product(tmp_path)
    assert fitsio.verify_checksums(p) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fits.open(p, checksum=True) as h:
            assert [x.name for x in h] == ["PRIMARY", "UNCERT", "DQ"]
            old = fits.HDUList([fits.PrimaryHDU(h[0].data, h[0].header), dq_table_hdu(h["DQ"].data)])
    write_fits_atomic(old, tmp_path / "old.fits")
    assert fitsio.verify_checksums(tmp_path / "old.fits") == 2


# https://github.com/sunpy/sunpy/issues/6513 (XPOSURE is the FITS 4 exposure keyword, not
# EXPTIME): a frame that gives EXPOSURE only is calibrated, and its product says the
# exposure in XPOSURE, which sunpy reads.
def test_sunpy_6513_exposure_only_frame_gives_a_product_with_xposure(tmp_path):
    raw, h, cals, _ = _synthetic_wst(48, roll=0.0)
    h["EXPOSURE"] = h.pop("EXPTIME")
    out = tmp_path / "l2.fits"
    write_fits_atomic(build_product_hdul(calibrate_frame(raw, h, cals), software_version="test"), out)
    assert fits.getheader(out)["XPOSURE"] == 0.5
    assert _map(out).exposure_time.to_value("s") == pytest.approx(0.5)


# https://github.com/sunpy/sunpy/issues/7673 (how maps take DATE-OBS, DATE-BEG, DATE-AVG,
# DATE-END): the product gives all four, consistent, and sunpy's properties read them.
def test_sunpy_7673_product_dates_as_sunpy_reads_them(tmp_path):
    m = _map(_product(tmp_path))
    assert m.date_start.isot == m.meta["date-obs"]
    assert (m.date_average - m.date_start).to_value("s") == pytest.approx(0.25, abs=1e-3)
    assert (m.date_end - m.date_start).to_value("s") == pytest.approx(0.5, abs=1e-3)
    assert m.reference_date == m.date_average  # observer metadata goes with the exposure's middle


# https://github.com/punch-mission/punchbowl/issues/948 (DATE-BEG, DATE-END, DATE-OBS and
# DATE-AVG all the same): they differ by the exposure.
def test_punchbowl_948_date_fields_are_not_all_the_same(tmp_path):
    h = fits.getheader(_product(tmp_path))
    beg, avg, end = (Time(h[k]) for k in ("DATE-BEG", "DATE-AVG", "DATE-END"))
    assert beg < avg < end and h["DATE-OBS"] == h["DATE-BEG"]


# https://github.com/punch-mission/punchbowl/issues/227 (dates written twice in the WCS
# header): every date keyword appears once in each HDU of the product.
def test_punchbowl_227_each_date_keyword_once_per_hdu(tmp_path):
    with fits.open(_product(tmp_path)) as hdul:
        for hdu in hdul:
            keys = [c.keyword for c in hdu.header.cards if c.keyword.startswith(("DATE", "TIMESYS", "MJD"))]
            assert len(keys) == len(set(keys)), (hdu.name, keys)
        assert hdul["DQ"].header["DATE-END"] == hdul[0].header["DATE-END"]


# https://github.com/sunpy/sunpy/pull/6436 (keywords present but empty, e.g. DATE-OBS,
# must behave as missing): an empty DATE-OBS beside a valid DATE_OBS is read from DATE_OBS.
def test_sunpy_6436_empty_date_obs_behaves_as_missing(tmp_path):
    p = lst_raw(tmp_path / "f.fits", date_obs="")
    with fits.open(p, mode="update") as h:
        h[0].header["DATE_OBS"] = "01-May-23 13:07:58.713"
    assert read_image(p).date_obs.isot == "2023-05-01T13:07:58.713"


# https://github.com/sunpy/sunpy/pull/2847 (don't assume arcseconds when CUNIT is missing):
# when the reader does assume it for an LST frame, it says so, and the product carries it.
def test_sunpy_2847_missing_cunit_is_a_recorded_default(tmp_path):
    p = lst_raw(tmp_path / "f.fits")
    with fits.open(p, mode="update") as h:
        del h[0].header["CUNIT1"], h[0].header["CUNIT2"]
    raw = read_image(p)
    assert raw.header["CUNIT1"] == raw.header["CUNIT2"] == "arcsec"
    assert sum("arcsec assumed" in f for f in raw.fixes) == 2
    assert "CUNIT1 missing: arcsec assumed" in history(raw.header)


# https://github.com/sunpy/sunpy/issues/3871 (a DATE-OBS with a space, not 'T', is not
# FITS compliant): a raw 'YYYY-MM-DD hh:mm:ss' becomes ISO 'T' in the product, and
# astropy.wcs has nothing to change in its dates.
def test_sunpy_3871_product_dates_are_fits_iso(tmp_path):
    from astropy.wcs import WCS

    h, _ = fix_header(fits.Header({"DATE-OBS": "2023-05-01 13:07:58.713"}))
    assert h["DATE-OBS"] == "2023-05-01T13:07:58.713"
    ph = fits.getheader(_product(tmp_path, **{"DATE-OBS": h["DATE-OBS"]}))
    for k in ("DATE-OBS", "DATE-BEG", "DATE-AVG", "DATE-END"):
        assert "T" in ph[k] and " " not in ph[k], k
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        WCS(ph)
    assert not [w for w in caught if "Changed DATE" in str(w.message)]  # 'datfix' only derives MJD-*


# https://github.com/sunpy/sunpy/issues/3182 (RSUN_OBS computed for an Earth observer
# whatever the header's observer): the product's RSUN_OBS follows its own DSUN_OBS.
def test_sunpy_3182_rsun_obs_follows_the_given_dsun_obs(tmp_path):
    d = 1.45e11
    ph = fits.getheader(_product(tmp_path, drop=("RSUN_OBS",), DSUN_OBS=d))
    assert ph["DSUN_OBS"] == d
    assert ph["RSUN_OBS"] == pytest.approx(math.degrees(math.asin(RSUN_REF_M / d)) * 3600, rel=1e-4)


# https://github.com/sunpy/sunpy/pull/8037 (only FITS units, and DN, parse as a map unit):
# the SDI/WST radiance unit parses in sunpy without a warning.
def test_sunpy_8037_l2_radiance_unit_parses_in_sunpy(tmp_path):
    import astropy.units as u

    m = _map(_product(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unit = m.unit
    assert unit == u.Unit("erg cm-2 s-1 sr-1")


# https://github.com/sunpy/sunpy/issues/405 (DATE-OBS and TIME-OBS in SOHO files): an ISO
# date in DATE-OBS with the time of day in TIME-OBS is one time, not midnight.
def test_sunpy_405_date_obs_with_time_obs_is_not_midnight():
    h, fixes = fix_header(fits.Header({"DATE-OBS": "2004-03-01", "TIME-OBS": "00:00:10.515"}))
    assert h["DATE-OBS"] == "2004-03-01T00:00:10.515"
