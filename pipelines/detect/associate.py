"""Rules that link solar events seen by different instruments or catalogues (pure functions).

The same physical event appears as several rows: a GOES X-ray flare, an LST/WST
white-light flare, an SDI Lyman-alpha brightening; a CME seen by SCI or LASCO follows a
flare or a prominence eruption. These functions decide from times and positions whether
two rows belong together; ``backend.services.events.associate_events`` applies them to
the stored events.

Rules
-----
Same flare (FL-FL, different sources)
    The peak of one lies within the other's [start, end] window widened by
    :data:`FLARE_TIME_SLACK`, and the place agrees: both name the same NOAA region (compared
    as full numbers, :func:`~pipelines.catalogues.records.full_noaa_number`: 3664 and 13664
    are one region), or both have helioprojective positions within
    :data:`FLARE_MAX_DISTANCE_ARCSEC` of each other. Two different region numbers and no
    positions: not the same flare. With neither a region pair nor a position pair the time
    decides, unless ``require_place`` (catalogue against catalogue: SWPC reports several
    flares at once without positions).
Flare -> CME (FL-CE)
    The CME's first appearance (``start_time``) lies from :data:`CME_AFTER_FLARE` before
    to after the flare's start: from 10 min before the flare start to 90 min after it
    (SCI sees a CME from 1.1 Rsun, LASCO C2 from 2 Rsun; Yashiro et al. 2006, ApJ 650,
    L143, find CME onsets mostly within tens of minutes of the flare). The flare's
    position angle on the disk lies within the CME's angular span widened by
    :data:`PA_SLACK_DEG` (a flare near disk centre, closer than
    :data:`DISK_CENTRE_ARCSEC`, has no defined direction and passes; a halo CME, width
    >= 270 deg, accepts any direction).
Prominence eruption -> CME (PR-CE)
    The same window, and the eruption's position angle within the CME's span widened by
    :data:`PA_SLACK_DEG`.
"""

from __future__ import annotations

import datetime as dt
import math

from pipelines.catalogues import association_label
from pipelines.catalogues.records import full_noaa_number
from pipelines.utc import as_utc

__all__ = [
    "FLARE_TIME_SLACK",
    "FLARE_MAX_DISTANCE_ARCSEC",
    "CME_BEFORE_FLARE",
    "CME_AFTER_FLARE",
    "PA_SLACK_DEG",
    "DISK_CENTRE_ARCSEC",
    "HALO_WIDTH_DEG",
    "disk_position_angle",
    "pa_difference",
    "same_flare",
    "same_region",
    "cme_follows",
    "association_reason",
]

#: Widening of a flare's [start, end] when matching another flare's peak.
FLARE_TIME_SLACK = dt.timedelta(minutes=10)
#: Farthest apart two rows of the same flare may be [arcsec] (GOES/NOAA locations are
#: given to 1 deg, ~16 arcsec at disk centre and much more near the limb).
FLARE_MAX_DISTANCE_ARCSEC = 150.0
#: A CME may appear this long before the flare start (pre-flare onset) ...
CME_BEFORE_FLARE = dt.timedelta(minutes=10)
#: ... and this long after it.
CME_AFTER_FLARE = dt.timedelta(minutes=90)
#: Tolerance added to each side of a CME's angular span [deg].
PA_SLACK_DEG = 20.0
#: Flares closer than this to disk centre have no usable position angle [arcsec].
DISK_CENTRE_ARCSEC = 200.0
#: A CME at least this wide is a (partial) halo: any source direction fits [deg].
HALO_WIDTH_DEG = 270.0


def disk_position_angle(hpc_x: float, hpc_y: float) -> float:
    """Position angle [deg, 0..360, counter-clockwise from solar north] of a point on the disk.

    PA = atan2(-x, y): north (+y) is 0, east (-x, left in a north-up image) is 90.
    """
    return math.degrees(math.atan2(-hpc_x, hpc_y)) % 360.0


def pa_difference(a: float, b: float) -> float:
    """Smallest angle between two position angles [deg, 0..180]."""
    d = abs(a - b) % 360.0
    return min(d, 360.0 - d)


def _window(start, peak, end) -> tuple[dt.datetime, dt.datetime]:
    times = [as_utc(t) for t in (start, peak, end) if t is not None]
    return min(times), max(times)


def _region(e) -> int | None:
    n = getattr(e, "noaa_ar", None)
    if n is None:
        return None
    return full_noaa_number(n, as_utc(e.start_time))


def same_region(a, b) -> bool | None:
    """Whether two rows name the same NOAA region (full numbers compared: 3664 in 2024 is
    13664); None when either names none."""
    ra, rb = _region(a), _region(b)
    if ra is None or rb is None:
        return None
    return ra == rb


def same_flare(a, b, *, require_place: bool = False) -> bool:
    """True when flare rows ``a`` and ``b`` (objects with start_time, peak_time, end_time,
    hpc_x, hpc_y and optionally noaa_ar) are the same flare (see the module rules)."""
    a0, a1 = _window(a.start_time, a.peak_time, a.end_time)
    b0, b1 = _window(b.start_time, b.peak_time, b.end_time)
    ap, bp = as_utc(a.peak_time or a.start_time), as_utc(b.peak_time or b.start_time)
    in_b = b0 - FLARE_TIME_SLACK <= ap <= b1 + FLARE_TIME_SLACK
    in_a = a0 - FLARE_TIME_SLACK <= bp <= a1 + FLARE_TIME_SLACK
    if not (in_a or in_b):
        return False
    region = same_region(a, b)
    if region:
        return True
    if None not in (a.hpc_x, a.hpc_y, b.hpc_x, b.hpc_y):
        return math.hypot(a.hpc_x - b.hpc_x, a.hpc_y - b.hpc_y) <= FLARE_MAX_DISTANCE_ARCSEC
    if region is False:
        return False
    return not require_place


