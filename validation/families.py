"""Model families for the blind validation (issue 27 items 0 and 1): truths the estimator does not assume.

The blind parts hide the simulator's *numbers* from the chain, but by default the chain is
handed the simulator's *shapes*: the stray light is injected as exactly the power law the
chain fits, the coronal prior is the simulator's own radial law x 0.5, the dither scene is a
symmetric disk, the occulter is centred on the Sun, the SCI diffuser is uniform, the
degradation and the dark law have the chain's form, the flat's inputs are perfectly
dark-subtracted, the header roll is right and the LASP scale error is uniform within +-1 sigma.

:func:`draw_families` draws, per seed and from a random stream of its own
(``SeedSequence([seed, 27, 1])``, independent of every stream of the simulator and of the
chain), one truth per component from families the chain does not assume; the validation
(:mod:`validation.blind_chain`) injects them through the simulator's forward model
(:class:`pipelines.simulation.variants.ChannelVariant`, the dithered flat set's ``scene``,
the SDI campaign's ``sensitivity_extra`` and ``lasp_scale_error``) and through its own
instrument side (dark law, diffuser, flat inputs). With ``mismatch=False`` every field is
``None`` / zero and the validation draws today's truth, bit for bit. :data:`FAMILY_TABLE`
is the one table of the families, their parameters and their ranges (written into
``benchmarks/reports/calibration_mismatch.md``).

Where a family alternates between two shapes (stray light, corona, degradation), the
shape is chosen by the seed's parity (channel-shifted for SCI), so that any two consecutive
seeds cover both; the parameters are drawn per seed. The simulator's own shapes remain the
``mismatch=False`` family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

__all__ = ["COMPONENTS", "Families", "draw_families", "FAMILY_TABLE", "BentPowerLaw", "TwoComponentStray", "CoronaFactor",
           "DarkLaw", "Degradation", "DiffuserMap", "FlatInputs", "RealDitherScene", "STRAY_ANCHORS",
           "ROLL_ERROR_SIGMA_DEG", "OCCULTER_OFFSET_ARCSEC", "family_rows"]

#: The components :meth:`Families.only` can keep alone (one family at a time, for attribution).
COMPONENTS = ("stray", "corona", "dither_scene", "occulter", "diffuser", "degradation", "dark", "flat_inputs",
              "roll", "lasp")
#: LST.md's on-orbit stray-light points (r1 [Rsun], B1 [MSB], r2, B2) per SCI channel
#: (:func:`pipelines.simulation.forward.stray_light_model` passes through them too).
STRAY_ANCHORS = {"SCI-WL": (1.1, 7.8e-6, 2.5, 7.6e-7), "SCI-UV": (1.1, 4.3e-3, 2.5, 4.1e-4)}
#: Bend of the stray-light law between the anchors, |b| [fraction] (issue 27: 0.5-2 %).
STRAY_BEND = (0.005, 0.02)
#: Two-component stray light: index offsets [dimensionless] of the steep and the shallow component.
STRAY_INDEX_SPLIT = (0.5, 1.5)
#: Coronal radial tilt ``(r / 1.5) ** -t``, |t| drawn in this range.
CORONA_TILT = (0.3, 1.0)
#: Coronal bump ``1 + a exp(-((r - r0) / w) ** 2)``: a, r0 [Rsun], w [Rsun] ranges.
CORONA_BUMP = ((0.1, 0.4), (1.3, 2.2), (0.15, 0.4))
#: Occulter centre minus Sun centre [arcsec], magnitude drawn uniform in this range, direction uniform.
#: An assumption: LST.md states no occulter centring; 5-30 arcsec is 2-12 px of the 2.4 arcsec SCI pixel.
OCCULTER_OFFSET_ARCSEC = (5.0, 30.0)
#: Header roll error, Gaussian sigma [deg] per channel and seed. An assumption: LST.md states no roll
#: knowledge (commissioning-era SCI-UV headers had no roll at all, ``/work/shared/LST.md``); 0.05 deg is
#: 3 arcmin, the order of a star tracker's roll knowledge about the boresight.
ROLL_ERROR_SIGMA_DEG = 0.05
#: Diffuser large-scale non-uniformity: peak-to-centre amplitude [fraction] of a tilt plus a
#: radial bowl, drawn uniform in this range.
DIFFUSER_AMPLITUDE = (0.005, 0.02)
#: Dark current: weight of the depletion term (Eg/2) against diffusion (Eg); band gap [eV].
DARK_DEPLETION_WEIGHT = (0.3, 0.8)
DARK_BANDGAP_EV = (1.08, 1.16)
#: Degradation beyond the exponential: step depth, fast early loss depth [fraction] and its
#: e-folding time as a fraction of the campaign's span.
DEGRADATION_STEP = (0.01, 0.04)
DEGRADATION_EARLY = (0.02, 0.06)
DEGRADATION_EARLY_TAU = (0.05, 0.3)
#: LASP composite scale uncertainty, 1 sigma (:data:`pipelines.calibration.masters.radiometry.LASP_SCALE_UNCERTAINTY`).
LASP_SIGMA = 0.05
#: Flat inputs: bias drift [DN], dark residual [fraction of the dark], new hot pixels
#: [fraction of pixels] and their excess [DN], cosmic-ray rate factor on the quiet rate.
FLAT_BIAS_DN = (0.5, 3.0)
FLAT_DARK_RESIDUAL = (0.02, 0.10)
FLAT_HOT_FRACTION = (1e-4, 5e-4)
FLAT_HOT_DN = (50.0, 500.0)
FLAT_CR_RATE_FACTOR = (1.0, 50.0)
#: Dither scene: brightness gradient across the disk (limb asymmetry) [fraction from limb to limb].
DITHER_GRADIENT = (0.01, 0.05)

_BOLTZMANN_EV = 8.617333262e-5  # eV/K (CODATA 2018)

#: One row per component: (component, what the chain assumes, the families drawn (mismatch on),
#: parameters and ranges, where injected). Rendered by :func:`family_rows`.
FAMILY_TABLE: list[tuple[str, str, str, str, str]] = [
    ("SCI stray light", "a power law through LST.md's two points (exactly what is injected)",
     "even seed (SCI-UV; odd for SCI-WL): power law x smooth bend; else: sum of two power laws; both through "
     "both anchor points", f"bend 1 + b sin(pi ln(r/1.1)/ln(2.5/1.1)), |b| in {STRAY_BEND[0]:.3f}-{STRAY_BEND[1]:.3f}, "
     f"sign random; two components of index k +- d, d in {STRAY_INDEX_SPLIT}", "simulator forward model and truth "
     "(`ChannelVariant.stray`)"),
    ("SCI coronal truth", "the simulator's radial law x 0.5 (a scaled copy)",
     "even seed: K corona x (r/1.5)^-t; odd: K corona x (1 + a exp(-((r-r0)/w)^2))",
     f"|t| in {CORONA_TILT}, sign random; a, r0, w in {CORONA_BUMP}", "simulator truth (`ChannelVariant.corona_factor`)"),
    ("SDI/WST dither scene", "a symmetric limb-darkened disk with two spots",
     "the channel's own real-scene truth (SDI: SWAP 174 A Ly-alpha proxy with its plages; WST: MDI continuum) "
     "x a brightness gradient across the disk", f"gradient {DITHER_GRADIENT} limb to limb, direction uniform",
     "dithered flat set (`scene`)"),
    ("SCI occulter", "centred on the Sun",
     "aperture centre offset from the Sun centre", f"|offset| in {OCCULTER_OFFSET_ARCSEC} arcsec, direction uniform",
     "simulator forward model (`ChannelVariant.occulter_offset_px`)"),
    ("SCI diffuser", "perfectly uniform illumination",
     "uniform x (1 + tilt + radial bowl)", f"amplitude {DIFFUSER_AMPLITUDE} (tilt and bowl shares random)",
     "validation instrument side (SCI flat exposures)"),
    ("SDI degradation", "C(t) = C0 exp(lambda t) (what is injected)",
     "even seed: exponential x a step in sensitivity; odd: exponential x a fast early loss",
     f"step {DEGRADATION_STEP} at a time in the campaign's middle 60 %; early loss {DEGRADATION_EARLY}, "
     f"e-folding {DEGRADATION_EARLY_TAU} of the span", "SDI campaign (`sensitivity_extra`)"),
    ("Dark current vs temperature", "D(T) = D0 2^((T - T0)/Tdbl) (the injected law)",
     "depletion (Eg/2) + diffusion (Eg) Arrhenius terms, T^1.5 and T^3 prefactors",
     f"depletion weight {DARK_DEPLETION_WEIGHT} at the science temperature, Eg {DARK_BANDGAP_EV} eV",
     "validation instrument side (dark exposures)"),
    ("Flat inputs (SDI/WST)", "perfectly dark-subtracted dithered frames",
     "+ bias drift + dark residual + new hot pixels (static on the detector) + cosmic rays",
     f"bias {FLAT_BIAS_DN} DN; dark residual {FLAT_DARK_RESIDUAL}; hot pixels {FLAT_HOT_FRACTION} of pixels at "
     f"{FLAT_HOT_DN} DN; cosmic rays at {FLAT_CR_RATE_FACTOR} x the quiet rate", "validation instrument side"),
    ("Header roll", "the header's CROTA is the true roll",
     "CROTA = true roll + error", f"Gaussian, sigma {ROLL_ERROR_SIGMA_DEG} deg, per channel",
     "simulator raw header (`ChannelVariant.roll_error_deg`)"),
    ("LASP scale error", "(drawn uniform in +-1 sigma by the simulator)",
     "Gaussian at its stated sigma", f"sigma {LASP_SIGMA}", "SDI campaign (`lasp_scale_error`)"),
]


def family_rows() -> list[str]:
    """:data:`FAMILY_TABLE` as Markdown table lines."""
    lines = ["| component | the chain assumes | truth drawn (mismatch on) | parameters per seed | injected in |",
             "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in FAMILY_TABLE]
    return lines


# --------------------------------------------------------------------------- the shapes


@dataclass(frozen=True)
class BentPowerLaw:
    """Power law through two anchors times a smooth bend that is 1 at both [MSB].

    ``B(r) = B1 (r / r1)^-k (1 + b sin(pi ln(r / r1) / ln(r2 / r1)))`` for r1 <= r <= r2; outside,
    the pure power law (the bend is 0 there); r clipped to 1-3 Rsun as the simulator's law.
    """

    r1: float
    b1: float
    r2: float
    b2: float
    bend: float

    @property
    def index(self) -> float:
        return math.log(self.b1 / self.b2) / math.log(self.r2 / self.r1)

    def power_law(self, r):
        rc = np.clip(np.asarray(r, dtype=np.float64), 1.0, 3.0)
        return self.b1 * (rc / self.r1) ** (-self.index)

    def brightness(self, r):
        """Stray light [MSB] at ``r`` [Rsun] (array)."""
        rc = np.clip(np.asarray(r, dtype=np.float64), 1.0, 3.0)
        u = np.clip(np.log(rc / self.r1) / math.log(self.r2 / self.r1), 0.0, 1.0)
        return self.power_law(rc) * (1.0 + self.bend * np.sin(np.pi * u))


@dataclass(frozen=True)
class TwoComponentStray:
    """Sum of two power laws through both anchors [MSB]: ``a1 (r/r1)^-k1 + a2 (r/r1)^-k2``."""

    r1: float
    b1: float
    r2: float
    b2: float
    k1: float
    k2: float

    @property
    def amplitudes(self) -> tuple[float, float]:
        q = self.r2 / self.r1
        # a1 + a2 = b1; a1 q^-k1 + a2 q^-k2 = b2
        a1 = (self.b2 - self.b1 * q ** -self.k2) / (q ** -self.k1 - q ** -self.k2)
        return a1, self.b1 - a1

    def brightness(self, r):
        """Stray light [MSB] at ``r`` [Rsun] (array)."""
        rc = np.clip(np.asarray(r, dtype=np.float64), 1.0, 3.0)
        a1, a2 = self.amplitudes
        x = rc / self.r1
        return a1 * x ** -self.k1 + a2 * x ** -self.k2


@dataclass(frozen=True)
class CoronaFactor:
    """A radial factor on the K corona [dimensionless]: ``(r/1.5)^-tilt`` or ``1 + a exp(-((r - r0)/w)^2)``."""

    kind: str  # "tilt" or "bump"
    tilt: float = 0.0
    a: float = 0.0
    r0: float = 1.5
    w: float = 0.3

    def __call__(self, r):
        r = np.asarray(r, dtype=np.float64)
        if self.kind == "tilt":
            return (r / 1.5) ** (-self.tilt)
        return 1.0 + self.a * np.exp(-((r - self.r0) / self.w) ** 2)


@dataclass(frozen=True)
class DarkLaw:
    """Dark current relative to the science temperature: depletion + diffusion terms (Arrhenius).

    ``D(T)/D(Ts) = w g_dep(T)/g_dep(Ts) + (1 - w) g_dif(T)/g_dif(Ts)`` with
    ``g_dep = T^1.5 exp(-Eg / (2 k T))`` and ``g_dif = T^3 exp(-Eg / (k T))``, T [K]
    (Janesick 2001, *Scientific Charge-Coupled Devices*, ch. 5; Widenhorn et al. 2002, Proc.
    SPIE 4669, 193). Not a pure doubling law: the local doubling temperature runs from about
    7 C (depletion) to 3.5 C (diffusion).
    """

    weight_depletion: float
    bandgap_ev: float
    science_temp_c: float

    def __call__(self, temp_c: float) -> float:
        t, ts = temp_c + 273.15, self.science_temp_c + 273.15
        eg, k = self.bandgap_ev, _BOLTZMANN_EV
        dep = (t / ts) ** 1.5 * math.exp(-eg / (2 * k) * (1 / t - 1 / ts))
        dif = (t / ts) ** 3 * math.exp(-eg / k * (1 / t - 1 / ts))
        return self.weight_depletion * dep + (1 - self.weight_depletion) * dif


@dataclass(frozen=True)
class Degradation:
    """Sensitivity beyond the exponential law: a step or a fast early loss (``g(y, y_first, y_last)``)."""

    kind: str  # "step" or "early"
    depth: float
    where: float  # step: fraction of the span; early: e-folding as a fraction of the span

    def __call__(self, y: float, y_first: float, y_last: float) -> float:
        span = max(y_last - y_first, 1e-6)
        if self.kind == "step":
            return 1.0 - self.depth * (1.0 if y >= y_first + self.where * span else 0.0)
        return 1.0 - self.depth * (1.0 - math.exp(-max(y - y_first, 0.0) / (self.where * span)))


@dataclass(frozen=True)
class DiffuserMap:
    """Diffuser illumination [relative], ``1 + A (s t(x, y) + (1 - s) b(x, y))``: tilt t and bowl b, each in +-1."""

    amplitude: float
    tilt_share: float
    angle: float

    def __call__(self, n: int) -> np.ndarray:
        c = (n - 1) / 2.0
        y, x = (np.mgrid[0:n, 0:n] - c) / c
        tilt = x * math.cos(self.angle) + y * math.sin(self.angle)
        bowl = x * x + y * y - 1.0
        return 1.0 + self.amplitude * (self.tilt_share * tilt + (1.0 - self.tilt_share) * bowl)


@dataclass(frozen=True)
class FlatInputs:
    """Contamination of the dithered flat frames [DN] (bias drift, dark residual, new hot pixels, cosmic rays)."""

    bias_dn: float
    dark_residual: float
    hot_fraction: float
    hot_dn: float
    cr_rate_factor: float
    seed: int

    def contaminate(self, images_dn: list[np.ndarray], dark_dn: np.ndarray, *, exptime_s: float, detector_px: int,
                    gain: float, quiet_rate_cm2_s: float) -> list[np.ndarray]:
        """The images with the contamination added (float64 [DN]); ``dark_dn`` the frames' dark [DN]."""
        from validation.blind_chain import inject_cosmic_rays

        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 27, 2]))
        n = images_dn[0].shape[0]
        hot = np.zeros((n, n))
        k = max(1, int(round(self.hot_fraction * n * n)))
        idx = rng.choice(n * n, k, replace=False)
        hot.flat[idx] = rng.uniform(0.2, 1.0, k) * self.hot_dn
        static = self.bias_dn + self.dark_residual * dark_dn + hot
        out = []
        for im in images_dn:
            base = np.asarray(im, dtype=np.float64) + static
            dep = inject_cosmic_rays(np.zeros((n, n), np.uint16), rate_cm2_s=quiet_rate_cm2_s * self.cr_rate_factor,
                                     exptime_s=exptime_s, detector_px=detector_px, gain=gain, rng=rng)[1]
            out.append(base + dep)
        return out


