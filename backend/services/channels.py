"""Channel reference rows, seeded from :mod:`pipelines.channels`."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.models import Channel
from pipelines.channels import CHANNELS


def ensure_channels(session: Session) -> int:
    """Insert or refresh the four LST channel rows; returns how many were added."""
    existing = {c.code: c for c in session.scalars(select(Channel))}
    added = 0
    for spec in CHANNELS.values():
        row = existing.get(spec.code)
        if row is None:
            row = Channel(code=spec.code)
            session.add(row)
            added += 1
        row.instrument = spec.instrument
        row.description = spec.description
        row.wavelength_nm = spec.wavelength_nm
        row.bandwidth_nm = spec.bandwidth_nm
        row.naxis = spec.naxis
        row.plate_scale_arcsec = spec.plate_scale
        row.fov_rsun_min = spec.fov_rsun_min
        row.fov_rsun_max = spec.fov_rsun_max
        row.bunit = spec.bunit
        row.cadence_s = spec.cadence_s
    session.flush()
    return added


def list_channels(session: Session) -> list[Channel]:
    return list(session.scalars(select(Channel).order_by(Channel.code)))
