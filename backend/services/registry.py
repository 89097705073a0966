"""Calibration registry: register masters, select the set a frame is calibrated with.

Selection rule (DKIST "most recent valid" style): for each kind, the newest version whose
validity interval contains the frame's DATE-OBS, unless the job pins a version. A warning
is recorded when the chosen file's validity starts far from the frame (``FAR_DAYS``).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from backend.models import CalibrationFile, CalibrationKind
from pipelines.errors import CalibrationMissingError
from pipelines.utc import assume_utc

__all__ = ["REQUIRED_KINDS", "OPTIONAL_KINDS", "SelectedCalibrations", "select_calibrations", "FAR_DAYS"]

#: Kinds every L2 product of a channel needs.
REQUIRED_KINDS: dict[str, tuple[str, ...]] = {
    "SDI": ("dark", "flat", "radiometric"),
    "WST": ("dark", "flat", "radiometric"),
    "SCI-UV": ("dark", "flat", "radiometric", "stray_light"),
    "SCI-WL": ("dark", "flat", "radiometric", "stray_light"),
}
#: Kinds used when present.
OPTIONAL_KINDS: tuple[str, ...] = ("mask_geometry",)
#: Kinds used only when a job's options ask for them (``deconvolve_psf`` -> ``psf``).
ON_REQUEST_KINDS: tuple[str, ...] = ("psf",)
#: A calibration file whose validity starts more than this many days from DATE-OBS is flagged.
FAR_DAYS = 30.0


@dataclass
class SelectedCalibrations:
    files: dict[str, CalibrationFile]
    warnings: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Stable identity of the set: ``kind:id`` pairs sorted by kind."""
        return ",".join(f"{k}:{f.id}" for k, f in sorted(self.files.items()))


def _fits_frame(f: CalibrationFile, naxis: int | None) -> bool:
    """A master made for another frame size (``FRMNAXIS``) cannot calibrate this frame."""
    size = (f.parameters or {}).get("FRMNAXIS")
    return naxis is None or size is None or int(size) == int(naxis)


def select_calibrations(
    session: Session, channel: str, date_obs: dt.datetime, pinned: dict[str, int] | None = None,
    naxis: int | None = None, also_required: tuple[str, ...] = (),
) -> SelectedCalibrations:
    """Choose the calibration files for one frame.

    Parameters
    ----------
    channel : str
        LST channel code.
    date_obs : datetime
        The frame's DATE-OBS (UTC).
    pinned : dict, optional
        ``{kind: version}`` pinned by a job; a pinned version must exist for the channel.
    naxis : int, optional
        The frame's size [pixel]; masters whose ``FRMNAXIS`` differs are passed over.
    also_required : tuple of str
        Kinds the job's options need (e.g. ``("psf",)`` for PSF deconvolution). A kind of
        :data:`ON_REQUEST_KINDS` is selected only when asked for here, so registering a PSF
        master does not change the calibration set of products that do not use it.

    Raises
    ------
    CalibrationMissingError
        If a required kind has no file valid at DATE-OBS, or a pinned version is missing.
    """
    pinned = pinned or {}
    date_obs = assume_utc(date_obs)
    chosen: dict[str, CalibrationFile] = {}
    warnings: list[str] = []
    required = (*REQUIRED_KINDS[channel], *also_required)
    for kind in dict.fromkeys((*required, *OPTIONAL_KINDS)):
        q = select(CalibrationFile).where(
            CalibrationFile.channel_code == channel, CalibrationFile.kind == CalibrationKind(kind)
        )
        if kind in pinned:
            f = session.scalar(q.where(CalibrationFile.version == pinned[kind]))
            if f is None:
                raise CalibrationMissingError(f"{channel}: pinned {kind} version {pinned[kind]} does not exist")
            if not _fits_frame(f, naxis):
                raise CalibrationMissingError(
                    f"{channel}: pinned {kind} version {pinned[kind]} was made for "
                    f"{f.parameters.get('FRMNAXIS')} px frames, this frame has {naxis}")
        else:
            candidates = session.scalars(
                q.where(
                    CalibrationFile.valid_from <= date_obs,
                    or_(CalibrationFile.valid_to.is_(None), CalibrationFile.valid_to > date_obs),
                ).order_by(CalibrationFile.version.desc())
            )
            f = next((c for c in candidates if _fits_frame(c, naxis)), None)
        if f is None:
            if kind in required:
                raise CalibrationMissingError(
                    f"{channel}: no {kind} calibration file valid at {date_obs.isoformat()}"
                    + (f" for {naxis} px frames" if naxis else "")
                )
            continue
        gap = abs((assume_utc(f.valid_from) - date_obs).total_seconds()) / 86400.0
        if gap > FAR_DAYS:
            warnings.append(f"{kind} v{f.version} starts {gap:.0f} days from DATE-OBS")
        chosen[kind] = f
    return SelectedCalibrations(chosen, warnings)


def params_hash(options: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(options or {}, sort_keys=True).encode()).hexdigest()[:16]