class RealDitherScene:
    """A real solar image as the dithered flat set's scene: ``scene(y, x)`` [relative], offsets in Rsun.

    The image (e.g. a simulated frame's truth: SDI's SWAP-based Ly-alpha proxy, WST's MDI
    continuum) is read with its disk centre at ``CRPIX`` and its radius ``RSUN_OBS / CDELT1``,
    normalised to its median within 0.5 Rsun, and multiplied by ``1 + g (x cos a + y sin a) / 2``
    (a limb-to-limb brightness gradient ``g``).
    """

    def __init__(self, truth_path: Path, gradient: float, angle: float):
        from astropy.io import fits

        with fits.open(truth_path) as hd:
            img = np.asarray(hd[0].data, dtype=np.float64)
            h = hd[0].header
        self.cy, self.cx = float(h["CRPIX2"]) - 1.0, float(h["CRPIX1"]) - 1.0
        self.rsun_px = float(h["RSUN_OBS"]) / abs(float(h["CDELT1"]))
        n = img.shape[0]
        yy, xx = np.mgrid[0:n, 0:n]
        inner = np.hypot(yy - self.cy, xx - self.cx) < 0.5 * self.rsun_px
        self.img = img / float(np.median(img[inner]))
        self.gradient, self.angle = float(gradient), float(angle)

    def __call__(self, y, x):
        from scipy import ndimage

        v = ndimage.map_coordinates(self.img, [self.cy + y * self.rsun_px, self.cx + x * self.rsun_px], order=1,
                                    mode="constant", cval=0.0)
        return v * (1.0 + 0.5 * self.gradient * (x * math.cos(self.angle) + y * math.sin(self.angle)))


