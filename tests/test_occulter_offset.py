"""SCI occulter-to-Sun offset from a roll sequence (issue 27: the occulter is not centred on the Sun).

A synthetic corona with azimuthal structure turns about the Sun centre with the roll; the
occulter, fixed in the instrument, sits off the Sun by a known offset. The occulter fit finds the
occulter; the roll sequence finds the Sun.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from astropy.io import fits

from pipelines.calibration.l2.centre import fit_and_apply_centre
from pipelines.calibration.masters.occulter import measure_occulter_offset, offset_from_parameters, roll_weights
from pipelines.errors import DataError

N, SCALE, RSUN = 128, 32.0, 960.0  # 30 px to the solar radius
SUN = (63.4, 64.7)  # 0-based
OFFSET = (1.7, -1.1)  # occulter minus Sun [px]


def _frame(roll: float, rng, tilt: tuple[float, float] = (0.0, 0.0),
           jitter: tuple[float, float] = (0.0, 0.0)) -> tuple[np.ndarray, fits.Header]:
    """One roll of the sequence; ``jitter`` moves the Sun and the occulter together (pointing)."""
    y, x = np.mgrid[:N, :N].astype(float)
    a = math.radians(roll)
    sun = (SUN[0] + jitter[0], SUN[1] + jitter[1])
    dx, dy = x - sun[0], y - sun[1]
    ux, uy = math.cos(a) * dx - math.sin(a) * dy, math.sin(a) * dx + math.cos(a) * dy  # sky = R(roll) (det - sun)
    r, phi = np.hypot(ux, uy) / 30.0, np.arctan2(uy, ux)
    sky = 1e4 * np.maximum(r, 0.3) ** -3 * (1 + 0.3 * np.cos(2 * phi - 0.5) + 0.15 * np.cos(phi + 1.0))
    ro = np.hypot(x - sun[0] - OFFSET[0], y - sun[1] - OFFSET[1]) / 30.0
    shadow = np.sin(0.5 * np.pi * np.clip((ro - 1.0) / 0.1, 0, 1)) ** 2
    # a detector-fixed gain tilt [1/Rsun] (a diffuser flat's large-scale error): does not turn with the roll
    gain = 1.0 + (tilt[0] * (x - (N - 1) / 2) + tilt[1] * (y - (N - 1) / 2)) / 30.0
    img = rng.poisson(sky * shadow * gain).astype(float)
    h = fits.Header()
    h["CTYPE1"], h["CTYPE2"], h["CUNIT1"], h["CUNIT2"] = "HPLN-TAN", "HPLT-TAN", "arcsec", "arcsec"
    h["CRPIX1"], h["CRPIX2"] = SUN[0] + 1.0 + 0.8, SUN[1] + 1.0 - 0.5  # pointing error in the header
    h["CRVAL1"], h["CRVAL2"], h["CDELT1"], h["CDELT2"] = 0.0, 0.0, SCALE, SCALE
    h["CROTA2"], h["RSUN_OBS"], h["DATE-OBS"] = roll, RSUN, "2024-01-01T00:00:00"
    return img, h


def _sequence(seed: int, rolls=(0.0, 90.0, 180.0, 270.0), tilt=(0.0, 0.0), jitter_px: float = 0.0):
    rng = np.random.default_rng(seed)
    imgs, hdrs = [], []
    for roll in rolls:
        img, h = _frame(roll, rng, tilt, tuple(rng.uniform(-jitter_px, jitter_px, 2)))
        h1, _ = fit_and_apply_centre(img, h, coronagraph=True, occulter_rsun=1.1)  # the occulter, not the Sun
        imgs.append(img)
        hdrs.append(h1)
    return imgs, hdrs


@pytest.fixture(scope="module")
def sequence():
    return _sequence(11)


def test_occulter_fit_alone_finds_the_occulter_not_the_sun(sequence):
    _, hdrs = sequence
    h = hdrs[0]
    assert math.hypot(h["CRPIX1"] - 1 - SUN[0] - OFFSET[0], h["CRPIX2"] - 1 - SUN[1] - OFFSET[1]) < 0.1
    assert "taken as centred on the Sun" in "".join(str(v) for v in h["HISTORY"])


def test_roll_sequence_measures_the_offset_and_the_centre_step_applies_it(sequence):
    imgs, hdrs = sequence
    off = measure_occulter_offset(imgs, hdrs)
    assert off.n_frames == 4 and off.roll_balance < 1e-9
    assert math.hypot(off.dx_px - OFFSET[0], off.dy_px - OFFSET[1]) < 0.05
    assert 0.0 < off.sigma_px < 0.05
    kw = off.keywords()
    got = offset_from_parameters({k: v for k, (v, _) in kw.items()})
    assert got == pytest.approx((off.dx_px * SCALE, off.dy_px * SCALE, off.sigma_px * SCALE), abs=1e-3)
    img, h = _frame(0.0, np.random.default_rng(12))
    h_plain, _ = fit_and_apply_centre(img, h, coronagraph=True, occulter_rsun=1.1)
    h_off, _ = fit_and_apply_centre(img, h, coronagraph=True, occulter_rsun=1.1, occulter_offset_arcsec=got)
    err = math.hypot(h_off["CRPIX1"] - 1 - SUN[0], h_off["CRPIX2"] - 1 - SUN[1])
    assert err < 0.15  # on the Sun, not on the occulter (2.0 px away)
    assert h_off["CTRSRC"] == "FIT" and "occulter-to-Sun offset" in "".join(str(v) for v in h_off["HISTORY"])
    # the offset's 1-sigma is stated in the centre's systematic error
    assert h_off["CSYER1"] > h_plain["CSYER1"] and h_off["CSYER1"] >= off.sigma_px * SCALE * 0.99
    with pytest.raises(DataError, match="fewer than two"):
        measure_occulter_offset(imgs[:1], hdrs[:1])


def test_a_detector_fixed_gain_tilt_is_not_read_as_an_offset():
    """A 2 % per Rsun flat tilt (0.6 px per Rsun of a tilt across the 2.1 Rsun field) times a corona
    falling as r^-3 mimics a centre shift of about g r^2 / 3 = 0.03 Rsun (0.9 px at 30 px per Rsun):
    the roll average fits the tilt and finds the offset regardless, and reports the tilt."""
    imgs, hdrs = _sequence(13, tilt=(0.02, -0.015))
    off = measure_occulter_offset(imgs, hdrs)
    assert math.hypot(off.dx_px - OFFSET[0], off.dy_px - OFFSET[1]) < 0.05
    assert off.gradient == pytest.approx((0.02, -0.015), abs=0.003)
    kw = off.keywords()
    assert kw["OCCGRAD1"][0] == pytest.approx(off.gradient[0], rel=1e-3) and kw["OCCOFNFR"][0] == 4


def test_uneven_rolls_pointing_jitter_and_masked_pixels():
    """Rolls that surround the Sun unevenly are weighted so that m = 1 cancels; each frame's Sun and
    occulter move together by up to 2.5 px (pointing) and a patch of each is masked: the offset is
    still found. The same rolls unweighted leave m = 1 at 0.27 of the corona's."""
    rolls = (0.0, 100.0, 200.0, 250.0, 300.0)
    w, left = roll_weights(rolls)
    assert left < 1e-3 and w.min() >= 0 and w.sum() == pytest.approx(1.0)
    assert abs(np.mean(np.exp(1j * np.radians(rolls)))) > 0.2
    imgs, hdrs = _sequence(15, rolls=rolls, jitter_px=2.5)
    valid = []
    for k, img in enumerate(imgs):
        ok = np.ones(img.shape, bool)
        ok[20 + 7 * k:30 + 7 * k, 95:105] = False  # a bad column block, moving on the sky
        img[~ok] = 0.0  # what a masked pixel may hold
        valid.append(ok)
    off = measure_occulter_offset(imgs, hdrs, valid)
    assert math.hypot(off.dx_px - OFFSET[0], off.dy_px - OFFSET[1]) < 0.05
    assert off.n_frames == 5


def test_rolls_that_do_not_surround_the_sun_and_bad_inputs_are_refused(sequence):
    imgs, hdrs = _sequence(14, rolls=(0.0, 30.0, 60.0))
    with pytest.raises(DataError, match="do not surround the Sun"):
        measure_occulter_offset(imgs, hdrs)
    imgs, hdrs = sequence
    with pytest.raises(DataError, match="differ in shape"):
        measure_occulter_offset([imgs[0], imgs[1][:-1]], hdrs[:2])
    with pytest.raises(DataError, match="validity masks"):
        measure_occulter_offset(imgs, hdrs, [np.ones(imgs[0].shape, bool)])
    refused = [h.copy() for h in hdrs]
    for h in refused[1:]:
        h["FITCSTAT"] = "FAILED"
    with pytest.raises(DataError, match="accepted occulter fit"):
        measure_occulter_offset(imgs, refused)
    moved = [h.copy() for h in hdrs]
    moved[2].add_history("fit_sun_centre: occulter fit moved by the measured occulter-to-Sun offset (+1.0, +1.0)")
    with pytest.raises(DataError, match="already moved"):
        measure_occulter_offset(imgs, moved)
