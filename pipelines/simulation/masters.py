"""The calibration masters written for ingest (``calibration/``), and reading them back.

Per channel: ``dark`` (bias plane and dark-rate plane), ``flat``, ``radiometric``,
``mask_geometry`` and, for SCI, ``stray_light``; each self-describing (``CALKIND``,
``CHANNEL``, ``CALVER``, ``VALIDFRM``/``VALIDTO``, ``CALDESC``, parameters).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from astropy import units as u
from astropy.io import fits
from astropy.time import Time

from pipelines.calibration.l2.steps import StrayLightModel
from pipelines.channels import CHANNELS, ChannelSpec
from pipelines.simulation.forward import InstrumentModel
from pipelines.simulation.output import _write
from pipelines.simulation.results import CalibrationFileInfo


def _ceil_sig(x: float, digits: int = 3) -> float:
    """``x`` rounded up to ``digits`` significant digits."""
    if x <= 0:
        return x
    e = math.floor(math.log10(x)) - digits + 1
    return math.ceil(x / 10.0 ** e) * 10.0 ** e


def _radiometric_coefficient(peak_signal: float, flat: np.ndarray, bias: np.ndarray, dark_rate: np.ndarray,
                             model: InstrumentModel) -> float:
    """The channel's radiometric coefficient C [unit per DN/s], 4 significant digits (rounded up).

    Chosen so that the brightest signal ``peak_signal`` (physical units, stray light
    included) on the flat's brightest pixel, plus the bias and the 99.9th-percentile dark,
    stays below ``model.target_peak_dn`` with a 1 % margin (uint16 head-room).
    """
    t_exp = model.exptime_s
    headroom = model.target_peak_dn - float(bias.max()) - float(np.percentile(dark_rate, 99.9)) * t_exp
    return _ceil_sig(peak_signal * float(flat.max()) * t_exp * 1.01 / headroom, 4)


def _validity(t_first: Time, t_last: Time) -> tuple[str, str]:
    """``VALIDFRM``/``VALIDTO`` of a channel's masters: midnight UTC 30 days either side of its frames."""
    valid_from = (t_first - 30 * u.day).utc.strftime("%Y-%m-%dT00:00:00")
    valid_to = (t_last + 30 * u.day).utc.strftime("%Y-%m-%dT00:00:00")
    return valid_from, valid_to


def _master_header(kind: str, chan: str, version: int, valid_from: str, valid_to: str, desc: str,
                   n: int) -> fits.Header:
    """The keywords every master carries (``CALKIND``, ``CHANNEL``, ``FRMNAXIS``, ``CALVER``, validity, ``CALDESC``)."""
    h = fits.Header()
    h["TELESCOP"], h["INSTRUME"] = "ASO-S", "LST"
    h["CALKIND"] = (kind, "calibration kind")
    h["CHANNEL"] = (chan, "LST channel")
    h["FRMNAXIS"] = (n, "[pix] frame size it applies to")
    h["DETECTOR"] = (CHANNELS[chan].instrument, "LST instrument")
    h["CALVER"] = (version, "calibration version")
    h["VALIDFRM"] = (valid_from, "[UTC] valid from")
    h["VALIDTO"] = (valid_to, "[UTC] valid to")
    h["CALDESC"] = desc
    h["ORIGIN"] = ("lstdp simulator", "simulated calibration, not flight data")
    return h


def load_simulated_masters(out_dir: str | os.PathLike, channel: str, *, first_id: int = 1) -> dict[str, Any]:
    """The masters :func:`~pipelines.simulation.simulate` wrote for ``channel``, as the calibration takes them.

    Parameters
    ----------
    out_dir : path-like
        The folder given to :func:`~pipelines.simulation.simulate` (masters in ``calibration/lst_<chan>_*.fits``).
    channel : str
        LST channel code (``SDI``, ``WST``, ``SCI-UV``, ``SCI-WL``).
    first_id : int
        Registry ids given to the masters in file-name order (``first_id``, ``first_id + 1``,
        ...), standing in for the database ids that ingest would give them.

    Returns
    -------
    dict of str to pipelines.calibration.l2.flow.CalibrationInput
        By calibration kind (``dark``, ``flat``, ``radiometric``, ...): the mapping
        :func:`pipelines.calibration.l2.flow.calibrate_frame` takes.

    Raises
    ------
    pipelines.errors.FitsReadError, pipelines.errors.DataError
        If a master cannot be read or does not describe itself.
    """
    from pipelines.calibration.l2.flow import load_calibration_master

    cals: dict[str, Any] = {}
    for path in sorted((Path(out_dir) / "calibration").glob(f"lst_{channel.lower()}_*.fits")):
        cal = load_calibration_master(path)
        cal.id = first_id + len(cals)
        cals[cal.kind] = cal
    return cals


