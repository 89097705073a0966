"""Detection gates on injected events of known truth (a small run of
``benchmarks/validate_detection.py``; the full-size run writes
``benchmarks/reports/detection_validation.md``).

Gates: flare recall and precision >= 0.9 for injected enhancements above 3 sigma (with
injections below 3 sigma in the same sequences), **with the detector's default
parameters** (what the detection service runs: ``tests/test_detect_flares.py`` checks that
the service stores ``FlareDetectionParams()`` with each event); CME recall >= 0.8 with PA within 10 deg and
speed within 20 %.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.validate_detection import (
    CME_CASES,
    FLARE_SIGMAS,
    flare_false_positives,
    sdi_scene,
    validate_cmes,
    validate_flares,
)
from pipelines.detect.flares import FlareDetectionParams, detect_flares


def test_flare_gate_above_3_sigma_with_the_defaults():
    r = validate_flares(n_sequences=2, seed=7)  # params=None: the detector's defaults
    assert r.n_truth == 8  # 4 of the 6 amplitudes per sequence are above 3 sigma
    assert any(k < 3 for k in FLARE_SIGMAS) and any(k > 3 for k in FLARE_SIGMAS)
    assert r.recall >= 0.9, r.extra
    assert r.precision >= 0.9, (r.n_true_detections, r.n_detections)
    # found at the injected peak frame, within 2 frames, and within 30 arcsec
    assert max(abs(t) for t in r.timing_err_s) <= 2 * 120.0
    assert max(r.position_err_arcsec) <= 30.0
    # the 1.5-sigma injections are below the detection limit
    assert r.extra["recall_by_sigma"][1.5][0] == 0


def test_flare_positions_at_a_fine_plate_scale():
    """At 1.5 arcsec/px (7 pixels per macropixel side) the per-pixel noise is 7x the
    macropixel's; the centroid smooths the excess at the macropixel scale first (without
    that: median 9 arcsec, max 16 for these sequences; at SDI's 0.5 arcsec/px median 13,
    max 25, and one 20-sigma injection not matched within 30 arcsec)."""
    r = validate_flares(n_sequences=2, seed=7, scene=sdi_scene(1536, 1.5))
    assert r.recall >= 0.9 and r.precision >= 0.9
    assert np.median(r.position_err_arcsec) <= 7.0 and max(r.position_err_arcsec) <= 12.0, r.position_err_arcsec


def test_quiet_real_scene_gives_no_flare():
    """The precision side: the real SWAP scene with noise and nothing injected, 2 x 60 frames
    at the SDI cadence (about 1.6 h searched), defaults."""
    r = flare_false_positives(n_sequences=2, n_frames=60)
    assert r.extra["hours"] > 1.5
    assert r.n_detections == 0, r.rows
    # the 2 % relative floor is below 3 sigma of the macropixel noise on nearly all the disk
    assert 3 * r.extra["rel_noise_pct"][1] > 100 * FlareDetectionParams().detection_threshold


def test_cme_gate():
    cases = [CME_CASES[i] for i in (0, 3, 4, 7)]  # N, SE-fast, S-narrow, two CMEs in one sequence
    r = validate_cmes(cases, n_frames=14, quiet=0)
    assert r.n_truth == 5
    assert r.recall >= 0.8
    assert r.precision >= 0.8
    assert np.median(r.pa_err_deg) <= 10.0 and np.median(r.speed_err_rel) <= 0.2


# -- evolving backgrounds (issue 14, item 7) ----------------------------------------------------

import datetime as dt  # noqa: E402

from pipelines.simulation import evolving as EV  # noqa: E402


def test_evolving_scene_rotates_fluctuates_and_uses_real_flare_shapes():
    """The generator itself: rotation as sunpy's solar_rotate_coordinate moves a point, red
    noise of the stated amplitudes on the quiet disk and in active regions, real GOES shapes."""
    import astropy.units as u
    from astropy.coordinates import SkyCoord
    from astropy.wcs import WCS
    from sunpy.physics.differential_rotation import solar_rotate_coordinate

    base, header = EV.sdi_lya_scene(256)
    dy, dx = EV.rotation_displacement(header, base.shape, 3600.0)
    w = WCS(header, naxis=2)
    # a point at (300", 200"): where sunpy's solar_rotate_coordinate puts it 1 h later
    start = w.pixel_to_world(*w.world_to_pixel_values(300 / 3600, 200 / 3600))
    later = solar_rotate_coordinate(start, time=start.obstime + 1 * u.h)
    px1, py1 = (float(v) for v in w.world_to_pixel(SkyCoord(later.Tx, later.Ty, frame=start.frame)))
    px0, py0 = (float(v) for v in w.world_to_pixel(start))
    iy, ix = int(round(py1)), int(round(px1))
    # the content at the rotated place came from the start place: displacement back to it
    assert abs((px1 + dx[iy, ix]) - px0) < 0.15 and abs((py1 + dy[iy, ix]) - py0) < 0.15
    assert 0.8 < abs(px1 - px0) * header["CDELT1"] / 9.0 < 1.3  # ~9-10 arcsec/h near disk centre
    times = [dt.datetime(2023, 3, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=4 * k) for k in range(40)]
    s = EV.EvolvingSeries(base, header, times, EV.SDI_RED_NOISE, rotate=False, seed=3)
    cube = np.stack([s.quiet(k) for k in range(0, 40, 5)])  # 20 min apart: nearly independent
    rel = cube / base - 1.0
    quiet = (s._amp < 1.01 * EV.SDI_RED_NOISE.quiet_rms) & (base > 0.3 * np.median(base[base > 0]))
    active = s._amp > 0.99 * EV.SDI_RED_NOISE.active_rms
    assert quiet.sum() > 1000 and active.sum() > 50
    assert 0.7 < np.std(rel[:, quiet]) / EV.SDI_RED_NOISE.quiet_rms < 1.3
    assert 0.7 < np.std(rel[:, active]) / EV.SDI_RED_NOISE.active_rms < 1.3
    prof = EV.goes_flare_profiles()
    # XRS-B peaks at the GOES report's 06:41 (25 min after the 06:16 start), the derivative earlier
    assert abs(prof["xrsb"].peak_s - 25 * 60) <= 120
    assert prof["dxrsb"].peak_s < prof["xrsa"].peak_s <= prof["xrsb"].peak_s
    assert all(abs(p.value.max() - 1.0) < 1e-9 for p in prof.values())


def test_sdi_quiet_evolving_background_false_alarm_bound():
    """Defaults (detector 1.4.0) on a quiet evolving Lyman-alpha series (256 px, 4-min cadence,
    140 min, red noise 3 % / 6 %, differential rotation, photon noise), nothing injected.
    Seed 7: not one of the seeds the 1.4.0 defaults were chosen on (quiet 41000-41003 and
    injected 14000-14003, at 2 and 4 min; the report uses those too). 1.3.0 reported 108 false alarms on such a series
    (seed 41); the bound: at most 1 in the ~2 h searched (the report measures the rate and its
    95 % upper limit on many more hours)."""
    from benchmarks.validate_detection import evolving_false_alarms

    q = evolving_false_alarms("sdi", 256, 240.0, n_sequences=1, seed=7)
    assert q.extra["days"] > 0.08
    assert q.n_detections <= 1, q.rows


def test_sdi_finds_an_injected_flare_on_an_evolving_background():
    """One flare injected on an evolving series at 2-min cadence (seed 8, not a tuning seed):
    peak excess 0.5 of the local scene (15-arcsec Gaussian, the impulsive XRS-B-derivative
    shape of the real 2011-06-07 M2.5 flare stretched x2), at a random disk position. It must
    be found within 30 arcsec and 5 min of its peak, with at most one other detection."""
    from benchmarks.validate_detection import T0, _evolving_series, _place

    series = _evolving_series("sdi", 256, 120.0, seed=8)
    rng = np.random.default_rng(8)
    ((x, y),) = _place(series, rng, 1, "sdi")
    tr = series.inject(x, y, 0.5, T0 + dt.timedelta(minutes=45), "dxrsb", 2.0, sigma_arcsec=15.0)
    dets = detect_flares(series.times, series, series.header)
    hits = [d for d in dets if np.hypot(d.hpc_x - x, d.hpc_y - y) <= 30.0
            and abs(d.peak_time - tr.t_peak) <= dt.timedelta(minutes=5)]
    assert len(hits) == 1, [(d.hpc_x, d.hpc_y, d.peak_time) for d in dets]
    assert len(dets) <= 2


def test_wst_uses_the_quiet_sun_ratio_of_jing_2024():
    """A kernel in a dark penumbra (0.6 of the quiet Sun) whose excess is 6 % of the quiet Sun
    has I / I0 - 1 = 10 % (detector 1.1.0 reported it) but (I - I0) / I_QS = 6 % < 8 %: not a
    WLF by Jing et al.'s criterion. One of 12 % of the quiet Sun is."""
    from pipelines.detect.whitelight import WhiteLightParams, detect_white_light_flares

    n, scale = 256, 4.0
    header = EV._earth_header(n, scale, "2023-03-01T00:00:00")
    yy, xx = np.indices((n, n))
    x_as, y_as = (xx - (n - 1) / 2) * scale, (yy - (n - 1) / 2) * scale
    r = np.hypot(x_as, y_as) / header["RSUN_ARC"]
    disk = np.where(r < 1, 1e6 * (1 - 0.5 * (1 - np.sqrt(np.clip(1 - r ** 2, 0, 1)))), 0.0)
    spots = [(-150.0, 100.0), (200.0, -120.0)]
    for sx, sy in spots:
        disk = disk * np.where(np.hypot(x_as - sx, y_as - sy) < 30.0, 0.6, 1.0)
    rng = np.random.default_rng(4)
    times = [dt.datetime(2023, 3, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=2 * k) for k in range(30)]
    qs = 1e6 * (1 - 0.5 * (1 - np.sqrt(np.clip(1 - r ** 2, 0, 1))))

    def series(amps):
        frames = []
        for k in range(30):
            f = disk * (1 + 0.003 * rng.standard_normal((n, n)))
            prof = 1.0 if 18 <= k <= 22 else 0.0  # 10 min at the plateau (Jing et al.: mean 10.3 min)
            for (sx, sy), a in zip(spots, amps, strict=True):
                g = np.exp(-((x_as - sx) ** 2 + (y_as - sy) ** 2) / (2 * 8.0 ** 2))
                f = f + a * prof * qs * g
            frames.append(f.astype(np.float32))
        return frames

    frames = series([0.06, 0.12])
    new = detect_white_light_flares(times, frames, header)
    old = detect_white_light_flares(times, frames, header, params=WhiteLightParams(normalisation="pre"))

    def near(dets, p):
        return [d for d in dets if np.hypot(d.hpc_x - p[0], d.hpc_y - p[1]) < 15.0]
    assert len(near(new, spots[1])) == 1 and near(new, spots[0]) == []
    assert len(near(old, spots[0])) == 1 and len(near(old, spots[1])) == 1
    assert near(new, spots[1])[0].peak_enhancement > 0.15  # rp = I / I0 - 1 reported: 0.12 / 0.6


