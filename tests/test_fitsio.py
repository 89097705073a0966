"""The tolerant FITS reader on the real files' quirks, and the atomic writer."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from astropy.io import fits

from pipelines.errors import FitsReadError
from pipelines.fitsio import fix_header, parse_date_obs, read_image, write_fits_atomic
from tests.conftest import SAMPLE, require


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("01-May-23 13:07:58.713", "2023-05-01T13:07:58.713"),  # ASO-S/HXI, two-digit year
        ("15-Oct-99 01:02:03", "1999-10-15T01:02:03.000"),
        ("01/01/30, 02:58:23.429", "2001-01-30T02:58:23.429"),  # TRACE
        ("2004-03-01T00:00:10.515Z", "2004-03-01T00:00:10.515"),  # EIT
        ("2007/05/03 10:20:18.005", "2007-05-03T10:20:18.005"),
        ("2011-02-15T00:00:00.34", "2011-02-15T00:00:00.340"),
        ("2024-05-01T08:00:00+08:00", "2024-05-01T00:00:00.000"),  # UTC offset
        ("2016-12-31T23:59:60.5", "2016-12-31T23:59:60.500"),  # a leap second is a valid UTC time
    ],
)
def test_parse_date_obs(text, iso):
    assert parse_date_obs(text).isot == iso


def test_leap_second_becomes_an_aware_datetime():
    from pipelines.fitsio import utc_datetime

    # datetime cannot hold second 60: the leap second is kept in the last millisecond of
    # 23:59:59 (pipelines.utc), before the next second's time, not equal to it
    t = utc_datetime(parse_date_obs("2016-12-31T23:59:60.5"))
    assert t.isoformat() == "2016-12-31T23:59:59.999500+00:00"
    assert utc_datetime(parse_date_obs("2017-01-01T00:00:00.5")) > t > utc_datetime(parse_date_obs("2016-12-31T23:59:59.5"))


def test_parse_date_obs_refuses_garbage():
    with pytest.raises(ValueError, match="DATE-OBS"):
        parse_date_obs("yesterday at noon")


def test_hxi_header_is_repaired():
    """The real ASO-S header: solar_x/arcsecs, SSW date, no observer keywords."""
    header = fits.Header.fromtextfile(str(SAMPLE / "aso-s/hxi_imgcube_01e02t_20230501_130758_HXI_CLEAN_0.header"))
    assert "HGLN_OBS" not in header
    header, fixes = fix_header(header)
    assert header["DATE-OBS"] == "2023-05-01T13:07:58.713"
    assert header["CTYPE1"] == "HPLN-TAN" and header["CTYPE2"] == "HPLT-TAN"
    assert header["CUNIT1"] == "arcsec"
    # Earth on 2023-05-01: B0 = -4.2 deg, distance 1.0075 au
    assert header["HGLT_OBS"] == pytest.approx(-4.2, abs=0.1)
    assert header["DSUN_OBS"] == pytest.approx(1.0075 * 1.495978707e11, rel=1e-3)
    assert any("observer" in f for f in fixes)


def test_tile_compressed_with_nans():
    img = read_image(SAMPLE / "full-disk/mdi.fd_ic.20101015_230100_TAI.data.fits")
    assert img.data.shape == (1024, 1024)
    assert img.hdu_index == 1  # the CompImageHDU, not the empty primary
    assert 0.1 < img.nan_fraction < 0.5  # NaN off the disk
    assert np.nanmax(img.data) > 1000


def test_bzero_unsigned():
    img = read_image(SAMPLE / "coronagraph/20070503_102018_s4c1a.fts")
    # stored as int16 with BZERO=32768: unscaled values would be negative (672 - 32768)
    assert img.data.min() == 672 and img.data.max() == 16382


def test_solar_x_ctype_and_gzip(tmp_path):
    src = SAMPLE / "full-disk/eit_sequence/efz20040301.000010_s.fits"
    gz = tmp_path / "eit.fits.gz"
    with open(src, "rb") as f, gzip.open(gz, "wb") as g:
        shutil.copyfileobj(f, g)
    img = read_image(gz)
    assert img.header["CTYPE1"] == "HPLN-TAN"
    assert img.date_obs.isot.startswith("2004-03-01T00:00:10")


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("not_actually_fits.fits", "not a FITS file"),
        ("medn_halph_fl_20050501_074655.fts", "truncated file"),
        ("gzip_test.fits.gz", "no DATE-OBS"),
    ],
)
def test_broken_files_give_one_line_reasons(name, reason):
    with pytest.raises(FitsReadError, match=reason) as info:
        read_image(SAMPLE / "bad-input" / name)
    assert "\n" not in str(info.value)


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "p.fits"
    hdul = fits.HDUList([fits.PrimaryHDU(np.ones((4, 4), np.float32))])
    sha = write_fits_atomic(hdul, target)
    assert len(sha) == 64
    with fits.open(target, checksum=True) as h:
        assert h[0].header["CHECKSUM"] and h[0].header["DATASUM"]

    class Boom(fits.HDUList):  # fails inside the write (astropy's writer and the lean one both verify first)
        def writeto(self, *a, **k):
            raise OSError("disk full")

        def verify(self, *a, **k):
            raise OSError("disk full")

    with pytest.raises(OSError):
        write_fits_atomic(Boom([fits.PrimaryHDU()]), tmp_path / "q.fits")
    assert not (tmp_path / "q.fits").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
    assert os.path.getsize(target) > 0


def test_partial_files_of_killed_writes_are_swept_and_live_ones_kept(tmp_path):
    """Issue 10: killed writes left 0-byte ``.part`` files in the product store. Swept: every
    old file of the store's ``.tmp/`` folder, and the hidden names that earlier versions left
    beside the products; kept: live writes (younger than the threshold) and other files."""
    import os
    import time

    from pipelines.fitsio import PARTIAL_MAX_AGE_S, partial_files, store_tmp_dir, sweep_partial_files

    d = tmp_path / "SDI" / "2024" / "05" / "10"
    d.mkdir(parents=True)
    tmp = store_tmp_dir(tmp_path)
    tmp.mkdir()
    old = [d / ".lst_sdi_l2_x.fits.abc123.part", d / ".lst_sdi_l2_x.fits.def456.part.png",
           tmp / "lst_sdi_l2_z.fits.k1.part", tmp / "lst_sdi_l2_z.png.k2.part.png", tmp / "anything"]
    live = [d / ".lst_sdi_l2_y.fits.ghi789.part", tmp / "lst_sdi_l2_w.fits.k3.part"]
    product = d / "lst_sdi_l2_x.fits"
    other = d / "notes.part"  # not a writer's temporary name, and not in the temporary folder
    for f in (*old, *live, product, other):
        f.write_bytes(b"")
    assert PARTIAL_MAX_AGE_S == 3600.0
    just_over = time.time() - PARTIAL_MAX_AGE_S - 60
    for f in (*old, product, other):
        os.utime(f, (just_over, just_over))
    assert partial_files(tmp_path) == sorted(old + live)
    assert sweep_partial_files(tmp_path) == sorted(old)
    assert all(f.exists() for f in (*live, product, other)) and not any(f.exists() for f in old)
    assert sweep_partial_files(tmp_path / "missing") == []
    assert sweep_partial_files(tmp_path, older_than_s=0, now=time.time() + 1) == sorted(live)


def test_atomic_writes_through_a_temporary_folder_leave_nothing_beside_the_product(tmp_path):
    """With ``tmp_dir`` the temporary file lies in that folder during the write (seen from
    inside the writer), the product is renamed into place readable by all the umask allows,
    and a failed write leaves neither the product nor a temporary file."""
    from pipelines.fitsio import store_tmp_dir, write_atomic
    from pipelines.products import write_quicklook_png

    store = tmp_path / "products"
    tmp = store_tmp_dir(store)
    target = store / "SDI" / "2024" / "lst_sdi_l2_a.fits"
    seen = []

    def write(f):
        seen.extend(tmp.iterdir())  # the file being written
        f.write(b"SIMPLE")

    old = os.umask(0o022)
    try:
        assert write_atomic(target, write, tmp_dir=tmp) == target
        png = write_quicklook_png(np.ones((8, 8), np.float32), np.zeros((8, 8), np.uint8),
                                  target.with_suffix(".png"), "SDI", tmp_dir=tmp)
    finally:
        os.umask(old)
    assert len(seen) == 1 and seen[0].name.startswith("lst_sdi_l2_a.fits.") and seen[0].suffix == ".part"
    assert target.read_bytes() == b"SIMPLE" and (target.stat().st_mode & 0o777) == 0o644
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (png.stat().st_mode & 0o777) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["lst_sdi_l2_a.fits", "lst_sdi_l2_a.png"]
    assert list(tmp.iterdir()) == []

    def boom(f):
        f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(store / "SDI" / "lst_sdi_l2_b.fits", boom, tmp_dir=tmp)
    assert not (store / "SDI" / "lst_sdi_l2_b.fits").exists() and list(tmp.iterdir()) == []


def test_a_temporary_folder_on_another_file_system_is_refused_before_writing(tmp_path):
    """``rename(2)`` across file systems fails (EXDEV) and a copy would not be atomic."""
    import tempfile

    from pipelines.fitsio import write_atomic

    shm = Path("/dev/shm")
    require(shm.is_dir() and os.stat(shm).st_dev != os.stat(tmp_path).st_dev,
            "no second file system (/dev/shm) to put the temporary folder on")
    called = []
    with tempfile.TemporaryDirectory(dir=shm) as other:
        with pytest.raises(ValueError, match="not on the file system"):
            write_atomic(tmp_path / "a.fits", called.append, tmp_dir=other)
        assert os.listdir(other) == []
    assert called == [] and not (tmp_path / "a.fits").exists()


def test_temporary_files_of_dead_writers_are_swept_at_once(tmp_path):
    """A worker killed mid-write leaves its temporary file; its name says who wrote it, so
    the reconciler removes it at once instead of after an hour."""
    import os
    import socket

    from pipelines.fitsio import store_tmp_dir, sweep_dead_writers

    tmp = store_tmp_dir(tmp_path)
    tmp.mkdir(parents=True)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    host = socket.gethostname()
    dead = tmp / f"a.fits.~{host}~{pid}~.x1.part"
    mine = tmp / f"b.fits.~{host}~{os.getpid()}~.x2.part"
    other_host = tmp / f"c.fits.~elsewhere~{pid}~.x3.part"
    unnamed = tmp / "d.fits.x4.part"
    for f in (dead, mine, other_host, unnamed):
        f.write_bytes(b"x")
    assert sweep_dead_writers(tmp_path) == [dead]
    assert sorted(p.name for p in tmp.iterdir()) == sorted(f.name for f in (mine, other_host, unnamed))
