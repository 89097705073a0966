"""Every L2 product passes HEASARC's ``fitsverify`` with 0 errors and 0 warnings (issue 25.7).

The products are made by the real chain (:func:`pipelines.calibration.l2.flow.calibrate_frame`)
and the one writer (:func:`pipelines.products.build_product_hdul`,
:func:`pipelines.fitsio.write_fits_atomic`) from small simulated frames of each channel
(SDI, WST, SCI-UV, SCI-WL), once per way a product can be written:

* the default options;
* each option that changes the header or the HDUs: no north-up resampling (the raw WCS
  kept), the OpenCV resampling, cosmic-ray removal, no bad-pixel flags; SDI with PSF
  deconvolution (a PSF master); SCI without stray-light subtraction;
* without ``UNCERT`` (a result made outside ``calibrate_frame``), and with the older
  ``DQ`` layout (one-row binary table, :func:`pipelines.products.dq_table_hdu`).

``fitsverify`` is Debian's package (``scripts/ensure-services.sh`` installs it). It exits
with the number of errors plus warnings; its one-line summary per file (``-q``) is what is
checked, and its full report is shown for a file that fails.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from astropy.io import fits

from pipelines.calibration.l2.options import CalibrationOptions
from tests.conftest import require

N = 48  # frame side [pixel]: small, every step still runs
CHANNELS = ("SDI", "WST", "SCI-UV", "SCI-WL")

#: name -> (options, channels it applies to); every channel when None
OPTION_VARIANTS: dict[str, tuple[dict, tuple[str, ...] | None]] = {
    "default": ({}, None),
    "no_north_up": ({"rotate_north_up": False}, None),
    "opencv_cubic": ({"resample": "opencv-cubic"}, None),
    "cosmic_rays": ({"remove_cosmic_rays": True}, None),
    "no_bad_pixel_flags": ({"flag_bad_pixels": False}, None),
    "psf_deconvolved": ({"deconvolve_psf": True, "psf_iterations": 3}, ("SDI",)),
    "no_stray_light": ({"subtract_stray_light": False}, ("SCI-UV", "SCI-WL")),
}


def _fitsverify() -> str:
    exe = shutil.which("fitsverify")
    require(exe is not None, "Debian's fitsverify is not installed (scripts/ensure-services.sh installs it)")
    return exe


@pytest.fixture(scope="module")
def products(tmp_path_factory) -> dict[str, Path]:
    """``{variant: path}`` of L2 products of every channel and way of writing (module docstring)."""
    from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
    from pipelines.calibration.masters.psf import gaussian_psf, psf_calibration_hdul
    from pipelines.fitsio import read_image, write_fits_atomic
    from pipelines.products import build_product_hdul, dq_table_hdu
    from pipelines.simulation import simulate

    root = tmp_path_factory.mktemp("fitsverify")
    sim = simulate(root / "sim", naxis=N, noise=True, seed=4, sdi_sequence=False)
    psf_path = root / "lst_sdi_psf_v01.fits"
    write_fits_atomic(psf_calibration_hdul(gaussian_psf(7, 1.5), "SDI", 1, "2000-01-01T00:00:00"), psf_path)
    out: dict[str, Path] = {}
    for frame in sim.frames:
        ch = frame.channel
        cals = {c.kind: load_calibration_master(c.path) for c in sim.calibration_files if c.channel == ch}
        if ch == "SDI":
            cals["psf"] = load_calibration_master(psf_path)
        raw = read_image(frame.raw_path)
        for name, (options, only) in OPTION_VARIANTS.items():
            if only is not None and ch not in only:
                continue
            result = calibrate_frame(raw.data, raw.header.copy(), cals, CalibrationOptions(**options))
            path = root / f"{ch}_{name}.fits"
            write_fits_atomic(build_product_hdul(result, software_version="test"), path)
            out[f"{ch}/{name}"] = path
            if name == "default":
                bare = dataclasses.replace(result, uncertainty=None)
                path = root / f"{ch}_no_uncert.fits"
                write_fits_atomic(build_product_hdul(bare, software_version="test"), path)
                out[f"{ch}/no_uncert"] = path
                hdul = build_product_hdul(result, software_version="test")
                hdul[-1] = dq_table_hdu(result.dq, hdul[-1].header.copy())
                path = root / f"{ch}_dq_table.fits"
                write_fits_atomic(hdul, path)
                out[f"{ch}/dq_table"] = path
    return out


def test_every_channel_and_option_is_covered(products):
    assert {k.split("/")[0] for k in products} == set(CHANNELS)
    assert len(products) == 4 * 7 + 1 + 2  # 5 shared options + 2 writer layouts per channel, PSF on SDI, stray on SCI
    with fits.open(products["SDI/default"]) as h:
        assert [x.name for x in h] == ["PRIMARY", "UNCERT", "DQ"]
        assert h[0].header["WCSAXES"] == 2
    with fits.open(products["SDI/psf_deconvolved"]) as h:
        assert h[0].header["PSFDECON"] is True
    with fits.open(products["WST/no_uncert"]) as h:
        assert [x.name for x in h] == ["PRIMARY", "DQ"]


def test_every_l2_product_passes_fitsverify_with_no_error_and_no_warning(products):
    exe = _fitsverify()
    names = sorted(products)
    run = subprocess.run([exe, "-q", *(str(products[n]) for n in names)], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("verification")]
    assert len(lines) == len(names), run.stdout + run.stderr
    failed = {}
    for name, line in zip(names, lines):
        assert str(products[name].name) in line, (name, line)
        if not line.startswith("verification OK"):
            report = subprocess.run([exe, str(products[name])], capture_output=True, text=True, timeout=60)
            report = report.stdout + report.stderr  # fitsverify writes its errors to stderr
            failed[name] = [ln.strip() for ln in report.splitlines() if re.search(r"\*\*\* (Error|Warning)", ln)]
    assert not failed, failed
    assert run.returncode == 0  # fitsverify's exit status: errors + warnings of all files


def test_wcsaxes_precedes_the_other_wcs_keywords(products):
    """The FITS standard 4.0 (sect. 8.2): WCSAXES before any other WCS keyword of the HDU."""
    wcs = re.compile(r"^(CTYPE|CUNIT|CRPIX|CRVAL|CDELT|CROTA|PC\d|CD\d|PV\d|PS\d|CRDER|CSYER|CNAME)")
    for name, path in products.items():
        with fits.open(path) as hdul:
            for hdu in hdul:
                keys = list(hdu.header.keys())
                if "WCSAXES" in keys:
                    first = next(i for i, k in enumerate(keys) if wcs.match(k) or k == "WCSAXES")
                    assert keys[first] == "WCSAXES", (name, hdu.name, keys[first])