# -- hourly (sparse) series, issue 27 item 7 ------------------------------------------------------


def test_hourly_simulated_series_recall_and_false_alarms_on_held_out_seeds():
    """Simulated hourly SDI series (rotation, fast red noise, the hour-scale evolution
    SDI_SLOW_EVOLUTION; ``benchmarks/validate_detection.py --hourly``), two of the held-out seeds
    (never used to choose settings). Detector 1.5.0 measured there: 6 of the 8 injections at or
    above the gate (1x the local scene; the demo's flare is 2x) found, all at 3x, no false
    alarm; 1.6.0 (the sparse decay test) the same. A floor that a change for sparse series must
    not lower (the full held-out run, ``--hourly heldout``: recall 17/24 with 1.5.0 and 1.6.0,
    false alarms in 54 quiet hours 4 and 1)."""
    from benchmarks.validate_detection import HOURLY_HELDOUT_SEEDS, HOURLY_TUNING_SEEDS, validate_hourly

    assert not set(HOURLY_HELDOUT_SEEDS) & set(HOURLY_TUNING_SEEDS)
    r = validate_hourly(HOURLY_HELDOUT_SEEDS[:2])
    assert r.n_truth >= 4, r.extra
    assert r.n_found >= 0.75 * r.n_truth, r.extra["recall_by_amp"]
    assert all(h == n for a, h, n in r.extra["recall_by_amp"] if a >= 3.0), r.extra["recall_by_amp"]
    assert r.extra["false_alarms"] == 0, r.rows


