"""The demo's extra days in the simulator: the XRS day's SDI series (2011-06-07, GOES M2.5) and
the WST frame from the Helioviewer HMI JPEG 2000 (2023-01-31)."""

from __future__ import annotations

import datetime as dt
import math

import astropy.units as u
import numpy as np
import pytest
from astropy.coordinates import SkyCoord
from astropy.io import fits
from astropy.time import Time
from astropy.wcs import WCS

from pipelines.simulation import simulate
from pipelines.simulation.series import XRS_DAY


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim_days")
    return simulate(out, channels=("SDI", "WST"), naxis=64, noise=False, xrs_day=True, wst_helioviewer=True)


def _history(h) -> str:
    """HISTORY joined with every blank removed (FITS wraps it at 72 characters, blanks lost)."""
    return "".join("".join(str(x).split()) for x in h["HISTORY"])


def _frames(sim, chan, day):
    return [f for f in sim.frames if f.channel == chan and f.date_obs.startswith(day)]


def test_xrs_day_series_times_and_the_flare_of_the_goes_report(sim):
    frames = _frames(sim, "SDI", "2011-06-07")
    assert len(frames) == XRS_DAY["n_frames"] == 25
    times = [Time(f.date_obs) for f in frames]
    assert times[0].isot == "2011-06-07T05:20:00.000" and times[-1].isot == "2011-06-07T07:44:00.000"
    assert {round((b - a).to_value(u.s)) for a, b in zip(times, times[1:])} == {360}
    assert len(_frames(sim, "SDI", "2004-03-01")) == 13, "the EIT day is still there"
    assert len(sim.flares) == 2 and sim.flare is sim.flares[0]
    fl = sim.flares[1]
    # the GOES report row "31777110607  0616 0659 0641 ... M 25 G15 ... 11226"
    assert (fl.start, fl.peak, fl.end) == ("2011-06-07T06:16:00.000", "2011-06-07T06:41:00.000",
                                           "2011-06-07T06:59:00.000")
    # S21W54 seen from Earth at the peak, computed here with sunpy directly
    from sunpy.coordinates import HeliographicStonyhurst, Helioprojective, get_earth

    t = Time("2011-06-07T06:41:00", scale="utc")
    c = SkyCoord(54 * u.deg, -21 * u.deg, 1 * u.R_sun, frame=HeliographicStonyhurst(obstime=t))
    hpc = c.transform_to(Helioprojective(observer=get_earth(t), obstime=t))
    assert fl.hpc_x == pytest.approx(hpc.Tx.to_value(u.arcsec), abs=1.0)
    assert fl.hpc_y == pytest.approx(hpc.Ty.to_value(u.arcsec), abs=1.0)
    amps = dict(fl.profile)
    assert amps["2011-06-07T06:14:00.000"] == 0.0 and amps["2011-06-07T07:02:00.000"] == 0.0
    assert max(amps, key=amps.get) == "2011-06-07T06:38:00.000"  # the frame next to the GOES peak 06:41
    assert max(amps.values()) == pytest.approx(XRS_DAY["peak_enhancement"] * 22 / 25, rel=1e-6)  # linear rise


def test_xrs_day_frames_say_their_scene_is_not_of_that_day(sim):
    for f in _frames(sim, "SDI", "2011-06-07"):
        h = fits.getheader(f.raw_path)
        assert h["SCENEFIL"] == "full-disk/swap_lv1_20120101_001607.fits"
        assert h["SCENEOBS"].startswith("2012-01-01T00:16:07")
        history = _history(h)
        assert "sceneNOTofthisday" in history and "S21W54" in history and "(NOAA11226" in history
        th = fits.getheader(f.truth_path)
        assert th["SCENEOBS"] == h["SCENEOBS"] and th["DATE-OBS"] == f.date_obs


def test_xrs_day_flare_is_in_the_truth_where_it_was_injected(sim):
    fl = sim.flares[1]
    peak = next(f for f in sim.frames if f.date_obs == "2011-06-07T06:38:00.000")
    with fits.open(peak.truth_path) as hd:
        flare = hd["FLARE"].data
        w = WCS(hd[0].header, fix=False)
    j, i = np.unravel_index(np.argmax(flare), flare.shape)
    x, y = w.pixel_to_world_values(i, j)
    scale = abs(hd[0].header["CDELT1"])
    assert math.hypot(x * 3600 - fl.hpc_x, y * 3600 - fl.hpc_y) < scale
    quiet = next(f for f in sim.frames if f.date_obs == "2011-06-07T05:20:00.000")
    with fits.open(quiet.truth_path) as hd:
        assert "FLARE" not in hd


def test_wst_frame_from_the_helioviewer_jp2(sim):
    (f,) = _frames(sim, "WST", "2023-01-31")
    assert f.date_obs == "2023-01-31T03:39:23.200"
    assert f.scene == "helioviewer-jp2/2023_01_31__03_39_23_200__SDO_HMI_HMI_continuum.jp2"
    h = fits.getheader(f.raw_path)
    assert h["SCENEFIL"] == "2023_01_31__03_39_23_200__SDO_HMI_HMI_continuum.jp2"
    history = _history(h)
    assert "8-bitdisplayscaling,notDN" in history and "617.3nm" in history
    # the truth's disk: the apparent radius of 2023-01-31 seen from Earth, in physical units
    with fits.open(f.truth_path) as hd:
        d, th = hd[0].data, hd[0].header
    assert th["BUNIT"] == "erg cm-2 s-1 sr-1"
    n = d.shape[0]
    c = d[n // 2 - 2:n // 2 + 2, n // 2 - 2:n // 2 + 2].mean()
    assert 5e7 < c < 1.2e8, "disk-centre 360 nm radiance of the model"
    rsun_px = th["RSUN_OBS"] / th["CDELT1"]
    assert th["RSUN_OBS"] == pytest.approx(975.5, abs=2.0)  # 2023-01-31, Earth at 0.985 au
    row = d[n // 2]
    inside = np.flatnonzero(row > 0.1 * c)
    assert (inside[-1] - inside[0] + 1) / 2 == pytest.approx(rsun_px, abs=1.5)
    assert len(_frames(sim, "WST", "2010-10-15")) == 1, "the MDI frame is still there"


def test_default_simulation_has_neither(tmp_path):
    res = simulate(tmp_path, channels=("WST",), naxis=32, noise=False)
    assert [f.date_obs[:10] for f in res.frames] == ["2010-10-15"] and res.flares == []
    assert dt.date(2023, 1, 31).isoformat() not in {f.date_obs[:10] for f in res.frames}


def test_demo_keeps_an_older_simulation_and_says_so(tmp_path, capsys):
    """``lstdp demo`` simulates only when no manifest is there; an older one (one flare) is kept
    with a note, since simulating again would change every frame's bytes."""
    import json

    from backend.cli import _demo_simulation_current

    assert _demo_simulation_current(tmp_path) is False
    (tmp_path / "manifest.json").write_text(json.dumps({"flare": {}, "flares": [{}]}))
    assert _demo_simulation_current(tmp_path) is True
    assert "older version" in capsys.readouterr().out
    (tmp_path / "manifest.json").write_text(json.dumps({"flares": [{}, {}]}))
    assert _demo_simulation_current(tmp_path) is True
    assert capsys.readouterr().out == ""