def _write_masters(out: Path, chan: str, spec: ChannelSpec, model: InstrumentModel, n: int,
                   flat: np.ndarray, bias: np.ndarray, dark_rate: np.ndarray, coef: float,
                   stray: StrayLightModel | None, valid_from: str, valid_to: str,
                   when: str) -> list[CalibrationFileInfo]:
    """Write the channel's masters under ``out/calibration`` (checksums stamped with ``when``); in file order."""
    infos = []
    code = chan.lower()
    version = 1

    def emit(kind: str, hdus: list, desc: str, params: dict[str, Any]) -> None:
        path = out / "calibration" / f"lst_{code}_{kind}_{n}_v{version:02d}.fits"
        sha = _write(fits.HDUList(hdus), path, when)
        infos.append(CalibrationFileInfo(path=path, kind=kind, channel=chan, version=version, valid_from=valid_from,
                                         valid_to=valid_to, description=desc, sha256=sha, parameters=params))

    # dark: bias plane (primary) + dark-rate plane, so the dark scales with EXPTIME
    desc = f"{chan} master dark: bias [DN] (primary) and dark-current rate [DN/s] (DARKRATE), {n}x{n}"
    h = _master_header("dark", chan, version, valid_from, valid_to, desc, n)
    h["EXTNAME"] = "BIAS"
    h["BUNIT"] = "DN"
    h["BIASMEAN"] = (float(bias.mean()), "[DN] mean bias")
    h["DARKMEAN"] = (float(dark_rate.mean()), "[DN/s] mean dark-current rate")
    h["DARKUNIT"] = ("DN/s", "unit of the DARKRATE plane")
    dh = fits.Header()
    dh["BUNIT"] = "DN/s"
    emit("dark", [fits.PrimaryHDU(bias, header=h), fits.ImageHDU(dark_rate, header=dh, name="DARKRATE")], desc,
         {"BIASMEAN": float(bias.mean()), "DARKMEAN": float(dark_rate.mean())})

    desc = (f"{chan} flat field (mean 1) with CMOS laser-annealing stripes, {n}x{n}")
    h = _master_header("flat", chan, version, valid_from, valid_to, desc, n)
    h["EXTNAME"] = "FLAT"
    h["BUNIT"] = ""
    h["FLATMEAN"] = (float(flat.mean()), "mean of the flat")
    h["STRIPAMP"] = (model.stripe_amplitude, "RMS stripe amplitude")
    h["STRIPPER"] = (max(4.0, model.stripe_period_full * n / spec.naxis), "[pix] stripe period")
    emit("flat", [fits.PrimaryHDU(flat, header=h)], desc,
         {"FLATMEAN": float(flat.mean()), "STRIPAMP": model.stripe_amplitude})

    unit = spec.bunit
    desc = f"{chan} radiometric coefficient: {coef:.6g} {unit} per DN/s"
    h = _master_header("radiometric", chan, version, valid_from, valid_to, desc, n)
    h["RADCOEF"] = (coef, "radiometric coefficient, RADUNIT per DN/s")
    h["RADUNIT"] = (unit, "physical unit of the calibrated data")
    if unit == "MSB":
        h["MSBDEF"] = ("mean disk brightness in the channel passband", "MSB definition")
    emit("radiometric", [fits.PrimaryHDU(header=h)], desc, {"RADCOEF": coef, "RADUNIT": unit})

    if spec.is_coronagraph:
        desc = f"{chan} geometry: occulter {spec.fov_rsun_min} Rsun, field stop {spec.fov_rsun_max} Rsun"
        h = _master_header("mask_geometry", chan, version, valid_from, valid_to, desc, n)
        h["OCCRAD"] = (spec.fov_rsun_min, "[Rsun] occulter radius")
        h["FOVRAD"] = (spec.fov_rsun_max, "[Rsun] field-stop radius")
        params = {"OCCRAD": spec.fov_rsun_min, "FOVRAD": spec.fov_rsun_max}
    else:
        desc = f"{chan} geometry: useful field to {spec.fov_rsun_max} Rsun (no occulter)"
        h = _master_header("mask_geometry", chan, version, valid_from, valid_to, desc, n)
        h["FOVRAD"] = (spec.fov_rsun_max, "[Rsun] off-field-of-view radius")
        params = {"FOVRAD": spec.fov_rsun_max}
    emit("mask_geometry", [fits.PrimaryHDU(header=h)], desc, params)

    if stray is not None:
        b11, b25 = stray.brightness(1.1), stray.brightness(2.5)
        desc = (f"{chan} stray light: {stray.b_ref:.3g} MSB x (r/{stray.r_ref} Rsun)^-{stray.index:.4f} "
                f"({b11:.3g} MSB at 1.1 Rsun, {b25:.3g} at 2.5; LST on-orbit values)")
        h = _master_header("stray_light", chan, version, valid_from, valid_to, desc, n)
        h["STRAYB0"] = (stray.b_ref, "[MSB] stray light at STRAYR0")
        h["STRAYR0"] = (stray.r_ref, "[Rsun] reference radius")
        h["STRAYIDX"] = (stray.index, "power-law index (B ~ r^-STRAYIDX)")
        h["STRAYRMN"] = (stray.r_min, "[Rsun] r clipped below")
        h["STRAYRMX"] = (stray.r_max, "[Rsun] r clipped above")
        h["STRAYB11"] = (b11, "[MSB] at 1.1 Rsun")
        h["STRAYB25"] = (b25, "[MSB] at 2.5 Rsun")
        h["STRAYUNT"] = ("MSB", "unit")
        emit("stray_light", [fits.PrimaryHDU(header=h)], desc,
             {"STRAYB0": stray.b_ref, "STRAYR0": stray.r_ref, "STRAYIDX": stray.index})
    return infos
