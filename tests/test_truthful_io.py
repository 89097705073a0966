"""Truthful inputs and outputs: checksums of raw frames, date fallbacks, one exposure reader,
the L2 dates, partial observer keywords, the reader's defaults in HISTORY, true refusal reasons."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from astropy.io import fits
from astropy.time import Time

from backend.db import session_scope
from backend.services.ingest import ingest_path
from pipelines.calibration.l2.flow import calibrate_frame
from pipelines.errors import DataError, FitsReadError
from pipelines import fitsio
from pipelines.fitsio import fix_header, read_image, write_fits_atomic
from pipelines.products import build_product_hdul
from tests.test_calibration_steps import _synthetic_wst, history
from tests.test_ingest import lst_raw


def _flip_data_byte(path: Path, hdu: int = 0) -> None:
    with fits.open(path) as h:
        off = h[hdu]._data_offset
    b = bytearray(path.read_bytes())
    b[off + 5] ^= 0x01
    path.write_bytes(bytes(b))


def _with_checksums(path: Path, extension: bool = False) -> Path:
    with fits.open(path) as h:
        hdus = [fits.PrimaryHDU(h[0].data, h[0].header)]
    if extension:
        hdus.append(fits.ImageHDU(np.arange(64, dtype=np.int16).reshape(8, 8), name="HK"))
    fits.HDUList(hdus).writeto(path, checksum=True, overwrite=True)
    return path


# -- 1. checksums ------------------------------------------------------------------------


def test_raw_frame_with_bad_datasum_is_quarantined(sqlite_env, tmp_path):
    p = _with_checksums(lst_raw(tmp_path / "bad.fits"))
    _flip_data_byte(p)
    with pytest.raises(FitsReadError, match=r"DATASUM mismatch in HDU 0 \(PRIMARY\)"):
        read_image(p)
    with session_scope() as s:
        out = ingest_path(s, p, sqlite_env)
    assert out.status == "rejected" and out.reason.startswith("DATASUM mismatch in HDU 0 (PRIMARY)")
    assert "\n" not in out.reason
    assert (Path(out.stored_path).parent / (Path(out.stored_path).name + ".reason")).read_text().startswith("DATASUM")


def test_calibration_master_with_bad_datasum_is_quarantined_on_ingest(sqlite_env, tmp_path):
    from tests.test_ingest import cal_master

    p = cal_master(tmp_path / "flat.fits")
    with fits.open(p) as h:
        h.writeto(p, checksum=True, overwrite=True)
    _flip_data_byte(p)
    with session_scope() as s:
        out = ingest_path(s, p, sqlite_env)
    assert out.status == "rejected" and out.reason.startswith("DATASUM mismatch in HDU 0 (PRIMARY)")


def test_bad_checksum_card_alone_is_a_checksum_mismatch(tmp_path):
    p = _with_checksums(lst_raw(tmp_path / "c.fits"))
    with fits.open(p, mode="update", checksum=False) as h:  # edit a card, keep the old CHECKSUM
        h[0].header["OBSERVER"] = "someone"
        h.flush(output_verify="ignore")
    b = p.read_bytes()
    assert b"OBSERVER" in b
    with pytest.raises(FitsReadError, match=r"CHECKSUM mismatch in HDU 0 \(PRIMARY\)"):
        read_image(p)


def test_good_checksums_and_none_are_both_accepted(tmp_path):
    assert read_image(_with_checksums(lst_raw(tmp_path / "ok.fits"), extension=True)).data.shape == (32, 32)
    assert read_image(lst_raw(tmp_path / "plain.fits")).data.shape == (32, 32)


# -- 2. dates ----------------------------------------------------------------------------


def test_bad_date_obs_falls_back_to_a_valid_date_obs_underscore(sqlite_env, tmp_path):
    p = lst_raw(tmp_path / "d.fits", date_obs="11-DEC-96")
    with fits.open(p, mode="update") as h:
        h[0].header["DATE_OBS"] = "2023-05-01T13:07:58.713"
    raw = read_image(p)
    assert raw.date_obs.isot == "2023-05-01T13:07:58.713"
    assert any("DATE-OBS '11-DEC-96' does not parse" in f and "DATE_OBS used" in f for f in raw.fixes)
    with session_scope() as s:
        assert ingest_path(s, p, sqlite_env).status == "ingested"


def test_date_beg_and_date_avg_are_tried_too():
    h = fits.Header({"DATE-OBS": "", "DATE-AVG": "2023-05-01T13:08:00"})
    h, fixes = fix_header(h)
    assert h["DATE-OBS"] == "2023-05-01T13:08:00.000"
    h = fits.Header({"DATE-OBS": "garbage", "DATE-BEG": "2023-05-01T13:07:00", "DATE-AVG": "2023-05-01T13:08:00"})
    assert fix_header(h)[0]["DATE-OBS"] == "2023-05-01T13:07:00.000"


def test_old_fits_dd_mm_yy_date_means_19yy_and_is_a_repair():
    h, fixes = fix_header(fits.Header({"DATE-OBS": "11/12/96", "TIME-OBS": "10:20:30.5"}))
    assert h["DATE-OBS"] == "1996-12-11T10:20:30.500"
    assert any("read as 1996" in f and "9.1.1" in f for f in fixes)
    h, fixes = fix_header(fits.Header({"DATE-OBS": "01-May-23 13:07:58.713"}))  # SSW / ASO-S practice
    assert h["DATE-OBS"] == "2023-05-01T13:07:58.713" and any("read as 2023" in f for f in fixes)


def test_a_date_without_its_time_of_day_says_so():
    """'11-DEC-96' (SSW, date only) with no TIME-OBS is a recognised date that lacks its time,
    not an unrecognised one (found by a reviewer trying ingest as a user)."""
    for value in ("11-DEC-96", "11/12/96"):
        with pytest.raises(FitsReadError, match="gives no time of day") as info:
            fix_header(fits.Header({"DATE-OBS": value}))
        assert "unrecognised" not in str(info.value)
    h, _ = fix_header(fits.Header({"DATE-OBS": "11-DEC-96", "TIME-OBS": "10:20:30"}))
    assert h["DATE-OBS"] == "1996-12-11T10:20:30.000"


def test_empty_date_obs_is_missing_not_unrecognised():
    with pytest.raises(FitsReadError) as info:
        fix_header(fits.Header({"DATE-OBS": ""}))
    assert "None" not in str(info.value) and "no DATE-OBS" in str(info.value)
    h = fits.Header()
    h.append(fits.Card("DATE-OBS", fits.card.UNDEFINED))
    with pytest.raises(FitsReadError, match="no DATE-OBS"):
        fix_header(h)


# -- 3. exposure -------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["XPOSURE", "EXPOSURE"])
def test_exposure_keywords_are_read_by_ingest_and_calibration_alike(sqlite_env, tmp_path, key):
    p = lst_raw(tmp_path / f"{key}.fits", exptime=2.0)
    with fits.open(p, mode="update") as h:
        h[0].header[key] = h[0].header.pop("EXPTIME")
    with session_scope() as s:
        out = ingest_path(s, p, sqlite_env)
    assert out.status == "ingested"
    raw, hdr, cals, _ = _synthetic_wst(48, roll=0.0)
    hdr[key] = hdr.pop("EXPTIME")
    res = calibrate_frame(raw, hdr, cals)
    assert np.isfinite(res.data).any() and fitsio.exposure_seconds(hdr) == 0.5
    with pytest.raises(DataError, match="positive"):
        fitsio.exposure_seconds(fits.Header({"XPOSURE": -1.0}))


# -- 4. L2 dates -------------------------------------------------------------------------


def _product(tmp_path: Path, **edit) -> Path:
    raw, h, cals, _ = _synthetic_wst(48, roll=0.0)
    for k, v in edit.items():
        h[k] = v
    res = calibrate_frame(raw, h, cals)
    out = tmp_path / "l2.fits"
    write_fits_atomic(build_product_hdul(res, software_version="test"), out)
    return out


def test_l2_product_carries_consistent_dates_sunpy_reads(tmp_path):
    import sunpy.map

    p = _product(tmp_path)
    h = fits.getheader(p)
    start = Time(h["DATE-OBS"])
    assert h["TIMESYS"] == "UTC" and h["DATE-BEG"] == h["DATE-OBS"]
    assert (Time(h["DATE-END"]) - start).to_value("s") == pytest.approx(0.5, abs=1e-3)
    assert (Time(h["DATE-AVG"]) - start).to_value("s") == pytest.approx(0.25, abs=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = sunpy.map.Map(p, hdus=0)
    assert m.date_start is not None and m.date_end is not None
    assert (m.date_end - m.date_start).to_value("s") == pytest.approx(0.5, abs=1e-3)
    assert all(str(v).strip() for k, v in h.items() if k.startswith("DATE"))


def test_l2_never_written_with_an_empty_date(tmp_path):
    with pytest.raises(DataError, match="DATE-OBS"):
        _product(tmp_path, **{"DATE-OBS": ""})


# -- 5. observer keywords ----------------------------------------------------------------


def test_partial_observer_keywords_are_kept_and_each_fill_recorded():
    h = fits.Header({"DATE-OBS": "2023-05-01T13:07:58", "DSUN_OBS": 1.49e11})
    h, fixes = fix_header(h)
    assert h["DSUN_OBS"] == 1.49e11
    assert any(f.startswith("HGLN_OBS missing") for f in fixes) and any(f.startswith("HGLT_OBS missing") for f in fixes)
    assert not any(f.startswith("DSUN_OBS missing") for f in fixes)


def test_dsun_obs_in_km_is_converted_and_an_implausible_one_refused():
    aso = {"TELESCOP": "ASO-S", "DATE-OBS": "2023-05-01T13:07:58"}
    h, fixes = fix_header(fits.Header({**aso, "DSUN_OBS": 1.5e8}))
    assert h["DSUN_OBS"] == pytest.approx(1.5e11) and any("km" in f for f in fixes)
    with pytest.raises(FitsReadError, match="implausible DSUN_OBS"):
        fix_header(fits.Header({**aso, "DSUN_OBS": 6.96e8}))
    # another mission's file (a simulator scene) keeps its own distance: PSP at 0.1 au
    assert fix_header(fits.Header({"TELESCOP": "Parker Solar Probe", "DATE-OBS": "2021-08-08T10:37:09",
                                   "DSUN_OBS": 1.57e10}))[0]["DSUN_OBS"] == 1.57e10


# -- 6. defaults in HISTORY --------------------------------------------------------------


def test_reader_defaults_reach_the_l2_history(tmp_path):
    p = lst_raw(tmp_path / "r.fits", channel="WST")  # ASO-S style: no observer keywords, no roll
    raw = read_image(p)
    _, _, cals, _ = _synthetic_wst(32, roll=0.0)
    res = calibrate_frame(raw.data, raw.header, cals)
    out = tmp_path / "l2.fits"
    write_fits_atomic(build_product_hdul(res, software_version="test"), out)
    text = history(fits.getheader(out)).replace(" ", "")  # long HISTORY wraps over cards
    for needle in ("read_image: HGLN_OBS missing", "read_image: HGLT_OBS missing", "read_image: DSUN_OBS missing",
                   "Earth's centre", "roll 0 assumed", "CUNIT1 'arcsecs' -> arcsec", "two-digit year '23' read as 2023"):
        assert needle.replace(" ", "") in text, needle


# -- 7. true reasons ---------------------------------------------------------------------


def test_header_saved_as_text_is_named_so(tmp_path):
    p = tmp_path / "header.fits"
    p.write_text(fits.Header({"SIMPLE": True, "BITPIX": 16, "NAXIS": 0}).tostring(sep="\n", endcard=True))
    with pytest.raises(FitsReadError) as info:
        read_image(p)
    assert "a FITS header saved as text" in str(info.value) and "no SIMPLE card" not in str(info.value)


def test_fresh_data_dir_says_run_db_upgrade(settings_env, tmp_path, capsys):
    from backend.cli import main

    settings_env()
    p = lst_raw(tmp_path / "x.fits")
    assert main(["ingest", str(p)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert err.startswith("lstdp ingest: error:") and err.endswith("run `lstdp db upgrade`") and "\n" not in err and "SQL" not in err


def test_a_database_folder_that_does_not_exist_says_run_db_upgrade(settings_env, tmp_path, capsys):
    """SQLite in a folder not made yet: the same one line, not 'unable to open database file'."""
    from backend.cli import main

    settings_env(DATABASE_URL=f"sqlite:///{tmp_path / 'not-made' / 'lstdp.sqlite3'}")
    assert main(["detect"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "lstdp detect: error: the database has no LST schema yet; run `lstdp db upgrade`"


def test_fresh_data_dir_api_is_503_run_db_upgrade(settings_env):
    from fastapi.testclient import TestClient

    from backend.api.app import create_app

    settings_env()
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        r = c.get("/api/v1/frames")
    assert r.status_code == 503 and "lstdp db upgrade" in r.json()["detail"]
