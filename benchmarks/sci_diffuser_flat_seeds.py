"""The SCI diffuser flat's pull over seeds: tune or check ``DIFFUSER_NONUNIFORMITY_SIGMA`` (issue 27).

Runs only the flat part of the blind chain (:func:`validation.blind_chain._masters`) for
SCI-UV and SCI-WL on the given seeds (256 px, noise on, families of
:func:`validation.families.draw_families` with ``--mismatch on|off``) and prints per seed
``flat_pull_C`` (the robust width of (flat / hidden - 1) over ``hypot(FLATERR / flat,
FLATDFSG)``), their RMS over seeds per channel (``flat_pull_width_C``, as
:mod:`benchmarks.validate_calibration` reports it) and pooled, and with ``--tune`` the sigma for which the RMS over all seeds and both
channels of that width is 1 (bisection; tune only on seeds >= 1000).

Usage: ``python benchmarks/sci_diffuser_flat_seeds.py --seeds 1000-1011 --mismatch on --tune``
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


def _width(ratio: np.ndarray, rel: np.ndarray, sigma: float) -> float:
    fp = (ratio - 1.0) / np.hypot(rel, sigma)
    return float(1.4826 * np.median(np.abs(fp - np.median(fp))))


def _roll_tilt_flat(sim, chan: str, cals: dict, flat: np.ndarray, fam) -> tuple[np.ndarray, str]:
    """The flat with the gain tilt its roll sequence measures removed, and a line: found vs injected tilt."""
    from pipelines.calibration.l2.flow import calibrate_frame
    from pipelines.calibration.l2.options import CalibrationOptions
    from pipelines.calibration.masters.diffuser_flat import remove_roll_tilt
    from pipelines.calibration.masters.occulter import measure_occulter_offset
    from validation import blind_chain as bc

    l1s, hdrs, valids = [], [], []
    for f in (f for f in sim.frames if f.channel == chan):
        d, h, _ = bc._raw(f)
        l1 = calibrate_frame(d, h, cals, CalibrationOptions(subtract_stray_light=False, rotate_north_up=False))
        l1s.append(np.asarray(l1.data, dtype=np.float64))
        hdrs.append(l1.header)
        valids.append(l1.dq == 0)
    occ = measure_occulter_offset(l1s, hdrs, valids)
    rs = occ.rsun_px
    dm = fam.diffuser.get(chan)
    if dm is not None:  # the injected tilt in the same units (scoring only): ln(1/D)'s gradient per Rsun
        c = (flat.shape[1] - 1) / 2.0
        inj = tuple(-dm.amplitude * dm.tilt_share * f(dm.angle) * rs / c for f in (math.cos, math.sin))
        note = (f"tilt found ({occ.gradient[0]:+.5f}, {occ.gradient[1]:+.5f}) injected "
                f"({inj[0]:+.5f}, {inj[1]:+.5f}) /Rsun")
    else:
        note = f"tilt found ({occ.gradient[0]:+.5f}, {occ.gradient[1]:+.5f}) /Rsun (none injected)"
    return remove_roll_tilt(flat, occ.gradient, rs), note


def main() -> None:
    from pipelines.calibration.masters.diffuser_flat import DIFFUSER_NONUNIFORMITY_SIGMA
    from pipelines.simulation import simulate
    from validation import blind_chain as bc
    from validation.families import draw_families

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1000-1011")
    ap.add_argument("--mismatch", choices=("on", "off"), default="on")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--roll-tilt", action="store_true",
                    help="remove the tilt each seed's roll sequence measures first")
    a = ap.parse_args()
    from pipelines.calibration.masters.diffuser_flat import DIFFUSER_BOWL_SIGMA

    sigma0 = DIFFUSER_BOWL_SIGMA if a.roll_tilt else DIFFUSER_NONUNIFORMITY_SIGMA
    chans = ("SCI-UV", "SCI-WL")
    data, pulls = [], []
    for seed in _seeds(a.seeds):
        fam = draw_families(seed, a.mismatch == "on", size=a.size)
        with tempfile.TemporaryDirectory(prefix="lstdp-diffuser-") as tmp:
            tmp = Path(tmp)
            sim = simulate(tmp / "sim", channels=list(chans) if a.roll_tilt else list(bc.CHANNELS), naxis=a.size,
                           noise=True, seed=seed, sdi_sequence=False, pointing_error_px=bc.POINTING_ERROR_PX,
                           **({"sci_roll_deg": list(bc.ROLLS_DEG)} if a.roll_tilt else {}),
                           **({} if not fam.variants else {"variants": fam.variants}))
            row = []
            for chan in chans:
                out: dict[str, float] = {}
                _c, _e, det, flat = bc._masters(sim, chan, bc.CHANNELS.index(chan), True, seed, tmp / "chain", out, fam)
                hidden = det["flat"].astype(np.float64)
                # FLATERR relative to the diffuser flat (the chain scales FLATERR with the correction)
                fe = _c["flat"].data["flaterr"].astype(np.float64) / flat
                if a.roll_tilt:
                    flat, note = _roll_tilt_flat(sim, chan, _c, flat, fam)
                    print(f"  seed {seed} {chan}: {note}", flush=True)
                ratio = flat / hidden
                ratio /= ratio.mean()
                data.append((ratio.ravel(), fe.ravel()))
                w = _width(ratio.ravel(), fe.ravel(), sigma0)
                row.append(w)
                pulls.append(w)
            print(f"seed {seed}: " + " ".join(f"flat_pull_{c}={v:.3f}" for c, v in zip(chans, row)), flush=True)
    rms = math.sqrt(float(np.mean(np.square(pulls))))
    per = {c: math.sqrt(float(np.mean(np.square(pulls[i::2])))) for i, c in enumerate(chans)}
    print(f"RESULT sci_flat_pull_rms={rms:.3f} " + " ".join(f"flat_pull_width_{c}={v:.3f}" for c, v in per.items())
          + f" sigma={sigma0:g} roll_tilt={int(a.roll_tilt)} seeds={a.seeds} mismatch={a.mismatch}")
    if a.tune:
        f = lambda s: math.sqrt(float(np.mean([_width(r, e, s) ** 2 for r, e in data]))) - 1.0  # noqa: E731
        lo, hi = 0.0, 0.1
        if f(lo) <= 0:
            print("RESULT tuned_sigma=0 (pulls <= 1 without a diffuser term)")
            return
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
        print(f"RESULT tuned_sigma={0.5 * (lo + hi):.5f} roll_tilt={int(a.roll_tilt)} seeds={a.seeds} "
              f"mismatch={a.mismatch}")


if __name__ == "__main__":
    main()