# --------------------------------------------------------------------------- the draw


@dataclass
class Families:
    """One seed's truth families (``mismatch=False``: all ``None`` / zero, today's truth).

    ``variants`` holds :class:`pipelines.simulation.variants.ChannelVariant` per channel;
    ``dither_gradient`` (gradient, angle) per disk channel (the scene is built from the
    channel's truth by :meth:`dither_scene`); the rest as the dataclasses above.
    ``params`` lists every drawn number by name (for the per-seed report).
    """

    seed: int
    mismatch: bool
    variants: dict = field(default_factory=dict)
    dither_gradient: dict = field(default_factory=dict)
    diffuser: dict = field(default_factory=dict)
    dark_law: DarkLaw | None = None
    degradation: Degradation | None = None
    lasp_scale_error: float | None = None
    flat_inputs: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    def campaign_kwargs(self) -> dict:
        """Keyword arguments of :func:`pipelines.simulation.campaign.simulate_sdi_campaign` (empty: today's)."""
        kw = {}
        if self.degradation is not None:
            kw["sensitivity_extra"] = self.degradation
        if self.lasp_scale_error is not None:
            kw["lasp_scale_error"] = self.lasp_scale_error
        return kw

    def only(self, component: str) -> "Families":
        """A copy with one component's family kept (:data:`COMPONENTS`) and every other at today's shape."""
        import dataclasses

        if component not in COMPONENTS:
            raise ValueError(f"unknown component {component!r}; one of {', '.join(COMPONENTS)}")
        keep = {"stray": "stray", "corona": "corona_factor", "occulter": "occulter_offset_px", "roll": "roll_error_deg"}
        variants = {}
        for chan, v in self.variants.items():
            base = dataclasses.replace(v, stray=None, corona_factor=None, occulter_offset_px=(0.0, 0.0),
                                       roll_error_deg=0.0)
            if component in keep:
                base = dataclasses.replace(base, **{keep[component]: getattr(v, keep[component])})
            variants[chan] = base
        return Families(seed=self.seed, mismatch=self.mismatch, variants=variants,
                        dither_gradient=self.dither_gradient if component == "dither_scene" else {},
                        diffuser=self.diffuser if component == "diffuser" else {},
                        dark_law=self.dark_law if component == "dark" else None,
                        degradation=self.degradation if component == "degradation" else None,
                        lasp_scale_error=self.lasp_scale_error if component == "lasp" else None,
                        flat_inputs=self.flat_inputs if component == "flat_inputs" else {},
                        params={k: v for k, v in self.params.items()})

    def dither_scene(self, chan: str, truth_path: Path) -> Callable | None:
        """The dithered flat set's scene for ``chan`` from its truth image, or ``None`` (the symmetric disk)."""
        g = self.dither_gradient.get(chan)
        return None if g is None else RealDitherScene(truth_path, *g)


