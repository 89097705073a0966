"""The SCI occulter-to-Sun offset over seeds: measure or re-derive ``OFFSET_SYSTEMATIC_RSUN`` (issue 27).

For each seed and SCI channel, the blind chain's own roll sequence (simulated with the seed's
model families, :func:`validation.families.draw_families`, 256 px, noise on; calibrated to L1
with the chain's dark and flat masters, no stray-light subtraction, as
``validation.blind_chain._stray_master`` does) goes through
:func:`pipelines.calibration.masters.occulter.measure_occulter_offset`. The error is the offset
found minus the true one, the occulter fit of the first frame minus the true Sun centre (what
the flow subtracts the offset from), per axis [pixel]. Printed per seed, then their RMS, the
RMS of the fit's formal 1-sigma, the systematic that makes the pulls' RMS 1 (``sqrt(rms_err^2 -
rms_formal^2)``, in Rsun) and the pulls' RMS with the module's stated 1-sigma.

Usage: ``python benchmarks/sci_occulter_offset_seeds.py --seeds 1000-1007`` (the tuning seeds;
the module's constant came from them) or ``--seeds 0-9`` (held out).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np


def _seeds(text: str) -> list[int]:
    a, _, b = text.partition("-")
    return list(range(int(a), int(b or a) + 1))


def main() -> None:
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.calibration.l2.options import CalibrationOptions
    from pipelines.calibration.masters.occulter import OFFSET_SYSTEMATIC_RSUN, measure_occulter_offset
    from pipelines.simulation import simulate
    from pipelines.sun import sun_geometry
    from validation import blind_chain as bc
    from validation.families import draw_families

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1000-1007")
    ap.add_argument("--size", type=int, default=256)
    args = ap.parse_args()
    chans = ("SCI-UV", "SCI-WL")
    errs, formals, stated, rs_px = [], [], [], []
    for seed in _seeds(args.seeds):
        fam = draw_families(seed, True, size=args.size)
        with tempfile.TemporaryDirectory(prefix="lstdp-occ-seeds-") as tmp:
            tmp_path = Path(tmp)
            sim = simulate(tmp_path / "sim", channels=chans, naxis=args.size, noise=True, seed=seed,
                           sdi_sequence=False, pointing_error_px=bc.POINTING_ERROR_PX,
                           sci_roll_deg=list(bc.ROLLS_DEG), variants=fam.variants)
            for chan in chans:
                frames = [f for f in sim.frames if f.channel == chan]
                cals, *_ = bc._masters(sim, chan, bc.CHANNELS.index(chan), True, seed, tmp_path / "chain", {}, fam)
                l1s, hdrs, valids = [], [], []
                for f in frames:
                    d, h, _ = bc._raw(f)
                    l1 = calibrate_frame(d, h, cals, CalibrationOptions(subtract_stray_light=False,
                                                                         rotate_north_up=False))
                    l1s.append(np.asarray(l1.data, dtype=np.float64))
                    hdrs.append(l1.header)
                    valids.append(l1.dq == 0)
                occ = measure_occulter_offset(l1s, hdrs, valids)
                h0 = hdrs[0]
                truth = np.array([float(h0["FITCRPX1"]) - frames[0].crpix[0],
                                  float(h0["FITCRPX2"]) - frames[0].crpix[1]])
                e = np.array([occ.dx_px, occ.dy_px]) - truth
                rs = float(sun_geometry(h0).rsun_px)
                # the formal part: the stated 1-sigma without the systematic term
                formal = math.sqrt(max(occ.sigma_px ** 2 - (OFFSET_SYSTEMATIC_RSUN * rs) ** 2, 0.0))
                errs.append(e)
                formals.append(formal)
                stated.append(occ.sigma_px)
                rs_px.append(rs)
                print(f"seed {seed} {chan}: error ({e[0]:+.4f}, {e[1]:+.4f}) px, |error| {math.hypot(*e):.4f} px, "
                      f"stated 1-sigma {occ.sigma_px:.4f} px per axis, formal {formal:.4f}, "
                      f"gradient ({occ.gradient[0]:+.4f}, {occ.gradient[1]:+.4f}) /Rsun", flush=True)
    e = np.array(errs)
    f = np.repeat(np.array(formals), 2)
    rms_err = float(np.sqrt(np.mean(e ** 2)))
    rms_formal = float(np.sqrt(np.mean(f ** 2)))
    sys_px = math.sqrt(max(rms_err ** 2 - rms_formal ** 2, 0.0))
    pulls = e.ravel() / np.repeat(np.array(stated), 2)
    print(f"RESULT seeds={args.seeds} size={args.size} frames_sets={len(errs)} rms_err_px={rms_err:.4f} "
          f"rms_formal_px={rms_formal:.4f} max_err_px={float(np.max(np.hypot(e[:, 0], e[:, 1]))):.4f} "
          f"systematic_rsun={sys_px / float(np.mean(rs_px)):.3g} "
          f"stated_pull_rms={float(np.sqrt(np.mean(pulls ** 2))):.3f}")


if __name__ == "__main__":
    main()
