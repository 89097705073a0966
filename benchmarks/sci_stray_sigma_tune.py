"""Tune the SCI stray light's stated 1-sigma on the tuning seeds by re-scoring the chain's products.

The stated 1-sigma of the blind chain's stray light (:func:`validation.blind_stray.fit_stray_model_set`)
is a quadrature sum of five terms: the fit's covariance, ``STRAY_SIGMA_SCALE`` x the model set's
spread, ``STRAY_CORONA_FRACTION`` x the fitted corona, ``STRAY_SIGMA_FLOOR`` x the stray light and,
for a fit with structured residuals, ``STRAY_STRUCTURE_INFLUENCE`` x the structure's influence
(:func:`validation.blind_stray.structure_influence`).
The estimate itself does not depend on them, so a candidate's effect on the products is the stray term of their total
error swapped: each SCI product of the chain is kept once (``--keep``: the chain with
:data:`validation.blind_chain.STRAY_KEEP_DIR` set) and re-scored for every candidate as
:func:`validation.blind_chain.score_total_pulls` scores it (the pixels' pulls against the truth over
the total error, about the stray light's radial mode) and as the four annuli are scored
(``stray_pull_C_rR``).

Only seeds >= 1000 may be kept or tuned on (the test seeds 0-49 set nothing;
:data:`validation.blind_stray.STRAY_TUNING_SEEDS`)::

    .venv/bin/python benchmarks/sci_stray_sigma_tune.py --keep /tmp/stray-keep --seeds 1000-1079
    .venv/bin/python benchmarks/sci_stray_sigma_tune.py --rescore /tmp/stray-keep \\
        --scale 0.03,0.04,0.05 --floor 0.004,0.005,0.006 --corona 0.2,0.22,0.24 --slope 0,1,2,3 \\
        --structured 1,2,3 --influence 0,1 [--window 0.3]

``--runs DIR`` prints, per kept product, the Wald-Wolfowitz runs test of the fit's residuals
beside its pulls (:func:`residual_runs`); the chain calls a fit with a runs statistic below
:data:`validation.blind_stray.STRAY_RUNS_Z_LIMIT` structured and states its corona term
``--structured`` times larger (:data:`validation.blind_stray.STRAY_STRUCTURED_CORONA_FACTOR`).

``--rescore`` prints one line per candidate and a ``RESULT`` line for the module's constants: ``tw_C`` the
pooled pull width of the products (:func:`validation.blind_chain.pooled_pull_width`), ``sw`` the
RMS of the stray pulls at 1.1/1.5/2.0/2.5 Rsun over both channels (``sw_rR`` at each radius alone;
``sw68_rR`` the 68 % quantile of |pull| there, which a few gross misses do not move), ``stray_fail`` the share of
products that miss a stray gate (> 5 % of the K corona and beyond 3 stated sigma), each over
all kept seeds and over the two halves of them.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Seeds below this are test seeds (the benchmark's 0-49): never kept for tuning.
FIRST_TUNING_SEED = 1000


def _seeds(text: str) -> list[int]:
    out: set[int] = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return sorted(out)


def keep(directory: Path, seeds: list[int]) -> None:
    """Run the blind chain (256 px, noise on, mismatch on) on ``seeds``, keeping each SCI product's
    scoring inputs in ``directory``; seeds whose two files exist are skipped."""
    from validation import blind_chain as bc
    from validation.families import draw_families

    low = [s for s in seeds if s < FIRST_TUNING_SEED]
    if low:
        raise SystemExit(f"seeds {low} are test seeds: tune on seeds >= {FIRST_TUNING_SEED} only")
    bc.STRAY_KEEP_DIR = directory
    for seed in seeds:
        if all((directory / f"{seed}_{c}.npz").exists() for c in ("SCI-UV", "SCI-WL")):
            continue
        t = time.perf_counter()
        bc.run(256, True, seed, families=draw_families(seed, True, size=256))
        print(f"seed {seed}: kept in {time.perf_counter() - t:.0f} s", flush=True)


def _kept(directory: Path):
    """``(seed, channel, arrays, prior)`` of each kept product (seed >= :data:`FIRST_TUNING_SEED`;
    a test seed's file stops the script): ``prior`` the coronal prior as the chain fitted it
    (its values at the fit's radii, interpolated on the grid elsewhere)."""
    for f in sorted(directory.glob("*_SCI-*.npz")):
        seed, chan = f.stem.split("_")
        if int(seed) < FIRST_TUNING_SEED:
            raise SystemExit(f"{f.name}: a test seed's product; use seeds >= {FIRST_TUNING_SEED} only")
        d = dict(np.load(f))
        r, c, grid, pg = d["in_r"], d["in_c"], d["in_grid"], d["in_prior_grid"]
        lo, hi = float(r.min()), float(r.max())

        def prior(x, r=r, c=c, grid=grid, pg=pg, lo=lo, hi=hi):
            x = np.asarray(x, dtype=np.float64)
            return c if x.shape == r.shape and np.allclose(x, r) else np.interp(x, np.clip(grid, lo, hi), pg)

        yield int(seed), chan, d, prior


def load(directory: Path) -> list[dict]:
    """The kept products (seed >= :data:`FIRST_TUNING_SEED`), each with its model set's terms
    re-fitted once: ``terms`` = (grid, estimate, fit, spread, corona, stray, influence) on the grid
    [MSB] (``influence``: :func:`validation.blind_stray.structure_influence`, zero for a fit whose
    residuals are not structured)."""
    from validation.blind_stray import fit_stray_model_set

    rows = []
    for seed, chan, d, prior in _kept(directory):
        r, fb = d["in_r"], d["in_fb_grid"]

        def one(scale=0.0, corona=0.0, floor=0.0, influence=0.0):
            import validation.blind_stray as bs

            old = bs.STRAY_SIGMA_FLOOR, bs.STRAY_STRUCTURED_CORONA_FACTOR, bs.STRAY_STRUCTURE_INFLUENCE
            # the terms unweighted
            bs.STRAY_SIGMA_FLOOR, bs.STRAY_STRUCTURED_CORONA_FACTOR, bs.STRAY_STRUCTURE_INFLUENCE = floor, 1.0, influence
            try:
                return fit_stray_model_set(r, d["in_p"], d["in_s"], prior, fallback=None, sigma_scale=scale,
                                           corona_fraction=corona)
            finally:
                bs.STRAY_SIGMA_FLOOR, bs.STRAY_STRUCTURED_CORONA_FACTOR, bs.STRAY_STRUCTURE_INFLUENCE = old

        base = one()
        if np.isfinite(fb).all() and base.refused:
            print(f"{seed}_{chan}.npz: the fit is refused (the default law replaces it): left out", flush=True)
            continue

        def extra(ms):
            return np.sqrt(np.maximum(ms.sigmas ** 2 - base.sigmas ** 2, 0.0))

        d["seed"], d["chan"], d["runs_z"] = int(seed), chan, base.runs_z
        d["terms"] = (base.radii, base.values, base.sigmas, extra(one(scale=1.0)), extra(one(corona=1.0)),
                      extra(one(floor=1.0)), extra(one(influence=1.0)))
        rows.append(d)
    return rows


def _annulus_pulls(d: dict, grid: np.ndarray, est: np.ndarray, sig: np.ndarray):
    """A kept product's stray light ``est`` and its 1-sigma ``sig`` (on ``grid`` [Rsun], [MSB])
    on its pixels, and per annulus of :data:`validation.blind_chain.RADII` as the chain scores
    them ``(error [MSB], pull, K corona [MSB])``: the means over the annulus of estimate minus
    injected, over the mean stated 1-sigma, and of the K corona."""
    from validation.blind_chain import RADII
    from validation.blind_stray import _annulus

    rho = np.clip(d["rho"], 1.0, 3.0)
    s_new, g_new = np.interp(rho, grid, est), np.interp(rho, grid, sig)
    annuli = []
    for r0 in RADII:
        sel = _annulus(d["rho"], r0)
        err = float(np.mean(s_new[sel] - d["stray_inj"][sel]))
        annuli.append((err, err / float(np.mean(g_new[sel])), float(np.mean(d["kcor"][sel]))))
    return s_new, g_new, annuli


def rescore(rows: list[dict], scale: float, floor: float, corona: dict[str, float], slope: float | None = None,
            structured: float | None = None, influence: float | None = None) -> dict:
    """The products' pulls with the stated 1-sigma of these constants (the estimate unchanged);
    ``slope``: the corona term weighted by ``(r / 1.5 Rsun) ** -slope`` (tried, not adopted: the
    module's corona term has no weight; None or 0: none); ``structured``: the factor on the corona
    term of a fit whose residuals are structured (runs statistic below
    :data:`validation.blind_stray.STRAY_RUNS_Z_LIMIT`; None: the module's
    :data:`validation.blind_stray.STRAY_STRUCTURED_CORONA_FACTOR`); ``influence``: the factor on
    a structured fit's influence term (:func:`validation.blind_stray.structure_influence`; None:
    the module's :data:`validation.blind_stray.STRAY_STRUCTURE_INFLUENCE`)."""
    from validation.blind_chain import RADII, frame_pull_stats, pooled_pull_width
    from validation.blind_stray import STRAY_RUNS_Z_LIMIT, STRAY_STRUCTURE_INFLUENCE, STRAY_STRUCTURED_CORONA_FACTOR

    if structured is None:
        structured = STRAY_STRUCTURED_CORONA_FACTOR
    if influence is None:
        influence = STRAY_STRUCTURE_INFLUENCE

    per: dict[str, dict[str, list]] = {}
    for d in rows:
        grid, est, fit, spread, cor, stray, infl = d["terms"]
        if slope:  # a radial weight on the corona term (exploration)
            cor = cor * (grid / 1.5) ** (-slope)
        if d["runs_z"] < STRAY_RUNS_Z_LIMIT:
            cor = cor * structured
        sig_g = np.sqrt(fit ** 2 + (scale * spread) ** 2 + (corona[d["chan"]] * cor) ** 2 + (floor * stray) ** 2
                        + (influence * infl) ** 2)
        s_new, g_new, annuli = _annulus_pulls(d, grid, est, sig_g)
        data = d["data"] - (s_new - d["s_est"])
        sig = np.sqrt(np.maximum(d["sig"] ** 2 - d["s_sig"] ** 2 + g_new ** 2, 1e-30))
        w, m, p, _ = frame_pull_stats(data, d["truth"], sig, d["dq"], radial=(d["rho"], g_new))
        pulls = [pull for _, pull, _ in annuli]
        miss = any(not (100 * abs(err) / kcor <= 5.0 or abs(pull) <= 3.0) for err, pull, kcor in annuli)
        c = per.setdefault(d["chan"], {"w": [], "m": [], "p": [], "sp": [], "miss": []})
        for k, v in (("w", w), ("m", m), ("p", p), ("miss", miss)):
            c[k].append(v)
        c["sp"].append(pulls)
    out = {f"tw_{ch}": pooled_pull_width(v["w"], v["m"], v["p"]) for ch, v in sorted(per.items())}
    sp = np.array([x for v in per.values() for x in v["sp"]], dtype=float).reshape(-1, len(RADII))  # (products, radii)
    out["sw"] = math.sqrt(float(np.mean(np.square(sp)))) if sp.size else math.nan
    for i, r0 in enumerate(RADII):  # per radius: a 1-sigma of the wrong radial shape shows here
        out[f"sw_r{r0:g}"] = math.sqrt(float(np.mean(np.square(sp[:, i])))) if sp.size else math.nan
    for i, r0 in enumerate(RADII):  # robust: the 68 % quantile of |pull| (a few gross misses move the RMS)
        out[f"sw68_r{r0:g}"] = float(np.quantile(np.abs(sp[:, i]), 0.6827)) if sp.size else math.nan
    out["stray_fail"] = float(np.mean([x for v in per.values() for x in v["miss"]]))
    out["products"] = sum(len(v["w"]) for v in per.values())
    return out


def residual_runs(directory: Path, limit: float | None = None) -> dict:
    """Whether the adopted fit's residuals are structured, against the pulls at the four radii
    (the chain's own test since 2026-12-06: :func:`validation.blind_stray.residual_runs_z`).

    Per kept product: the model set re-fitted with the module's constants (no fallback), the
    Wald-Wolfowitz runs test (Wald & Wolfowitz 1940, Ann. Math. Stat. 11, 147) on the signs of its
    residuals over the profile's 1-sigma along radius (``z``: runs against those expected of
    independent signs, in standard deviations; a misfit shape gives long runs, ``z`` << 0), the
    lag-1 autocorrelation of those normalised residuals, the reduced chi-square, and the stray
    light's pull at 1.1/1.5/2.0/2.5 Rsun (estimate minus injected, over the stated 1-sigma, each
    annulus' mean as the chain scores them). Prints a line per product, sorted by |pull at 1.1
    Rsun|, and returns the summary: products with ``z < limit`` ("flagged"; default the chain's
    :data:`validation.blind_stray.STRAY_RUNS_Z_LIMIT`), the RMS pull at 1.1
    Rsun of the flagged and of the others, and how many of each miss by more than 3 stated sigma.
    """
    from validation.blind_stray import STRAY_RUNS_Z_LIMIT, fit_stray_model_set

    limit = STRAY_RUNS_Z_LIMIT if limit is None else limit
    lines = []
    for seed, chan, d, prior in _kept(directory):
        ms = fit_stray_model_set(d["in_r"], d["in_p"], d["in_s"], prior, fallback=None)
        z = ms.residual / ms.profile_sigma
        zr = ms.runs_z  # residual_runs_z along radius, as the chain decides
        ac1 = float(np.corrcoef(z[:-1], z[1:])[0, 1])
        pulls = [pull for _, pull, _ in _annulus_pulls(d, ms.radii, ms.values, ms.sigmas)[2]]
        lines.append((int(seed), chan, ms.chi2_red, zr, ac1, pulls))
    lines.sort(key=lambda x: -abs(x[5][0]))
    for seed, chan, chi2, zr, ac1, p in lines:
        print(f"{seed} {chan:6s} chi2_red {chi2:6.2f} runs_z {zr:+6.2f} lag1 {ac1:+.2f} pulls "
              + " ".join(f"{v:+.2f}" for v in p))
    flagged = [x for x in lines if x[3] < limit]
    others = [x for x in lines if not x[3] < limit]

    def rms(rows) -> float:
        return math.sqrt(float(np.mean([x[5][0] ** 2 for x in rows]))) if rows else math.nan

    return {"products": len(lines), "flagged": len(flagged), "flagged_frac": len(flagged) / max(len(lines), 1),
            "rms_pull_r1.1_flagged": rms(flagged), "rms_pull_r1.1_others": rms(others),
            "misses_3sigma_r1.1_flagged": sum(abs(x[5][0]) > 3 for x in flagged),
            "misses_3sigma_r1.1_others": sum(abs(x[5][0]) > 3 for x in others)}


def _line(res: dict) -> str:
    return " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", type=Path, help="run the chain on --seeds, keeping the SCI products here")
    ap.add_argument("--seeds", default="1000-1039")
    ap.add_argument("--rescore", type=Path, help="re-score the products kept here")
    ap.add_argument("--scale", default="", help="STRAY_SIGMA_SCALE candidates, comma-separated")
    ap.add_argument("--floor", default="", help="STRAY_SIGMA_FLOOR candidates")
    ap.add_argument("--corona", default="", help="STRAY_CORONA_FRACTION candidates")
    ap.add_argument("--corona-uv", default="", help="a fraction of SCI-UV's own (tried; default: --corona's)")
    ap.add_argument("--slope", default="", help="exponents of a radial weight (r / 1.5)^-slope on the corona term (tried)")
    ap.add_argument("--structured", default="",
                    help="STRAY_STRUCTURED_CORONA_FACTOR candidates (the corona term of a structured fit)")
    ap.add_argument("--influence", default="",
                    help="STRAY_STRUCTURE_INFLUENCE candidates (a structured fit's leave-the-structure-out term)")
    ap.add_argument("--runs", type=Path, help="the runs test of the kept products' fit residuals (exploration)")
    ap.add_argument("--window", type=float, default=None,
                    help="STRAY_SPREAD_WINDOW [Rsun] for the re-fit of the kept profiles (one value)")
    args = ap.parse_args(argv)
    if args.keep:
        keep(args.keep, _seeds(args.seeds))
    if args.runs:
        print("RESULT " + _line(residual_runs(args.runs)))
    if not args.rescore:
        return 0
    import validation.blind_stray as bs

    window_now = bs.STRAY_SPREAD_WINDOW
    if args.window is not None:
        bs.STRAY_SPREAD_WINDOW = args.window
    rows = load(args.rescore)
    seeds = sorted({d["seed"] for d in rows})
    half = seeds[len(seeds) // 2] if seeds else 0
    now = (bs.STRAY_SIGMA_SCALE, bs.STRAY_SIGMA_FLOOR, bs.STRAY_CORONA_FRACTION, None, 0.0,
           bs.STRAY_STRUCTURED_CORONA_FACTOR, bs.STRAY_STRUCTURE_INFLUENCE)

    def vals(text, default):
        return [float(x) for x in text.split(",")] if text else [default]

    for cand in itertools.product(vals(args.scale, now[0]), vals(args.floor, now[1]),
                                  vals(args.corona, now[2]), vals(args.corona_uv, None), vals(args.slope, now[4]),
                                  vals(args.structured, now[5]), vals(args.influence, now[6])):
        a, fl, cw, cu, sl, st, inf = cand
        cu = cw if cu is None else cu
        cor = {"SCI-UV": cu, "SCI-WL": cw}
        parts = [rescore(rows, a, fl, cor, sl, st, inf),
                 rescore([d for d in rows if d["seed"] < half], a, fl, cor, sl, st, inf),
                 rescore([d for d in rows if d["seed"] >= half], a, fl, cor, sl, st, inf)]
        tag = "RESULT" if cand == now and bs.STRAY_SPREAD_WINDOW == window_now else "candidate"
        print(f"{tag} scale={a:g} floor={fl:g} corona={cw:g} corona_uv={cu:g} slope={sl:g} structured={st:g} "
              f"influence={inf:g} "
              f"window={bs.STRAY_SPREAD_WINDOW:g} seeds={seeds[0]}-{seeds[-1]} "
              f"{_line(parts[0])} | first half {_line(parts[1])} | second half {_line(parts[2])}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
