"""The flat part of the blind chain over seeds: the stated flat plane and FLATERR (issue 27 item 2).

Runs, per seed, what :func:`validation.blind_chain.run` does for the SDI and WST flats only
(simulate the two channels, draw the seed's model families, make the dithered flat set of the
channel's real scene with dirty inputs on the instrument side, derive the chain's flat and
``FLATERR``; :func:`validation.blind_chain.derive_chain_masters`), and prints the flat metrics
of each seed and a ``RESULT`` line::

    PYTHONPATH=. python benchmarks/flat_plane_seeds.py --seeds 0-9 --size 256 --mismatch on

Across seeds, per channel ``C``: ``flat_plane_pull_width_C`` = RMS of the per-axis plane pulls
(``flat_plane_pull_{y,x}_C``: the plane error over ``FLATPLSG / nx``), i.e. ``sqrt(mean
flat_plane_pull_C**2)``; ``flat_pull_width_C`` = the mean over seeds of the per-seed robust
width (1.4826 MAD) of the plane-removed flat error over ``FLATERR``. The ``RESULT`` line gives
the worst channel: the largest ``flat_rms_real_pct`` and ``flat_rms_real_resid_pct``, the
``flat_plane_stated`` of all (1 if every seed of both channels stated it), and of each width the
one furthest from 1. Seeds >= 1000 tuned :data:`pipelines.calibration.masters.subpixel_flat.FLAT_PLANE_SIGMA`
(1000-1011); 0-9 are the reported ones.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np

CHANS = ("SDI", "WST")
KEYS = ("flat_rms_real_pct", "flat_rms_real_resid_pct", "flat_plane_stated", "flat_plane_pull_y", "flat_plane_pull_x",
        "flat_plane_pull", "flat_pull_width", "flat_pull_total", "flat_plane_err_y", "flat_plane_err_x")


def flat_part(seed: int, mismatch: bool, size: int = 256) -> dict[str, float]:
    """The SDI/WST flat metrics of :func:`validation.blind_chain.run` for one seed (noise on)."""
    from pipelines.simulation import simulate
    from validation import blind_chain as bc
    from validation.families import draw_families

    fam = draw_families(seed, mismatch, size=size)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="lstdp-flatplane-") as tmp:
        tmp = Path(tmp)
        variants = {c: v for c, v in fam.variants.items() if c in CHANS}
        sim = simulate(tmp / "sim", channels=CHANS, naxis=size, noise=True, seed=seed, sdi_sequence=False,
                       pointing_error_px=bc.POINTING_ERROR_PX, **({"variants": variants} if variants else {}))
        for chan in CHANS:
            bc._masters(sim, chan, bc.CHANNELS.index(chan), True, seed, tmp / "chain", out, fam)
    return out


def summarise(rows: dict[int, dict[str, float]]) -> dict[str, float]:
    """Per-channel widths over the seeds and the worst-channel ``RESULT`` values (module docstring)."""
    s: dict[str, float] = {}
    for c in CHANS:
        pulls = [rows[k][f"flat_plane_pull_{c}"] for k in rows]
        s[f"flat_plane_pull_width_{c}"] = math.sqrt(float(np.mean(np.square(pulls))))
        s[f"flat_pull_width_{c}"] = float(np.mean([rows[k][f"flat_pull_width_{c}"] for k in rows]))
        s[f"flat_rms_real_pct_{c}"] = max(rows[k][f"flat_rms_real_pct_{c}"] for k in rows)
        s[f"flat_rms_real_resid_pct_{c}"] = max(rows[k][f"flat_rms_real_resid_pct_{c}"] for k in rows)
    far = lambda name: max((s[f"{name}_{c}"] for c in CHANS), key=lambda v: abs(v - 1.0))  # noqa: E731
    s["flat_rms_real_pct"] = max(s[f"flat_rms_real_pct_{c}"] for c in CHANS)
    s["flat_rms_real_resid_pct"] = max(s[f"flat_rms_real_resid_pct_{c}"] for c in CHANS)
    s["flat_plane_stated"] = float(all(rows[k][f"flat_plane_stated_{c}"] == 1.0 for k in rows for c in CHANS))
    s["flat_plane_pull_width"] = far("flat_plane_pull_width")
    s["flat_pull_width"] = far("flat_pull_width")
    return s


def _seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--mismatch", choices=("on", "off"), default="on")
    args = ap.parse_args(argv)
    rows = {}
    for seed in _seeds(args.seeds):
        t0 = time.perf_counter()
        rows[seed] = flat_part(seed, args.mismatch == "on", args.size)
        for c in CHANS:
            print(f"seed={seed} {c} " + " ".join(f"{k}={rows[seed][f'{k}_{c}']:.4g}" for k in KEYS)
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    s = summarise(rows)
    for c in CHANS:
        print(f"{c}: " + " ".join(f"{k}={s[f'{k}_{c}']:.3f}" for k in ("flat_rms_real_pct", "flat_rms_real_resid_pct",
                                                                       "flat_plane_pull_width", "flat_pull_width")))
    print(f"RESULT seeds={len(rows)} mismatch={args.mismatch} flat_rms_real_pct={s['flat_rms_real_pct']:.3f} "
          f"flat_plane_stated={int(s['flat_plane_stated'])} flat_rms_real_resid_pct={s['flat_rms_real_resid_pct']:.3f} "
          f"flat_plane_pull_width={s['flat_plane_pull_width']:.3f} flat_pull_width={s['flat_pull_width']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
