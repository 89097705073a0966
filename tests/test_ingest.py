"""Ingest and the calibration registry (embedded SQLite and real PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import numpy as np
import pytest
from astropy.io import fits
from sqlalchemy import func, select

from backend.db import session_scope
from backend.models import CalibrationFile, CalibrationKind, Frame
from backend.services.ingest import ingest_path
from backend.services.registry import select_calibrations
from pipelines.errors import CalibrationMissingError
from tests.conftest import SAMPLE


def lst_raw(path: Path, channel: str = "SDI", date_obs: str = "01-May-23 13:07:58.713", exptime: float = 2.0,
            seed: int = 0, shape: tuple[int, ...] = (32, 32)) -> Path:
    """A small raw frame in the ASO-S header style (two-digit year, solar_x, arcsecs); ``shape`` (NAXIS2, NAXIS1)."""
    rng = np.random.default_rng(seed)
    h = fits.Header()
    h["TELESCOP"] = "ASO-S"
    h["INSTRUME"] = "LST"
    h["DETECTOR"] = channel.split("-")[0]
    h["CHANNEL"] = channel
    h["WAVELNTH"] = {"SDI": 121.6, "WST": 360.0, "SCI-UV": 121.6, "SCI-WL": 700.0}[channel]
    h["DATE-OBS"] = date_obs
    h["EXPTIME"] = exptime
    h["CTYPE1"], h["CTYPE2"] = "solar_x", "solar_y"
    h["CUNIT1"], h["CUNIT2"] = "arcsecs", "arcsecs"
    h["CRPIX1"] = h["CRPIX2"] = 16.5
    h["CRVAL1"] = h["CRVAL2"] = 0.0
    h["CDELT1"] = h["CDELT2"] = 72.0
    data = rng.integers(100, 4000, size=shape).astype(np.uint16)
    fits.PrimaryHDU(data, h).writeto(path, overwrite=True)
    return path


def cal_master(path: Path, kind: str = "flat", channel: str = "SDI", version: int = 1,
               valid_from: str = "2023-01-01T00:00:00", valid_to: str = "") -> Path:
    h = fits.Header()
    h["CALKIND"], h["CHANNEL"], h["CALVER"] = kind, channel, version
    h["VALIDFRM"], h["VALIDTO"] = valid_from, valid_to
    h["CALDESC"] = f"test {kind}"
    fits.PrimaryHDU(np.full((32, 32), 1.0 + version / 100, np.float32), h).writeto(path, overwrite=True)
    return path


def test_ingest_frame_and_duplicate(sqlite_env, tmp_path):
    src = lst_raw(tmp_path / "sdi.fits")
    copy = tmp_path / "copy.fits"
    shutil.copy(src, copy)
    with session_scope() as s:
        out = ingest_path(s, src, sqlite_env)
    assert out.status == "ingested" and not src.exists()  # moved into the store
    assert Path(out.stored_path).is_relative_to(sqlite_env.raw / "SDI" / "2023" / "05" / "01")
    with session_scope() as s:
        f = s.get(Frame, out.frame_id)
        assert f.channel_code == "SDI"
        assert f.date_obs.replace(tzinfo=dt.UTC) == dt.datetime(2023, 5, 1, 13, 7, 58, 713000, dt.UTC)
        assert f.exposure_s == 2.0 and (f.naxis1, f.naxis2) == (32, 32)
        assert f.header["CTYPE1"] == "HPLN-TAN" and "HGLN_OBS" in f.header  # repaired on read
        assert any("DATE-OBS" in x for x in f.header["_fixes"])
    with session_scope() as s:
        again = ingest_path(s, copy, sqlite_env)
    assert again.status == "duplicate" and again.frame_id == out.frame_id
    assert copy.exists(), "a duplicate is left where it is"
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Frame)) == 1


@pytest.mark.parametrize("name", sorted(p.name for p in (SAMPLE / "bad-input").iterdir()))
def test_every_bad_input_file_is_rejected_and_kept(sqlite_env, tmp_path, name):
    src = tmp_path / name
    shutil.copy(SAMPLE / "bad-input" / name, src)
    with session_scope() as s:
        out = ingest_path(s, src, sqlite_env)
    assert out.status == "rejected"
    assert out.reason and "\n" not in out.reason and "Traceback" not in out.reason
    kept = Path(out.stored_path)
    assert kept.parent == sqlite_env.quarantine and kept.name.endswith("_" + name) and kept.read_bytes() == (SAMPLE / "bad-input" / name).read_bytes()
    assert kept.with_name(kept.name + ".reason").read_text().strip() == out.reason
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Frame)) == 0


def test_same_bad_file_is_quarantined_once(sqlite_env, tmp_path):
    for i in range(2):
        src = tmp_path / "junk.fits"
        src.write_text("<html>500 Internal Server Error</html>")
        with session_scope() as s:
            out = ingest_path(s, src, sqlite_env)
        assert out.status == "rejected" and not src.exists()
    kept = sorted(p.name for p in sqlite_env.quarantine.iterdir())
    assert len(kept) == 2 and kept[1] == kept[0] + ".reason"


def test_unreadable_file_is_rejected_and_the_batch_goes_on(sqlite_env, tmp_path, monkeypatch):
    import backend.services.ingest as ingest_mod

    bad, good = lst_raw(tmp_path / "a_unreadable.fits", seed=4), lst_raw(tmp_path / "b_good.fits", seed=5)
    real = ingest_mod.sha256_file

    def deny(path, *a, **k):
        if Path(path).name == bad.name:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(ingest_mod, "sha256_file", deny)
    from backend.cli import ingest_files

    assert ingest_files([bad, good], move=True, progress=False) == {"rejected": 1, "ingested": 1}
    assert bad.exists(), "a file that cannot be read is left where it is"


def test_rejections_do_not_stop_the_batch(sqlite_env, tmp_path):
    files = [tmp_path / "a.fits", tmp_path / "junk.fits", tmp_path / "b.fits"]
    lst_raw(files[0], seed=1)
    files[1].write_text("<html>500</html>")
    lst_raw(files[2], channel="WST", seed=2)
    from backend.cli import ingest_files

    counts = ingest_files(files, move=True, progress=False)
    assert counts == {"ingested": 2, "rejected": 1}


@pytest.mark.parametrize("channel,shape,needle", [
    ("SDI", (3, 3), "3x3 px image is too small for an LST SDI frame (at least 32 px a side)"),
    ("SCI-UV", (31, 64), "64x31 px image is too small for an LST SCI-UV frame"),
    ("SCI-WL", (2304, 2304), "2304x2304 px image is larger than the SCI-WL detector (2048x2048 px)"),
    ("WST", (32, 4609), "4609x32 px image is larger than the WST detector (4608x4608 px)"),
    ("SDI", (2, 32, 32), "image has 3 dimensions, expected 2"),
    ("WST", (40, 4608), "4608x40 px image is not square; LST WST frames are"),
], ids=["3x3", "one-side-31", "sdi-sized-sci", "wider-than-wst", "cube", "not-square"])
def test_frame_of_impossible_size_is_quarantined_and_the_batch_goes_on(sqlite_env, tmp_path, channel, shape, needle):
    bad = lst_raw(tmp_path / "a_bad.fits", channel=channel, shape=shape, seed=6)
    good = lst_raw(tmp_path / "b_good.fits", channel=channel, seed=7)
    with session_scope() as s:
        out = ingest_path(s, bad, sqlite_env)
    assert out.status == "rejected" and needle in out.reason and "\n" not in out.reason
    kept = Path(out.stored_path)
    assert kept.parent == sqlite_env.quarantine and not bad.exists()
    assert kept.with_name(kept.name + ".reason").read_text().strip() == out.reason
    from backend.cli import ingest_files

    assert ingest_files([good], move=True, progress=False) == {"ingested": 1}
    with session_scope() as s:
        assert [(f.naxis1, f.naxis2) for f in s.scalars(select(Frame))] == [(32, 32)]


@pytest.mark.parametrize("channel,shape", [
    ("SDI", (1152, 1152)),  # the demo's binned SDI/WST size (backend.cli.DEMO_SIZES)
    ("SCI-UV", (1024, 1024)),  # the demo's binned SCI size
    ("WST", (32, 32)),  # the smallest side
    ("WST", (4608, 4608)),  # the full detector
    ("SCI-WL", (2048, 2048)),
], ids=["sdi-1152", "sci-uv-1024", "wst-smallest", "wst-full", "sci-wl-full"])
def test_frames_of_lst_sizes_are_ingested(sqlite_env, tmp_path, channel, shape):
    src = lst_raw(tmp_path / "f.fits", channel=channel, shape=shape, seed=8)
    with session_scope() as s:
        out = ingest_path(s, src, sqlite_env)
    assert out.status == "ingested", out.reason
    with session_scope() as s:
        f = s.get(Frame, out.frame_id)
        assert (f.channel_code, f.naxis2, f.naxis1) == (channel, *shape)


def test_missing_exposure_is_rejected(sqlite_env, tmp_path):
    p = lst_raw(tmp_path / "x.fits")
    with fits.open(p, mode="update") as h:
        del h[0].header["EXPTIME"]
    with session_scope() as s:
        out = ingest_path(s, p, sqlite_env)
    assert out.status == "rejected" and "EXPTIME" in out.reason


def test_calibration_registration_and_conflict(sqlite_env, tmp_path):
    a = cal_master(tmp_path / "flat_v1.fits")
    b = cal_master(tmp_path / "flat_v1_other.fits")  # same version, other content
    with fits.open(b, mode="update") as h:
        h[0].data[0, 0] = 7.0
    with session_scope() as s:
        out = ingest_path(s, a, sqlite_env)
    assert out.status == "calibration"
    with session_scope() as s:
        out2 = ingest_path(s, b, sqlite_env)
    assert out2.status == "rejected" and "already registered" in out2.reason


@pytest.mark.postgres
def test_selection_newest_valid_and_pinned(db_session):
    s = db_session
    t = dt.datetime(2023, 5, 1, tzinfo=dt.UTC)

    def add(kind, version, start, end=None):
        f = CalibrationFile(channel_code="WST", kind=CalibrationKind(kind), version=version,
                            valid_from=start, valid_to=end, path=f"/x/{kind}{version}", sha256="0" * 64)
        s.add(f)
        s.flush()
        return f

    d1 = add("dark", 1, t - dt.timedelta(days=5))
    f1 = add("flat", 1, t - dt.timedelta(days=100))
    f2 = add("flat", 2, t - dt.timedelta(days=2))
    add("flat", 3, t + dt.timedelta(days=1))  # not yet valid
    add("flat", 4, t - dt.timedelta(days=50), t - dt.timedelta(days=10))  # expired
    r1 = add("radiometric", 1, t - dt.timedelta(days=400))
    sel = select_calibrations(s, "WST", t)
    assert sel.files["flat"].id == f2.id and sel.files["dark"].id == d1.id
    assert any("radiometric" in w for w in sel.warnings)  # far in time: recorded
    pinned = select_calibrations(s, "WST", t, {"flat": 1})
    assert pinned.files["flat"].id == f1.id and pinned.key != sel.key
    assert sel.files["radiometric"].id == r1.id
    with pytest.raises(CalibrationMissingError, match="pinned flat version 9"):
        select_calibrations(s, "WST", t, {"flat": 9})
    with pytest.raises(CalibrationMissingError, match="SCI-WL: no dark"):
        select_calibrations(s, "SCI-WL", t)