def draw_families(seed: int, mismatch: bool, *, size: int = 256, science_temp_c: float = -15.0) -> Families:
    """Draw one seed's truth families.

    Parameters
    ----------
    seed : int
        The validation seed; the stream is ``SeedSequence([seed, 27, 1])`` (independent of the
        simulator's and the chain's streams).
    mismatch : bool
        ``False``: no family (today's truth, :class:`Families` with empty fields).
    size : int
        SCI frame side [pixel] (``min(size, 2048)``): converts the occulter offset to pixels.
    science_temp_c : float
        Temperature [deg C] at which the dark law is 1.

    Returns
    -------
    Families
    """
    from pipelines.simulation.variants import ChannelVariant

    fam = Families(seed=int(seed), mismatch=bool(mismatch))
    if not mismatch:
        return fam
    rng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 27, 1]))
    p = fam.params
    sci_px = min(int(size), 2048)
    arcsec_per_px = 2.4 * 2048 / sci_px  # LST.md: ~2.4 arcsec/px at 2048
    for ci, chan in enumerate(("SDI", "WST", "SCI-UV", "SCI-WL")):
        roll = float(rng.normal(0.0, ROLL_ERROR_SIGMA_DEG))
        p[f"roll_error_deg_{chan}"] = roll
        if not chan.startswith("SCI"):
            fam.variants[chan] = ChannelVariant(roll_error_deg=roll)
            g, a = float(rng.uniform(*DITHER_GRADIENT)), float(rng.uniform(0, 2 * math.pi))
            fam.dither_gradient[chan] = (g, a)
            p[f"dither_gradient_{chan}"] = g
            fi = FlatInputs(bias_dn=float(rng.uniform(*FLAT_BIAS_DN)), dark_residual=float(rng.uniform(*FLAT_DARK_RESIDUAL)),
                            hot_fraction=float(rng.uniform(*FLAT_HOT_FRACTION)), hot_dn=float(rng.uniform(*FLAT_HOT_DN)),
                            cr_rate_factor=float(rng.uniform(*FLAT_CR_RATE_FACTOR)), seed=int(seed) * 10 + ci)
            fam.flat_inputs[chan] = fi
            p[f"flat_bias_dn_{chan}"], p[f"flat_dark_residual_{chan}"] = fi.bias_dn, fi.dark_residual
            p[f"flat_hot_fraction_{chan}"], p[f"flat_cr_rate_factor_{chan}"] = fi.hot_fraction, fi.cr_rate_factor
            continue
        r1, b1, r2, b2 = STRAY_ANCHORS[chan]
        if (seed + ci) % 2 == 0:
            bend = float(rng.uniform(*STRAY_BEND)) * float(rng.choice([-1.0, 1.0]))
            stray = BentPowerLaw(r1, b1, r2, b2, bend)
            p[f"stray_family_{chan}"], p[f"stray_bend_{chan}"] = "bent", bend
        else:
            k = math.log(b1 / b2) / math.log(r2 / r1)
            d1, d2 = (float(rng.uniform(*STRAY_INDEX_SPLIT)) for _ in range(2))
            stray = TwoComponentStray(r1, b1, r2, b2, k + d1, max(k - d2, 0.3))
            p[f"stray_family_{chan}"] = "two-component"
            p[f"stray_k1_{chan}"], p[f"stray_k2_{chan}"] = stray.k1, stray.k2
        if seed % 2 == 0:
            t = float(rng.uniform(*CORONA_TILT)) * float(rng.choice([-1.0, 1.0]))
            cor = CoronaFactor("tilt", tilt=t)
            p[f"corona_family_{chan}"], p[f"corona_tilt_{chan}"] = "tilt", t
        else:
            (a_lo, a_hi), (r_lo, r_hi), (w_lo, w_hi) = CORONA_BUMP
            cor = CoronaFactor("bump", a=float(rng.uniform(a_lo, a_hi)), r0=float(rng.uniform(r_lo, r_hi)),
                               w=float(rng.uniform(w_lo, w_hi)))
            p[f"corona_family_{chan}"] = "bump"
            p[f"corona_bump_a_{chan}"], p[f"corona_bump_r0_{chan}"] = cor.a, cor.r0
        off = float(rng.uniform(*OCCULTER_OFFSET_ARCSEC)) / arcsec_per_px
        ang = float(rng.uniform(0, 2 * math.pi))
        occ = (off * math.cos(ang), off * math.sin(ang))
        p[f"occulter_offset_px_{chan}"] = off
        fam.variants[chan] = ChannelVariant(stray=stray, corona_factor=cor, occulter_offset_px=occ, roll_error_deg=roll)
        dm = DiffuserMap(amplitude=float(rng.uniform(*DIFFUSER_AMPLITUDE)), tilt_share=float(rng.uniform(0, 1)),
                         angle=float(rng.uniform(0, 2 * math.pi)))
        fam.diffuser[chan] = dm
        p[f"diffuser_amplitude_{chan}"] = dm.amplitude
    fam.dark_law = DarkLaw(float(rng.uniform(*DARK_DEPLETION_WEIGHT)), float(rng.uniform(*DARK_BANDGAP_EV)),
                           float(science_temp_c))
    p["dark_depletion_weight"], p["dark_bandgap_ev"] = fam.dark_law.weight_depletion, fam.dark_law.bandgap_ev
    if seed % 2 == 0:
        fam.degradation = Degradation("step", float(rng.uniform(*DEGRADATION_STEP)), float(rng.uniform(0.2, 0.8)))
    else:
        fam.degradation = Degradation("early", float(rng.uniform(*DEGRADATION_EARLY)),
                                      float(rng.uniform(*DEGRADATION_EARLY_TAU)))
    p["degradation_family"], p["degradation_depth"] = fam.degradation.kind, fam.degradation.depth
    fam.lasp_scale_error = float(rng.normal(0.0, LASP_SIGMA))
    p["lasp_scale_error"] = fam.lasp_scale_error
    return fam