def _source_pa(src) -> float | None:
    """Direction of a flare (from hpc) or prominence eruption (its position angle); None if
    undefined (no position, or a flare near disk centre)."""
    if src.event_type == "FL":
        if src.hpc_x is None or src.hpc_y is None:
            return None
        if math.hypot(src.hpc_x, src.hpc_y) < DISK_CENTRE_ARCSEC:
            return None
        return disk_position_angle(src.hpc_x, src.hpc_y)
    return src.position_angle


def cme_follows(src, cme) -> tuple[bool, float]:
    """Whether CME row ``cme`` follows flare or prominence-eruption row ``src``, and a score
    (smaller is better: minutes between the source start and the CME start plus the PA
    offset in degrees / 10).

    ``src`` needs event_type, start_time, hpc_x/hpc_y (flare) or position_angle
    (prominence); ``cme`` needs start_time, position_angle, angular_width.
    """
    s0, c0 = as_utc(src.start_time), as_utc(cme.start_time)
    if not (s0 - CME_BEFORE_FLARE <= c0 <= s0 + CME_AFTER_FLARE):
        return False, math.inf
    minutes = abs((c0 - s0).total_seconds()) / 60.0
    width = cme.angular_width
    halo = width is not None and width >= HALO_WIDTH_DEG
    pa = _source_pa(src)
    if halo:
        return True, minutes
    if cme.position_angle is None:
        return False, math.inf
    if pa is None:
        # a flare at disk centre can launch a CME in any direction; an eruption without PA cannot be placed
        return (src.event_type == "FL" and src.hpc_x is not None), minutes + 18.0
    half = (width or 0.0) / 2.0 + PA_SLACK_DEG
    d = pa_difference(pa, cme.position_angle)
    if d > half:
        return False, math.inf
    return True, minutes + d / 10.0


def _who(e) -> str:
    name = association_label(e.source)
    frm = getattr(e, "frm_name", None)
    if e.source == "hek" and frm:
        name += f" ({frm})"
    elif e.source == "detected" and frm:
        name += f" {frm}"
    return name


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def association_reason(kind: str, a, b) -> str:
    """Why rows ``a`` and ``b`` are linked by ``kind``, in words with the evidence the rules used.

    ``same_flare``: the sources, how far apart the peaks are, the NOAA region both name, the
    distance between their helioprojective positions [arcsec] and a shared GOES class, e.g.
    "same flare in GOES and HEK (SWPC): peaks 2 min apart, both NOAA AR 11226, 40″ apart".
    ``flare_cme``/``prominence_cme`` (and their reverses): the CME's first appearance from the
    flare or eruption start and the position-angle agreement (or a halo CME). Any other kind (a
    catalogue's own edge, e.g. HEK ``is_followed_by``): "stated by <source>: <kind>".

    Parameters
    ----------
    kind : str
        The association kind as stored from ``a`` to ``b``.
    a, b : Event-like
        Rows with source, start/peak/end times, hpc_x/hpc_y, noaa_ar, goes_class,
        position_angle, angular_width (any may be None).

    Returns
    -------
    str
        One line.
    """
    if kind == "same_flare":
        ap, bp = as_utc(a.peak_time or a.start_time), as_utc(b.peak_time or b.start_time)
        parts = [f"peaks {_span((ap - bp).total_seconds())} apart" if (a.peak_time and b.peak_time)
                 else f"starts/peaks {_span((ap - bp).total_seconds())} apart"]
        if same_region(a, b):
            parts.append(f"both NOAA AR {_region(a)}")
        if None not in (a.hpc_x, a.hpc_y, b.hpc_x, b.hpc_y):
            parts.append(f"{math.hypot(a.hpc_x - b.hpc_x, a.hpc_y - b.hpc_y):.0f}\u2033 apart")
        ca, cb = getattr(a, "goes_class", None), getattr(b, "goes_class", None)
        if ca and cb and ca == cb:
            parts.append(f"both GOES {ca}")
        return f"same flare in {_who(a)} and {_who(b)}: " + ", ".join(parts)
    if kind in ("flare_cme", "cme_flare", "prominence_cme", "cme_prominence"):
        src, cme = (a, b) if kind in ("flare_cme", "prominence_cme") else (b, a)
        what = "flare" if src.event_type == "FL" else "eruption"
        minutes = (as_utc(cme.start_time) - as_utc(src.start_time)).total_seconds() / 60.0
        parts = [f"{_who(cme)} CME first seen {minutes:+.0f} min from the {_who(src)} {what} start"]
        width = cme.angular_width
        pa = _source_pa(src)
        if width is not None and width >= HALO_WIDTH_DEG:
            parts.append(f"halo CME (width {width:.0f}\u00b0): any direction fits")
        elif pa is not None and cme.position_angle is not None:
            parts.append(f"{what} position angle {pa:.0f}\u00b0, CME {cme.position_angle:.0f}\u00b0"
                         + (f" \u00b1 {width / 2:.0f}\u00b0" if width is not None else ""))
        elif src.event_type == "FL":
            parts.append("flare near disk centre: no direction to compare")
        return ", ".join(parts)
    return f"stated by {_who(a)}: {kind.replace('_', ' ')}"
