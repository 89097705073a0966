"""The GPU host side (issue 29, item 5): what moved to the device equals what the host did.

The device-side functions (:mod:`pipelines.calibration.l2.device`) are written once for NumPy
and CuPy; here they run on NumPy (the CPU stand-in of the device) and must give exactly the
host path's values: the raw frame decoded from its stored 16-bit words and its checksums
verified from their sum, the statistics (every field), the quicklook's block average, the
manifest's HDU digests hashed while writing. ``benchmarks/gpu_host.py`` runs end to end at a
tiny size (its figures come from full-size runs: ``benchmarks/reports/gpu_host.md``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from astropy.io import fits

from pipelines.calibration.l2 import device
from pipelines.calibration.l2.steps import DQ
from pipelines.errors import FitsReadError
from pipelines.fitsio import read_image, read_image_stored

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wst(tmp_path_factory):
    from pipelines.simulation import simulate

    out = tmp_path_factory.mktemp("gpu_host_sim")
    res = simulate(out, channels=("WST",), naxis={"WST": 96}, noise=True, seed=5, sdi_sequence=False)
    return out, res.frames[0].raw_path


def _with_sums(src: Path, dst: Path) -> Path:
    with fits.open(src) as h:
        h.writeto(dst, checksum=True)
    return dst


def test_stored_words_decode_to_the_read_frame_and_headers_agree(wst, tmp_path):
    _out, raw = wst
    ref = read_image(raw, dtype=np.float32)
    st = read_image_stored(raw)
    assert st.stored.dtype == np.uint16 and st.stored.shape == ref.data.shape
    got = device.decode_stored(st.stored)
    assert got.dtype == np.float32 and np.array_equal(got, ref.data)
    assert list(st.header.items()) == list(ref.header.items()) and st.fixes == ref.fixes
    with pytest.raises(TypeError):
        device.decode_stored(st.stored.astype(np.int32))
    # anything but pseudo-unsigned 16-bit is read converted, not as words
    fl = tmp_path / "float.fits"
    fits.PrimaryHDU(ref.data, header=fits.Header([c for c in ref.header.cards
                                                  if c.keyword not in ("BZERO", "BSCALE")])).writeto(fl)
    assert read_image_stored(fl) is None


def test_checksums_are_verified_from_the_words_sum_as_on_the_host(wst, tmp_path):
    _out, raw = wst
    good = _with_sums(raw, tmp_path / "sums.fits")
    st = read_image_stored(good, defer_sums=True)
    assert st.sums is not None and st.sums.has_datasum and st.sums.has_checksum
    ds = device.stored_datasum(st.stored)
    assert ds == st.sums.datasum
    st.sums.check(ds)
    read_image(good)  # the host verifies the same file
    # one flipped data byte: the host refuses it, and so does the deferred check, with the same reason
    bad = tmp_path / "bad.fits"
    b = bytearray(good.read_bytes())
    data_start = len(b) - st.stored.nbytes - ((-st.stored.nbytes) % 2880)
    b[data_start + 100] ^= 0x01  # one bit of one pixel
    bad.write_bytes(bytes(b))
    with pytest.raises(FitsReadError) as host:
        read_image(bad)
    stb = read_image_stored(bad, defer_sums=True)
    with pytest.raises(FitsReadError) as dev:
        stb.sums.check(device.stored_datasum(stb.stored))
    assert str(dev.value) == str(host.value) and "DATASUM mismatch" in str(dev.value)
    # without defer_sums the host verifies at once
    with pytest.raises(FitsReadError):
        read_image_stored(bad)


def test_stored_datasum_is_astropys_for_an_odd_number_of_words():
    words = np.arange(7 * 5, dtype=np.uint16).reshape(7, 5) * np.uint16(1999)  # 35 words: the last 32-bit one padded
    be = words.view(np.uint8).reshape(-1)  # the stored bytes, in file order
    assert device.stored_datasum(words) == int(fits.PrimaryHDU()._compute_checksum(be))
    assert device.stored_datasum(words[:6]) == int(fits.PrimaryHDU()._compute_checksum(words[:6].view(np.uint8).reshape(-1)))


def _frame(n: int, seed: int):
    rng = np.random.default_rng(seed)
    data = (rng.lognormal(3.0, 1.0, (n, n)) - 5.0).astype(np.float32)
    data[rng.random((n, n)) < 0.01] = np.nan
    dq = np.zeros((n, n), np.uint8)
    dq[rng.random((n, n)) < 0.03] = np.uint8(DQ.BAD_PIXEL)
    dq[: n // 20] |= np.uint8(DQ.NO_DATA)
    return data, dq


@pytest.mark.parametrize("n", [1100, 300])  # sampled percentiles (> 2**20 pixels), exact ones
def test_device_statistics_equal_the_host_statistics(n):
    from pipelines.calibration.l2 import flow

    data, dq = _frame(n, 11)
    h = fits.Header({"BUNIT": "DN"})
    ref = flow._stats(data, dq, h, "WST", "numpy")
    got = device.frame_statistics(data, dq, h, "WST", "numpy")
    assert got["percentiles"] == ref["percentiles"]
    assert got == ref
    nothing = np.full_like(dq, np.uint8(DQ.NO_DATA))
    assert device.frame_statistics(data, nothing, h, "WST", "numpy") == flow._stats(data, nothing, h, "WST", "numpy")


def test_quicklook_from_the_device_average_equals_the_full_frame_one(tmp_path):
    from pipelines.products import quicklook_image, quicklook_stretch, write_quicklook_png

    data, dq = _frame(300, 3)
    red = device.quicklook_reduce(data, dq, 64)  # blocks of 5 x 5
    assert red.shape == (60, 60)
    assert np.array_equal(quicklook_stretch(red, "WST"), quicklook_image(data, dq, "WST", 64), equal_nan=True)
    a = write_quicklook_png(data, dq, tmp_path / "a.png", "WST", 64)
    b = write_quicklook_png(data, dq, tmp_path / "b.png", "WST", 64, reduced=red)
    assert a.read_bytes() == b.read_bytes()
    # an average made for another size is not used
    c = write_quicklook_png(data, dq, tmp_path / "c.png", "WST", 64, reduced=device.quicklook_reduce(data, dq, 128))
    assert c.read_bytes() == a.read_bytes()


def test_lean_writer_hashes_the_manifest_digests_while_writing(tmp_path):
    from backend.services.manifests import hdu_digest, product_digests
    from pipelines.fitsio import write_fits_atomic

    rng = np.random.default_rng(2)
    hdul = fits.HDUList([fits.PrimaryHDU(rng.random((33, 41), dtype=np.float32)),
                         fits.ImageHDU(rng.random((33, 41), dtype=np.float32), name="UNCERT"),
                         fits.ImageHDU(rng.integers(0, 255, (33, 41), dtype=np.uint8), name="DQ"),
                         fits.ImageHDU(None, name="EMPTY")])
    got: list[str] = []
    write_fits_atomic(hdul, tmp_path / "p.fits", hdu_digests=got)
    assert got == [hdu_digest(h.data) for h in hdul]
    assert product_digests(hdul, got) == product_digests(hdul)
    with fits.open(tmp_path / "p.fits") as back:
        assert product_digests(back) == product_digests(hdul, got)


def test_calibrate_frame_makes_the_quicklook_average_when_asked(wst):
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.simulation import load_simulated_masters

    out, raw_path = wst
    raw = read_image(raw_path, dtype=np.float32)
    cals = load_simulated_masters(out, "WST")
    plain = calibrate_frame(raw.data, raw.header, cals, backend="numpy")
    res = calibrate_frame(raw.data, raw.header, cals, backend="numpy", quicklook_size=32)
    assert plain.quicklook is None
    assert np.array_equal(res.quicklook, device.quicklook_reduce(plain.data, plain.dq, 32), equal_nan=True)
    assert np.array_equal(res.uncertainty, plain.uncertainty, equal_nan=True) and res.stats == plain.stats


def test_device_meter_counts_outermost_sections_only():
    meter = device.DeviceMeter()
    with device.section("free"):  # no meter: nothing counted, nothing fails
        pass
    with meter.activate():
        with device.section("outer"):
            with device.section("inner"):
                sum(range(20000))
        with pytest.raises(RuntimeError):
            with device.DeviceMeter().activate():
                pass
    assert set(meter.cpu_s) == {"outer"} and meter.calls == {"outer": 1} and meter.total_s >= 0


def test_gpu_host_benchmark_prints_one_result_line(tmp_path):
    """The host-side benchmark at a tiny size: one RESULT line; its stubbed GPU path's product
    equals the plain CPU calibration's (``identical=1``)."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_host.py"), "--frames", "2", "--size", "96",
                        "--writers", "2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    num = r"([\d.]+)"
    phases = ("read", "stage", "calibrate_host", "build_hdul", "write_fits", "sha256", "digests", "quicklook",
              "header_json")
    m = re.fullmatch(rf"RESULT host_cpu_s_per_frame={num} host_fps_16_cores={num} device_stub_cpu_s_per_frame={num} "
                     + " ".join(f"{p}={num}" for p in phases) + r" other=(-?[\d.]+) frames=2 size=96 writers=2 "
                     r"identical=(\d)", last)
    assert m, last
    assert float(m.group(1)) > 0 and float(m.group(3)) > 0 and m.group(m.lastindex) == "1"
    assert list(tmp_path.iterdir()) == []  # its temporary products are gone