def test_eit_hourly_series_false_alarms_at_most_one():
    """Issue 27 item 7: the EIT hourly series of 2004-03-01, the untouched test of the sparse
    rules (tuned on the simulated hourly series' tuning seeds only). The demo's SDI series (the
    13 real EIT frames through the simulator, its one injected flare, calibrated to L2; here at
    256 px): detector 1.5.0 reports 5 events, 4 false (8 and 7 at the demo's 1152 px; 7 and 6
    before the simulator's scene lost the 3 % of the disk-only convention); 1.6.0's decay test
    leaves the injected flare and 1 false alarm (the same at 1152 px, ``--hourly``; 2 at 384 px:
    the rule is not a guarantee at every size). The raw EIT 195 A frames (``flare_real_sequence``, 128 px): no event with either
    version; a detection there that matches no GOES event of the day would be a false alarm."""
    from benchmarks.validate_detection import demo_eit_series, flare_real_sequence

    demo = demo_eit_series(naxis=256)
    assert demo.n_found == 1, demo.rows  # the injected flare
    assert demo.extra["false_alarms"] <= 1, demo.rows
    real = flare_real_sequence()
    assert real.n_detections - real.n_true_detections <= 1, real.rows


def test_hourly_slow_evolution_changes_the_scene_only_when_asked():
    """The slow component is off by default (the dense validation's frames are those it had), and
    with it the hourly changes are larger than with the fast red noise alone."""
    import datetime as dt

    from benchmarks.validate_detection import T0, evolving_base
    from pipelines.simulation import evolving as EV

    base, header = evolving_base("sdi", 128)
    times = [T0 + dt.timedelta(hours=k) for k in range(3)]
    plain = EV.EvolvingSeries(base, header, times, EV.SDI_RED_NOISE, seed=3, rotate=False)
    none = EV.EvolvingSeries(base, header, times, EV.SDI_RED_NOISE, seed=3, rotate=False, slow=None)
    slow = EV.EvolvingSeries(base, header, times, EV.SDI_RED_NOISE, seed=3, rotate=False,
                              slow=EV.SDI_SLOW_EVOLUTION)
    assert np.array_equal(plain.quiet(2), none.quiet(2))
    disk = base > 0.5 * np.median(base[base > np.percentile(base, 60)])
    change = [np.std((s.quiet(2) / s.quiet(0))[disk]) for s in (plain, slow)]
    assert change[1] > 1.3 * change[0], change
