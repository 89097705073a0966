"""What the job form offers and what a job would touch, before it is submitted.

* :func:`option_fields`: the calibration options of
  :class:`pipelines.calibration.l2.options.CalibrationOptions` (the one definition) as form
  fields: name, kind (bool, int, float, choice), default, limits and unit, read from the
  model's fields so the form never drifts from what the API accepts.
* :func:`calibration_choices`: the calibration versions the registry holds, per kind, with
  the channels and validity of each, for the pinned-version select lists.
* :func:`estimate_job`: the frames a job over channels and a DATE-OBS range would
  recalibrate (per channel), and how many of them already have a written product.
"""

from __future__ import annotations

import datetime as dt
import re
import typing
from dataclasses import dataclass, field
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from backend.models import CalibrationFile, CalibrationKind, Frame, Product, ProductState
from pipelines.calibration import CalibrationOptions
from pipelines.channels import CHANNELS

__all__ = ["OptionField", "option_fields", "CalibrationChoice", "calibration_choices", "JobEstimate",
           "estimate_job"]


@dataclass(frozen=True)
class OptionField:
    """One calibration option as a form field.

    Attributes
    ----------
    name : str
        The field of :class:`CalibrationOptions` (the key of ``JobRequest.options``).
    kind : {"bool", "int", "float", "choice"}
    default : bool, int, float or str
    description : str
        The field's description, without its unit.
    unit : str or None
        The unit written as ``[unit]`` in the description (e.g. ``DN``).
    minimum, maximum : float or None
        Inclusive limits; ``exclusive_minimum``/``exclusive_maximum`` for strict ones.
    choices : tuple of str
        For ``choice``: the allowed values.
    """

    name: str
    kind: str
    default: Any
    description: str
    unit: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The name in words (``psf_iterations`` -> ``PSF iterations``; a trailing unit word is
        left to ``unit``: ``saturation_dn`` -> ``Saturation``)."""
        words = self.name.split("_")
        if self.unit and len(words) > 1 and words[-1].lower() == self.unit.lower():
            words = words[:-1]
        words = [_ACRONYMS.get(w, w) for w in words]
        return " ".join([words[0][:1].upper() + words[0][1:], *words[1:]])

    @property
    def step(self) -> str:
        return "1" if self.kind == "int" else "any"


_ACRONYMS = {"psf": "PSF", "dn": "DN", "dq": "DQ", "gpu": "GPU", "cpu": "CPU"}
_UNIT = re.compile(r"^\s*\[([^\]]+)\]\s*")


def option_fields() -> list[OptionField]:
    """The fields of :class:`CalibrationOptions`, in their declared order."""
    out = []
    for name, f in CalibrationOptions.model_fields.items():
        desc = f.description or ""
        unit = None
        if (m := _UNIT.match(desc)):
            unit, desc = m.group(1), desc[m.end():]
        ann = f.annotation
        kw: dict[str, Any] = {}
        if typing.get_origin(ann) is typing.Literal:
            kind, kw["choices"] = "choice", tuple(str(a) for a in typing.get_args(ann))
        elif ann is bool:
            kind = "bool"
        elif ann is int:
            kind = "int"
        elif ann is float:
            kind = "float"
        else:  # a new option of another type: shown as text, validated by the API
            kind = "text"
        for meta in f.metadata:
            if isinstance(meta, Ge):
                kw["minimum"] = meta.ge
            elif isinstance(meta, Le):
                kw["maximum"] = meta.le
            elif isinstance(meta, Gt):
                kw["exclusive_minimum"] = meta.gt
            elif isinstance(meta, Lt):
                kw["exclusive_maximum"] = meta.lt
        out.append(OptionField(name=name, kind=kind, default=f.default, description=desc, unit=unit, **kw))
    return out


@dataclass
class CalibrationChoice:
    """One version of a calibration kind in the registry, for a pinned-version select list.

    Attributes
    ----------
    kind : str
    version : int
    channels : list of str
        Channels that have this version of this kind.
    valid_from, valid_to : datetime or None
        Widest validity of this version over those channels (``valid_to`` None: open).
    description : str
    """

    kind: str
    version: int
    channels: list[str] = field(default_factory=list)
    valid_from: dt.datetime | None = None
    valid_to: dt.datetime | None = None
    description: str = ""


def calibration_choices(session: Session) -> dict[str, list[CalibrationChoice]]:
    """The versions the registry holds of each calibration kind, newest first.

    Returns
    -------
    dict of str to list of CalibrationChoice
        Every kind of :class:`backend.models.CalibrationKind` is a key (an empty list when
        none is registered).
    """
    out: dict[str, dict[int, CalibrationChoice]] = {k.value: {} for k in CalibrationKind}
    open_ended: set[tuple[str, int]] = set()
    rows = session.execute(select(CalibrationFile.kind, CalibrationFile.version, CalibrationFile.channel_code,
                                  CalibrationFile.valid_from, CalibrationFile.valid_to, CalibrationFile.description)
                           .order_by(CalibrationFile.kind, CalibrationFile.version.desc(),
                                     CalibrationFile.channel_code))
    for kind, version, channel, lo, hi, desc in rows:
        c = out[kind.value].setdefault(version, CalibrationChoice(kind.value, version, description=desc or ""))
        if channel not in c.channels:
            c.channels.append(channel)
        c.valid_from = lo if c.valid_from is None else min(c.valid_from, lo)
        if hi is None:
            open_ended.add((kind.value, version))
        c.valid_to = None if (kind.value, version) in open_ended else max(c.valid_to or hi, hi)
    return {k: sorted(v.values(), key=lambda c: -c.version) for k, v in out.items()}


@dataclass
class JobEstimate:
    """What a job would touch.

    Attributes
    ----------
    frames : int
        Frames of the channels with DATE-OBS in [start, end]: the job's items.
    per_channel : dict of str to int
        The same per channel (every requested channel is a key).
    with_products : int
        Of those frames, how many already have a written product (a job with the same
        calibration set and options skips them; another makes a new version).
    first, last : datetime or None
        Earliest and latest DATE-OBS among them.
    """

    frames: int
    per_channel: dict[str, int]
    with_products: int
    first: dt.datetime | None
    last: dt.datetime | None


def estimate_job(session: Session, channels: list[str], start: dt.datetime, end: dt.datetime) -> JobEstimate:
    """The frames a recalibration job over ``channels`` and DATE-OBS in [``start``, ``end``]
    (aware UTC, inclusive) would plan: one count and one ``GROUP BY`` on ``frames``."""
    channels = [c for c in CHANNELS if c in set(channels)]
    where = (Frame.channel_code.in_(channels), Frame.date_obs >= start, Frame.date_obs <= end)
    per = {c: 0 for c in channels}
    first = last = None
    for code, n, lo, hi in session.execute(
            select(Frame.channel_code, func.count(), func.min(Frame.date_obs), func.max(Frame.date_obs))
            .where(*where).group_by(Frame.channel_code)):
        per[code] = n
        first = lo if first is None else min(first, lo)
        last = hi if last is None else max(last, hi)
    with_products = session.scalar(
        select(func.count(distinct(Product.frame_id))).join(Product.frame)
        .where(*where, Product.state == ProductState.written)) or 0
    return JobEstimate(sum(per.values()), per, with_products, first, last)
