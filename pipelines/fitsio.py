"""One FITS reader that tolerates real headers' quirks, and one atomic FITS writer.

Reader quirks handled (all met in the project's real sample data):

* gzip files and tile-compressed HDUs (the first HDU with 2-D image data is used);
* ``BZERO``/``BSCALE`` scaled integers (astropy applies them) and ``BLANK`` on float data;
* non-ISO ``DATE-OBS`` (SSW ``01-May-23 13:07:58.713``, ``01/01/30, 02:58:23.429``,
  ``2007/05/03 10:20:18``, trailing ``Z``, FITS old format ``DD/MM/YY`` with ``TIME-OBS``);
  when ``DATE-OBS`` is missing, blank or does not parse, ``DATE_OBS``, ``DATE-BEG``,
  ``DATE-AVG`` in this order;
* ``CTYPE = 'solar_x'/'solar_y'`` with ``CUNIT='arcsecs'`` (mapped to ``HPLN-TAN``/``HPLT-TAN``
  and ``arcsec``, as sunpy's ASO-S/HXI source does);
* missing observer keywords (``HGLN_OBS``, ``HGLT_OBS``, ``DSUN_OBS``): each one missing is
  filled from Earth's ephemeris at DATE-OBS (ASO-S is in low Earth orbit, LST.md), the
  given ones are kept; an ASO-S frame's ``DSUN_OBS`` in km is converted, an implausible one
  refused (:data:`DSUN_RANGE_M`);
* NaN pixels (kept; counted by the caller);
* illegal keyword names (e.g. ``P.I.    = 'Latham  '``, astropy/astropy#887: astropy's
  ``verify('silentfix')`` calls them unfixable): renamed to a legal name, value kept
  (:func:`repair_keyword_names`);
* headers with thousands of ``HISTORY`` cards: only the first and last
  :data:`HISTORY_KEEP` of the primary header are read, the count is kept
  (:func:`bounded_fits_source`); the raw file keeps them all.

Verified: ``CHECKSUM``/``DATASUM`` of every HDU that carries them (a mismatch refuses the
file). Defaults applied (each recorded in ``RawImage.fixes`` and as a HISTORY card, so the
product carries it): observer at Earth's centre for whichever observer keyword is missing,
``CUNITi = 'arcsec'`` when a helioprojective axis has no unit, roll 0 when the header gives
no ``CROTA2``/``PCi_j``/``CDi_j``; ``DSUN_OBS`` in km is converted to m.

Every refusal raises :class:`~pipelines.errors.FitsReadError` with a one-line reason.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import io
import math
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from astropy.io import fits
from astropy.time import Time

from pipelines.errors import DataError, FitsReadError, HeaderFixWarning
from pipelines.tmpfiles import (  # noqa: F401 - re-exported: the store's temporary files
    PARTIAL_MAX_AGE_S, PARTIAL_PATTERNS, STORE_TMP_DIR, partial_files, process_alive, sha256_file, store_tmp_dir,
    sweep_dead_writers, sweep_partial_files, writer_prefix)
from pipelines.utc import datetime_from_time

__all__ = [
    "sweep_dead_writers",
    "process_alive",
    "RawImage",
    "read_image",
    "read_image_stored",
    "StoredImage",
    "StoredSums",
    "PendingFile",
    "write_fits_pending",
    "STORED_UINT16",
    "parse_date_obs",
    "fix_header",
    "add_observer_keywords",
    "exposure_seconds",
    "verify_checksums",
    "DATE_KEYWORDS",
    "HISTORY_KEEP",
    "bounded_fits_source",
    "read_primary_header",
    "repair_keyword_names",
    "EXPOSURE_KEYWORDS",
    "DSUN_RANGE_M",
    "write_fits_atomic",
    "write_atomic",
    "sha256_file",
    "STORE_TMP_DIR",
    "PARTIAL_MAX_AGE_S",
    "PARTIAL_PATTERNS",
    "store_tmp_dir",
    "partial_files",
    "sweep_partial_files",
]

_MONTHS = {m: i for i, m in enumerate(
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], start=1)}
_SSW_DMY = re.compile(r"^\s*(\d{1,2})-([A-Za-z]{3})-(\d{2}|\d{4})[ T]+(\d{1,2}):(\d{2}):(\d{2}(?:\.\d*)?)\s*$")
_YMD_SLASH = re.compile(r"^\s*(\d{2}|\d{4})/(\d{1,2})/(\d{1,2})[,\sT]+(\d{1,2}):(\d{2}):(\d{2}(?:\.\d*)?)\s*$")


_DMY_SLASH = re.compile(r"^\s*(\d{1,2})/(\d{1,2})/(\d{2})\s*$")  # FITS old format 'DD/MM/YY'
_SSW_DMY_DATE = re.compile(r"^\s*(\d{1,2})-([A-Za-z]{3})-(\d{2}|\d{4})\s*$")

#: Date keywords tried, in order, for the observation time (FITS standard 4.0 sect. 9.1:
#: DATE-OBS, then the time of the start and the mean of the observation; ``DATE_OBS`` the
#: SSW spelling). The first that gives a valid time is used.
DATE_KEYWORDS = ("DATE-OBS", "DATE_OBS", "DATE-BEG", "DATE-AVG")

#: Exposure keywords read, in this order [s]: ``XPOSURE`` is the FITS 4.0 keyword
#: (sect. 8.4.2 and Table 22), ``EXPTIME`` and ``EXPOSURE`` the common ones.
EXPOSURE_KEYWORDS = ("EXPTIME", "XPOSURE", "EXPOSURE")

#: Plausible Sun-observer distance for an observer in Earth orbit [m]: Earth's perihelion
#: and aphelion are 0.9833 and 1.0167 au (1.471e11 and 1.521e11 m; IAU/JPL orbital
#: elements), LST is in low Earth orbit (< 1e7 m from the geocentre); the range keeps a
#: margin of about 5 %.
DSUN_RANGE_M = (1.4e11, 1.6e11)


def _century(yy: str) -> int:
    y = int(yy)
    if len(yy) == 4:
        return y
    # SSW convention: two-digit years 50-99 are 1950-1999, 00-49 are 2000-2049
    return 1900 + y if y >= 50 else 2000 + y


def _is_missing(value: Any) -> bool:
    """A keyword with no value: absent, undefined (``KEY =`` with no value), or a blank string."""
    return value is None or isinstance(value, fits.card.Undefined) or str(value).strip() == ""


def _parse_date(value: str, time_obs: str | None = None) -> tuple[Time, str | None]:
    """``parse_date_obs`` and a note when a two-digit year was given a century."""
    s = str(value).strip()
    m = _DMY_SLASH.match(s)
    if m:  # FITS 4.0 sect. 9.1.1: the old 'DD/MM/YY' format means 19YY
        d, mo, yy = m.groups()
        if _is_missing(time_obs):
            raise ValueError(f"DATE-OBS {value!r} gives no time of day (and no TIME-OBS)")
        iso = f"19{yy}-{int(mo):02d}-{int(d):02d}T{str(time_obs).strip()}"
        return _iso_time(iso, value), f"two-digit year '{yy}' read as 19{yy} (FITS 4.0 sect. 9.1.1, old 'DD/MM/YY' format)"
    m = _SSW_DMY_DATE.match(s)
    if m and _is_missing(time_obs):
        raise ValueError(f"DATE-OBS {value!r} gives no time of day (and no TIME-OBS)")
    if m:
        s = f"{s} {str(time_obs).strip()}"
    m = _SSW_DMY.match(s)
    if m:
        d, mon, yy, hh, mm, ss = m.groups()
        if mon.upper() not in _MONTHS:
            raise ValueError(f"unknown month in DATE-OBS {value!r}")
        iso = f"{_century(yy):04d}-{_MONTHS[mon.upper()]:02d}-{int(d):02d}T{int(hh):02d}:{mm}:{ss}"
        return _iso_time(iso, value), _two_digit_note(yy)
    m = _YMD_SLASH.match(s)
    if m:
        yy, mo, d, hh, mm, ss = m.groups()
        iso = f"{_century(yy):04d}-{int(mo):02d}-{int(d):02d}T{int(hh):02d}:{mm}:{ss}"
        return _iso_time(iso, value), _two_digit_note(yy)
    if re.search(r"[T ]\d{1,2}:\d{2}(:\d{2}(\.\d*)?)?[+-]\d{2}:?\d{2}$", s):  # ISO with a UTC offset
        try:
            when = dt.datetime.fromisoformat(s).astimezone(dt.UTC).replace(tzinfo=None)
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"unrecognised DATE-OBS {value!r}") from exc
        return Time(when, scale="utc"), None
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", s) and not _is_missing(time_obs):  # date in DATE-OBS, time in TIME-OBS
        s = f"{s}T{str(time_obs).strip()}"
    s = s.rstrip("Zz").replace(" ", "T", 1) if "T" not in s else s.rstrip("Zz")
    if not re.match(r"^\d{4}-\d{2}-\d{2}", s):  # ISO 8601 only (astropy also takes e.g. 'J2000')
        raise ValueError(f"unrecognised DATE-OBS {value!r}")
    return _iso_time(s, value), None


def _iso_time(iso: str, value: Any) -> Time:
    try:
        return Time(iso, format="isot" if "T" in iso else None, scale="utc")
    except ValueError as exc:
        raise ValueError(f"unrecognised DATE-OBS {value!r}") from exc


def _two_digit_note(yy: str) -> str | None:
    if len(yy) != 2:
        return None
    return (f"two-digit year '{yy}' read as {_century(yy)} (SSW practice, as ASO-S writes its dates: "
            "00-49 are 20YY, 50-99 are 19YY)")


def parse_date_obs(value: str) -> Time:
    """Parse a DATE-OBS string in any of the formats met in solar FITS files.

    Parameters
    ----------
    value : str
        ISO 8601 (with or without ``Z``), SSW ``DD-Mon-YY hh:mm:ss.sss`` or
        ``YY/MM/DD, hh:mm:ss.sss``. Two-digit years follow the SSW practice (00-49 are
        20YY, 50-99 are 19YY), except in the FITS old format ``DD/MM/YY`` (a date only,
        with ``TIME-OBS``; see :func:`fix_header`) where they mean 19YY (FITS 4.0 sect. 9.1.1).

    Returns
    -------
    astropy.time.Time
        In the UTC scale.

    Raises
    ------
    ValueError
        If the string matches no known format.
    """
    return _parse_date(value)[0]


def exposure_seconds(header: fits.Header) -> float:
    """The exposure time [s] of a frame: the first of :data:`EXPOSURE_KEYWORDS` that is set.

    The one reader of the exposure, used by ingest and by calibration alike.

    Raises
    ------
    DataError
        If none is set, or the value is not a positive finite number.
    """
    for key in EXPOSURE_KEYWORDS:
        value = header.get(key)
        if _is_missing(value):
            continue
        try:
            t = float(value)
        except (TypeError, ValueError):
            raise DataError(f"{key} = {value!r} is not a number of seconds") from None
        if not math.isfinite(t) or t <= 0:
            raise DataError(f"{key} must be a positive number of seconds, got {t}")
        return t
    raise DataError("no usable exposure time (EXPTIME, XPOSURE or EXPOSURE keyword)")


def add_observer_keywords(header: fits.Header, when: Time) -> list[str]:
    """Fill whichever of ``HGLN_OBS``, ``HGLT_OBS``, ``DSUN_OBS`` is missing from Earth at ``when``.

    Keywords the header gives are kept. Earth's centre is the default observer for ASO-S
    (low Earth orbit, < 7000 km from the geocentre; LST.md). Uses
    ``sunpy.coordinates.get_earth``.

    Returns
    -------
    list of str
        One repair text per keyword filled (empty if none was).
    """
    missing = [k for k in ("HGLN_OBS", "HGLT_OBS", "DSUN_OBS") if _is_missing(header.get(k))]
    if not missing:
        return []
    from sunpy.coordinates import get_earth

    earth = get_earth(when)
    values = {"HGLN_OBS": (float(earth.lon.to_value("deg")), "[deg] observer Stonyhurst lon (Earth)"),
              "HGLT_OBS": (float(earth.lat.to_value("deg")), "[deg] observer Stonyhurst lat (Earth)"),
              "DSUN_OBS": (float(earth.radius.to_value("m")), "[m] observer-Sun distance (Earth)")}
    fixes = []
    for key in missing:
        header[key] = values[key]
        fixes.append(f"{key} missing: {values[key][0]:.6g} from Earth's centre at DATE-OBS "
                     "(default observer for ASO-S, in low Earth orbit)")
    return fixes


def _observation_date(header: fits.Header) -> tuple[Time, list[str]]:
    """The observation time from the first of :data:`DATE_KEYWORDS` that parses, with its repairs."""
    time_obs = header.get("TIME-OBS")
    given = [(k, header.get(k)) for k in DATE_KEYWORDS if not _is_missing(header.get(k))]
    if not given:
        raise FitsReadError("no DATE-OBS (nor DATE_OBS, DATE-BEG, DATE-AVG) keyword with a value")
    errors = []
    for key, value in given:
        try:
            t, note = _parse_date(str(value), time_obs)
        except ValueError as exc:
            errors.append((key, value, str(exc)))
            continue
        fixes = [f"{k} {v!r} does not parse ({why}); {key} used" for k, v, why in errors]
        if note:
            fixes.append(f"{key} {str(value).strip()!r}: {note}")
        return t, fixes
    raise FitsReadError(errors[0][2] if len(errors) == 1 else
                        "no date keyword parses: " + "; ".join(f"{k} {v!r}" for k, v, _ in errors))


def _check_dsun(header: fits.Header) -> list[str]:
    """``DSUN_OBS`` of an ASO-S frame given in km converted to m; an implausible one refused.

    Only for ASO-S (``TELESCOP``) frames: the range is that of an Earth-orbit observer, and
    the reader also reads other missions' files (the simulator's scenes, e.g. PSP/WISPR at
    0.1 au)."""
    value = header.get("DSUN_OBS")
    if _is_missing(value) or not str(header.get("TELESCOP", "")).strip().upper().startswith("ASO-S"):
        return []
    try:
        d = float(value)
    except (TypeError, ValueError):
        raise FitsReadError(f"DSUN_OBS = {value!r} is not a number") from None
    lo, hi = DSUN_RANGE_M
    if lo <= d <= hi:
        return []
    if lo <= d * 1000.0 <= hi:
        header["DSUN_OBS"] = (d * 1000.0, "[m] observer-Sun distance (given in km, x1000)")
        return [f"DSUN_OBS {d:.6g} is in km, not m: x1000 -> {d * 1000.0:.6g} m"]
    raise FitsReadError(f"implausible DSUN_OBS {d:.6g} m (an Earth-orbit observer is {lo:.2g}..{hi:.2g} m from the Sun)")


def fix_header(header: fits.Header, prior: list[str] | tuple[str, ...] = ()) -> tuple[fits.Header, list[str]]:
    """Repair the known quirks of a header in place and apply the reader's defaults.

    Each repair and each default is returned and also written as a ``HISTORY`` card
    (``read_image: ...``), so that the products made from the frame carry it. ``prior``:
    repairs made before the header was parsed (:func:`read_image`), returned and written first.

    Returns
    -------
    header : astropy.io.fits.Header
        The same object, repaired.
    fixes : list of str
        One short text per repair or default.

    Raises
    ------
    FitsReadError
        If there is no usable date, or ``DSUN_OBS`` is implausible.
    """
    t, fixes = _observation_date(header)
    fixes = [*prior, *fixes]
    iso = t.isot
    raw_date = header.get("DATE-OBS")
    if _is_missing(raw_date) or str(raw_date).strip() != iso:
        shown = "missing" if _is_missing(raw_date) else repr(str(raw_date).strip())
        fixes.append(f"DATE-OBS {shown} -> {iso}")
    header["DATE-OBS"] = iso
    helioprojective = False
    for axis, ctype in (("1", "HPLN-TAN"), ("2", "HPLT-TAN")):
        c = str(header.get(f"CTYPE{axis}", "")).strip().lower()
        if c in ("solar_x", "solar-x", "solarx", "solar_y", "solar-y", "solary"):
            header[f"CTYPE{axis}"] = ctype
            fixes.append(f"CTYPE{axis} {c!r} -> {ctype}")
            c = ctype.lower()
        helioprojective |= c.startswith(("hpln", "hplt"))
        u = str(header.get(f"CUNIT{axis}", "")).strip().lower()
        if u in ("arcsecs", "arcsec.", "arcseconds"):
            header[f"CUNIT{axis}"] = "arcsec"
            fixes.append(f"CUNIT{axis} {u!r} -> arcsec")
        elif not u and c.startswith(("hpln", "hplt")):
            header[f"CUNIT{axis}"] = "arcsec"
            fixes.append(f"CUNIT{axis} missing: arcsec assumed (ASO-S practice; the FITS default would be deg)")
    if helioprojective and not any(k in header for k in ("CROTA2", "CROTA", "PC1_1", "PC1_2", "PC2_1", "PC2_2",
                                                           "CD1_1", "CD1_2", "CD2_1", "CD2_2")):
        fixes.append("no CROTA2 nor PCi_j/CDi_j: roll 0 assumed (image rows along solar west)")
    fixes += _check_dsun(header)
    fixes += add_observer_keywords(header, t)
    for f in fixes:
        header.add_history(f"read_image: {f}")
    return header, fixes


#: HISTORY cards of a raw primary header read [cards]: the first ``HISTORY_KEEP`` and the last
#: ``HISTORY_KEEP``; the others are counted, not parsed (a choice: real raw frames carry tens,
#: one pathological file 20,000, which made ingest take 19 s and the frame's row 1.3 MB).
HISTORY_KEEP = 20

_CARD = 80
_BLOCK = 2880
_END_CARD = b"END" + b" " * 77
#: A legal keyword name (FITS standard 4.0 sect. 4.1.2.1: A-Z, 0-9, '-' and '_', at most 8).
_LEGAL_KEYWORD = re.compile(r"^[A-Z0-9_-]{0,8}$")


_END_ROW = np.frombuffer(_END_CARD, np.uint8)
_HISTORY_KEY = np.frombuffer(b"HISTORY ", np.uint8)
_SCAN_BLOCKS = 64  # blocks read at a time while looking for END (184 kB)


def _primary_header_cards(f: BinaryIO) -> tuple[np.ndarray, bytes] | None:
    """The cards of the primary header read from ``f`` before its END card, as an (n, 80)
    uint8 array, and the bytes read past the header's last block; None if ``f`` is not a FITS
    file or ends inside its header."""
    parts = []
    while True:
        chunk = f.read(_BLOCK * _SCAN_BLOCKS)
        if len(chunk) < _BLOCK or (not parts and not chunk.startswith(b"SIMPLE  =")):
            return None
        usable = len(chunk) - len(chunk) % _BLOCK
        cards = np.frombuffer(chunk, np.uint8, count=usable).reshape(-1, _CARD)
        end = np.flatnonzero((cards == _END_ROW).all(axis=1))
        if end.size:
            e = int(end[0])
            parts.append(cards[:e])
            last = (e // (_BLOCK // _CARD) + 1) * _BLOCK  # the end of END's block
            return np.concatenate(parts), chunk[last:]
        if usable < len(chunk):
            return None
        parts.append(cards)


def bounded_fits_source(path: str | os.PathLike, keep: int = HISTORY_KEEP) -> tuple[io.BytesIO | None, int]:
    """The file with its primary header's HISTORY cards bounded, for :func:`astropy.io.fits.open`.

    The primary header is scanned as bytes (80-byte cards in 2880-byte blocks, FITS 4.0
    sect. 3.3 and 4.1; NumPy compares the cards' first 8 bytes): when it holds more than
    ``2 * keep`` HISTORY cards, the first and last ``keep`` are kept and the others left out,
    so astropy parses, verifies and copies a bounded header whatever the raw file carries.
    The data and any extensions follow unchanged (FITS has no absolute offsets). Plain and
    gzip files are read this way; other files are left to astropy.

    Parameters
    ----------
    path : path-like
        A FITS file (``.fits``, ``.fits.gz``).
    keep : int
        HISTORY cards kept at each end (default :data:`HISTORY_KEEP`).

    Returns
    -------
    source : io.BytesIO or None
        The bounded file in memory; None when nothing was left out (open ``path`` itself).
    history_cards : int
        HISTORY cards in the raw primary header (0 if it could not be scanned).

    Notes
    -----
    A ``CHECKSUM`` of the primary HDU covers the cards left out: verify it on the file
    itself (:func:`verify_checksums`), not on this source.
    """
    p = Path(path)
    with open(p, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    try:
        with opener(p, "rb") as f:
            scanned = _primary_header_cards(f)
            if scanned is None:
                return None, 0
            cards, past = scanned
            history = np.flatnonzero((cards[:, :8] == _HISTORY_KEY).all(axis=1))
            if history.size <= 2 * keep:
                return None, int(history.size)
            kept = np.ones(len(cards), bool)
            kept[history[keep:history.size - keep]] = False
            head = cards[kept].tobytes() + _END_CARD
            head += b" " * (-len(head) % _BLOCK)
            return io.BytesIO(head + past + f.read()), int(history.size)
    except (OSError, EOFError):  # not gzip after all, truncated: astropy gives the reason
        return None, 0


def read_primary_header(path: str | os.PathLike) -> fits.Header:
    """The primary header of a FITS file, its HISTORY bounded as :func:`bounded_fits_source` does.

    Raises
    ------
    OSError, ValueError
        From astropy, for a file that is not FITS.
    """
    source, _ = bounded_fits_source(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fits.open(source or path, memmap=False) as hdul:
            return hdul[0].header


def repair_keyword_names(header: fits.Header) -> list[str]:
    """Rename the cards of ``header`` whose keyword name the FITS standard forbids, in place.

    astropy reads such a card (``P.I.    = 'Latham  '``, astropy/astropy#887) but its
    ``verify('silentfix')`` calls it unfixable and raises ``VerifyError``. Each illegal
    character becomes ``_`` (``P.I.`` -> ``P_I_``); the value and comment are kept, in the
    same place. A name that would clash with a keyword present, or that is empty, keeps the
    card's text as a ``COMMENT`` card instead. HIERARCH, commentary and record-valued cards
    are legal and left alone.

    Returns
    -------
    list of str
        One repair text per card (empty if none).
    """
    fixes = []
    for i, card in reversed(list(enumerate(header.cards))):  # from the end: a COMMENT may take two cards
        image = card.image
        name = image[:8].strip().upper()
        if not name or image.startswith("HIERARCH") or _LEGAL_KEYWORD.match(name):
            continue
        legal = re.sub(r"[^A-Z0-9_-]", "_", name)[:8]
        rule = "FITS 4.0 sect. 4.1.2.1 allows A-Z, 0-9, '-' and '_'"
        del header[i]
        if legal.strip("_") and legal not in header:
            try:
                value, comment = card.value, card.comment
            except (ValueError, fits.VerifyError):
                value = None
            if value is not None:
                header.insert(i, (legal, value, comment))
                fixes.append(f"illegal keyword name {name!r} ({rule}) renamed {legal}, value kept")
                continue
        header.insert(i, ("COMMENT", image.rstrip()))
        fixes.append(f"illegal keyword name {name!r} ({rule}): its card kept as a COMMENT")
    return fixes[::-1]


def _verify_reason(exc: fits.VerifyError) -> str:
    """The first message of an astropy ``VerifyError`` (its text starts with a blank line and a
    'Verification reported errors:' title), on one line."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    useful = [ln for ln in lines if ln and not ln.startswith(("Verification reported", "Note:", "HDU ", "Card "))]
    return (useful[0] if useful else type(exc).__name__).removeprefix("Unfixable error: ")


@dataclass
class RawImage:
    """A FITS image as read: data (NaNs kept, float64 after BSCALE/BZERO), repaired header."""

    data: np.ndarray
    header: fits.Header
    hdu_index: int
    fixes: list[str]
    date_obs: Time
    nan_fraction: float
    #: HISTORY cards in the raw primary header (all of them, also those not read).
    history_cards: int = 0


def verify_checksums(path: str | os.PathLike) -> int:
    """Verify ``CHECKSUM``/``DATASUM`` of every HDU of a file that carries them.

    Every HDU is loaded (astropy verifies an extension only when it is loaded), and a
    tile-compressed HDU is checked as the binary table it is stored as (its keywords are
    there; they cover every stored byte, the heap included). ``ZHECKSUM``/``ZDATASUM`` (the
    sums of the uncompressed image, which some writers add; astropy 8 and
    :mod:`pipelines.compression` do not) are not recomputed: a change of the stored bytes
    already fails ``DATASUM``. An HDU without the keywords has nothing to verify.

    Returns
    -------
    int
        How many HDUs carried a checksum or datasum (all verified).

    Raises
    ------
    FitsReadError
        ``DATASUM mismatch in HDU n (name)`` or ``CHECKSUM mismatch in HDU n (name)``
        (``n`` counts from 0, the primary HDU).
    """
    checked = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fits.open(path, memmap=False, checksum=True, disable_image_compression=True) as hdul:
            for n, hdu in enumerate(hdul):
                name = hdu.name or ("PRIMARY" if n == 0 else "")
                has_data_sum = str(hdu.header.get("DATASUM", "")).strip() != ""
                has_sum = str(hdu.header.get("CHECKSUM", "")).strip() != ""
                if has_data_sum and not getattr(hdu, "_datasum_valid", True):
                    raise FitsReadError(f"DATASUM mismatch in HDU {n} ({name}): the data are not what was written")
                if has_sum and not getattr(hdu, "_checksum_valid", True):
                    raise FitsReadError(f"CHECKSUM mismatch in HDU {n} ({name}): the HDU is not what was written")
                checked += has_data_sum or has_sum
    return checked


def _first_image_hdu(hdul: fits.HDUList) -> int:
    for i, hdu in enumerate(hdul):
        if isinstance(hdu, (fits.PrimaryHDU, fits.ImageHDU, fits.CompImageHDU)) and hdu.header.get("NAXIS", 0) >= 2:
            return i
    raise FitsReadError("no 2-D image HDU in the file")


#: What :func:`read_image_stored` reads as stored: FITS pseudo-unsigned 16-bit integers
#: (``BITPIX = 16``, ``BZERO = 32768``, ``BSCALE = 1``, no ``BLANK``; FITS 4.0, sect. 5.2.5,
#: table 11), how LST's raw frames and the simulator's are written.
STORED_UINT16 = {"BITPIX": 16, "BZERO": 32768, "BSCALE": 1}


@dataclass
class StoredImage:
    """A raw frame as its file stores it (:func:`read_image_stored`): no conversion on the host.

    Attributes
    ----------
    stored : numpy.ndarray of uint16, shape (ny, nx)
        The data unit's 16-bit words in file order (big-endian two's complement, before
        ``BZERO``), viewed as uint16: 2 bytes a pixel, half a float32 frame.
        :func:`pipelines.calibration.l2.device.decode_stored` turns them into the DN that
        :func:`read_image` returns (``float32(word byteswapped XOR 0x8000)``), on whichever
        array module holds them.
    header, hdu_index, fixes, date_obs, history_cards
        As :class:`RawImage` (the same header, card for card).
    sums : StoredSums or None
        With ``defer_sums``: the file's ``CHECKSUM``/``DATASUM``, still to be checked against
        the data sum of ``stored`` (:meth:`StoredSums.check`); ``None`` when they were
        verified on the host or the file has none.
    """

    stored: np.ndarray
    header: fits.Header
    hdu_index: int
    fixes: list[str]
    date_obs: Time
    history_cards: int = 0
    sums: StoredSums | None = None


class StoredSums:
    """A single-HDU file's ``DATASUM`` and ``CHECKSUM``, verified later from the data's sum.

    The data sum (the ones'-complement sum of the data unit's big-endian 32-bit words, FITS
    4.0 sect. 4.4.2.7) is what the device computes from the uploaded words
    (:func:`pipelines.calibration.l2.device.stored_datasum`); the header's part is
    astropy's own (``_calculate_checksum`` of the file's header as stored, not as repaired),
    so :meth:`check` accepts and refuses exactly what :func:`verify_checksums` does.
    """

    def __init__(self, hdu: Any):
        self._hdu = hdu  # header only (read from the closed file; no data loaded)
        h = hdu.header
        self.has_datasum = str(h.get("DATASUM", "")).strip() != ""
        self.has_checksum = str(h.get("CHECKSUM", "")).strip() != ""
        self.datasum = int(str(h["DATASUM"]).strip()) if self.has_datasum else None

    def check(self, datasum: int) -> None:
        """Raise :class:`~pipelines.errors.FitsReadError` (the messages of :func:`verify_checksums`)
        if ``datasum``, the data sum of the stored words, contradicts the file's keywords."""
        if self.has_datasum and int(datasum) != self.datasum:
            raise FitsReadError("DATASUM mismatch in HDU 0 (PRIMARY): the data are not what was written")
        if self.has_checksum:
            expected = self._hdu._calculate_checksum(int(datasum) if "DATASUM" in self._hdu.header else 0)
            if expected != self._hdu.header["CHECKSUM"]:
                raise FitsReadError("CHECKSUM mismatch in HDU 0 (PRIMARY): the HDU is not what was written")


def _deferred_sums(p: Path) -> StoredSums | None:
    """:class:`StoredSums` of ``p`` if its sums can be checked from the primary data alone
    (one HDU, an integer DATASUM), else None (verify on the host)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with fits.open(p, memmap=True, lazy_load_hdus=False) as hdul:
                if len(hdul) != 1 or not isinstance(hdul[0], fits.PrimaryHDU):
                    return None
                return StoredSums(hdul[0])
    except (OSError, TypeError, ValueError, KeyError):
        return None


def read_image_stored(path: str | os.PathLike, *, warn: bool = False, defer_sums: bool = False) -> StoredImage | None:
    """:func:`read_image` without the conversion: the stored 16-bit words and the repaired header.

    For a GPU host that uploads 2 bytes a pixel and converts on the device
    (:class:`pipelines.calibration.l2.batch.BatchExecutor`): the host neither byteswaps,
    nor scales, nor scans the frame for NaN (integers hold none). The header is the one
    :func:`read_image` returns, ``CHECKSUM``/``DATASUM`` are verified the same way: here on
    the host, or, with ``defer_sums`` and a single-HDU file, by the caller from the data's
    sum (``StoredImage.sums``: the batch executor sums the words on the device), so that
    the host does not read the frame twice.

    Returns
    -------
    StoredImage or None
        ``None`` when the image is not stored as :data:`STORED_UINT16` (other BITPIX or
        scaling, a ``BLANK`` value, a tile-compressed HDU): read it with :func:`read_image`.

    Raises
    ------
    FitsReadError
        As :func:`read_image`.
    """
    return read_image(path, warn=warn, dtype=np.float32, _stored=True, _defer_sums=defer_sums)


def read_image(path: str | os.PathLike, *, warn: bool = False, dtype: Any = np.float64,
               _stored: bool = False, _defer_sums: bool = False) -> RawImage:
    """Read the first 2-D image of a FITS file, repairing its header.

    ``CHECKSUM``/``DATASUM`` of every HDU that carries them are verified
    (:func:`verify_checksums`); a mismatch refuses the file.

    Parameters
    ----------
    path : path-like
        A ``.fits``/``.fts``/``.fits.gz`` file.
    warn : bool
        Emit a :class:`HeaderFixWarning` per repair (off by default: the repairs are
        returned in ``RawImage.fixes``).
    dtype : numpy dtype
        Floating type of the returned data (default float64). ``numpy.float32`` holds the
        16-bit DN of LST's raw frames exactly at half the memory (what the calibration
        workers use).

    Returns
    -------
    RawImage

    Raises
    ------
    FitsReadError
        With a one-line reason: not FITS, truncated, no image, bad date, ...
    """
    p = Path(path)
    if not p.is_file():
        raise FitsReadError(f"no such file: {p}")
    if p.stat().st_size == 0:
        raise FitsReadError("empty file")
    source, history_cards = bounded_fits_source(p)
    prior = []
    if source is not None:
        prior.append(f"{history_cards} HISTORY cards in the raw header: the first and last {HISTORY_KEEP} "
                     "read, the others left out (the raw file keeps them all)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with fits.open(source or p, memmap=False, do_not_scale_image_data=_stored) as hdul:
                for h in hdul:
                    prior += repair_keyword_names(h.header)
                hdul.verify("silentfix")
                # a file with no checksum keyword has nothing to verify: it is not parsed again
                sums = any(isinstance(h, fits.CompImageHDU)
                           or any(k in h.header for k in ("CHECKSUM", "DATASUM", "ZHECKSUM", "ZDATASUM"))
                           for h in hdul)
                idx = _first_image_hdu(hdul)
                hdu = hdul[idx]
                header = hdu.header  # the file is closed below: nothing else holds it
                if _stored and (isinstance(hdu, fits.CompImageHDU) or "BLANK" in header
                                or any(header.get(k) != v for k, v in STORED_UINT16.items())):
                    return None  # not pseudo-unsigned 16-bit: the caller reads it converted
                data = hdu.data
                if data is None:
                    raise FitsReadError("image HDU holds no data")
                if _stored:  # the words as stored (big-endian), viewed as uint16: no copy, no conversion
                    data = np.ascontiguousarray(data).view(np.uint16)
                else:
                    data = np.asarray(data, dtype=dtype)
    except FitsReadError:
        raise
    except fits.VerifyError as exc:  # what silentfix cannot repair: the real reason, on one line
        raise FitsReadError(f"FITS header does not verify: {_verify_reason(exc)}") from None
    except OSError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "SIMPLE" in msg or "Empty or corrupt" in msg or "header" in msg.lower():
            with open(p, "rb") as f:
                raw = f.read(24)
            if raw[:2] == b"\x1f\x8b":
                raise FitsReadError("a gzip file that does not decompress to a FITS file") from None
            head = raw.decode("ascii", "replace").split("\n")[0].strip()
            if raw.startswith(b"SIMPLE  ="):
                raise FitsReadError("not a FITS file: a FITS header saved as text (its cards are not "
                                    "80-character records in 2880-byte blocks, or no data follow)") from None
            raise FitsReadError(f"not a FITS file: no SIMPLE card, it starts with {head!r}") from None
        raise FitsReadError(f"unreadable FITS: {msg}") from None
    except (TypeError, ValueError, IndexError, EOFError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "buffer is too small" in msg or "cannot reshape" in msg:
            raise FitsReadError(
                f"truncated file: {p.stat().st_size} bytes, too short for the data unit its header declares"
            ) from None
        raise FitsReadError(f"unreadable FITS: {msg}") from None
    deferred = None
    try:
        if sums and _stored and _defer_sums and source is None:
            deferred = _deferred_sums(p)
        if sums and deferred is None:
            verify_checksums(p)
    except FitsReadError:
        raise
    except (OSError, TypeError, ValueError, IndexError, EOFError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FitsReadError(f"unreadable FITS (checksum verification): {msg}") from None
    if data.ndim != 2:
        if data.ndim == 3 and data.shape[0] == 1:
            data = data[0]
        else:
            raise FitsReadError(f"image has {data.ndim} dimensions, expected 2")
    if data.size == 0:
        raise FitsReadError("image has no pixels")
    header, fixes = fix_header(header, prior)
    if warn:
        for f in fixes:
            warnings.warn(f, HeaderFixWarning, stacklevel=2)
    if _stored:  # integers hold no NaN
        return StoredImage(stored=data, header=header, hdu_index=idx, fixes=fixes,
                           date_obs=Time(header["DATE-OBS"], scale="utc"), history_cards=history_cards,
                           sums=deferred)
    nan_fraction = float(np.isnan(data).mean())
    if nan_fraction == 1.0:
        raise FitsReadError("every pixel is NaN")
    return RawImage(data=data, header=header, hdu_index=idx, fixes=fixes,
                    date_obs=Time(header["DATE-OBS"], scale="utc"), nan_fraction=nan_fraction,
                    history_cards=history_cards)


class PendingFile:
    """A file written and fsynced under a temporary name, not yet renamed to its own
    (:func:`write_atomic` with ``defer=True``): :meth:`commit` makes it the file, :meth:`discard`
    removes it. A writer thread prepares it; the thread that owns the product's claim
    commits it (``backend.worker.processing.write_product``)."""

    def __init__(self, tmp: Path, path: Path):
        self.tmp, self.path = tmp, path

    def commit(self) -> Path:
        """Rename the file to its path (readable by everyone the umask allows) and fsync the folder."""
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o666 & ~umask)  # mkstemp makes 0600; products are for every reader
        os.replace(self.tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return self.path

    def discard(self) -> None:
        """Remove the temporary file (nothing if committed or gone)."""
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None], *,
                 tmp_dir: str | os.PathLike | None = None, suffix: str = ".part", defer: bool = False) -> Any:
    """Write a file atomically: into a temporary file, fsynced, then renamed over ``path``.

    A crash never leaves a half-written file under the final name; the file is readable by
    everyone the umask allows (``mkstemp`` alone would make it 0600).

    Parameters
    ----------
    path : path-like
        The final file; its folder is created.
    write : callable
        ``write(f)`` writes the bytes to the open binary file ``f``.
    tmp_dir : path-like, optional
        Folder of the temporary file (created), e.g. :func:`store_tmp_dir` of the store:
        temporary files then never lie beside the products. It must be on the file system of
        ``path``. Default: ``path``'s folder, under a hidden name (:data:`PARTIAL_PATTERNS`).
    suffix : str
        End of the temporary file's name.
    defer : bool
        Stop before the rename: return a :class:`PendingFile` (written and fsynced) that the
        caller commits or discards.

    Returns
    -------
    pathlib.Path or PendingFile
        ``path``; with ``defer``, the pending file.

    Raises
    ------
    ValueError
        If ``tmp_dir`` is on another file system than ``path``'s folder (the rename would be
        a copy, not atomic); checked before anything is written.
    OSError
        From the writing; the temporary file is removed.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if tmp_dir is None:
        folder, prefix = p.parent, f".{p.name}."
    else:
        # the writer's host and pid in the name: a killed writer's file is known at once
        # (:func:`sweep_dead_writers`)
        folder, prefix = Path(tmp_dir), writer_prefix(p.name)
        folder.mkdir(parents=True, exist_ok=True)
        if os.stat(folder).st_dev != os.stat(p.parent).st_dev:
            raise ValueError(f"temporary folder {folder} is not on the file system of {p.parent}: "
                             "the rename would not be atomic")
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    pending = PendingFile(Path(tmp), p)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if defer:
            return pending
        pending.commit()
    except BaseException:
        pending.discard()
        raise
    return p


def write_fits_atomic(hdul: fits.HDUList, path: str | os.PathLike, *, checksum: bool = True,
                      tmp_dir: str | os.PathLike | None = None, hdu_digests: list[str] | None = None) -> str:
    """Write ``hdul`` to ``path`` atomically (:func:`write_atomic`) and return the file's SHA-256.

    ``CHECKSUM``/``DATASUM`` are added to every HDU (FITS standard 4.0, sect. 4.4.2.7).
    ``tmp_dir`` is where the temporary file lies during the write (default: beside ``path``
    under a hidden name); products give the store's :func:`store_tmp_dir`.
    ``hdu_digests``: a list that receives each HDU's data digest as the file is written
    (:func:`write_fits_lean`); left empty when the lean writer does not write ``hdul``.
    """
    sha, pending = write_fits_pending(hdul, path, checksum=checksum, tmp_dir=tmp_dir, hdu_digests=hdu_digests)
    try:
        pending.commit()
    except BaseException:
        pending.discard()
        raise
    return sha


def write_fits_pending(hdul: fits.HDUList, path: str | os.PathLike, *, checksum: bool = True,
                       tmp_dir: str | os.PathLike | None = None,
                       hdu_digests: list[str] | None = None) -> tuple[str, PendingFile]:
    """:func:`write_fits_atomic` up to the rename: ``(SHA-256 of the file, PendingFile)``."""
    if checksum and lean_writable(hdul):
        digest: list[str] = []

        def write(f: BinaryIO) -> None:
            if hdu_digests is not None:
                del hdu_digests[:]  # a retried write starts again
            digest.append(write_fits_lean(hdul, f, hdu_digests=hdu_digests))

        pending = write_atomic(path, write, tmp_dir=tmp_dir, defer=True)
        return digest[0], pending
    pending = write_atomic(path, lambda f: hdul.writeto(f, checksum=checksum, overwrite=True), tmp_dir=tmp_dir,
                           defer=True)
    try:
        return sha256_file(pending.tmp), pending
    except BaseException:
        pending.discard()
        raise


#: Bytes of each of the lean writer's byteswap buffers (4 MiB: a multiple of every item size and
#: of 4; small enough to stay in the L2/L3 caches while the chunk is written and hashed, on this
#: core or, with the hash thread, on the other).
_LEAN_CHUNK = 4 << 20

#: Byteswap buffers the lean writer rotates through when it hashes on a thread of its own: one
#: being filled, one being written and hashed, one spare so neither waits on the other's chunk.
_LEAN_BUFFERS = 3

#: Data bytes from which the lean writer hashes on a second thread (:class:`_ChunkHasher`),
#: beside the byteswap and the write: SHA-256 runs at about 1.8 GB/s on this project's 2-core
#: development machine (85 MB in 0.048 s, 2026-12-06), a third of a 4608 px product's write
#: time; below this (test-sized products) a thread costs more than it hides.
_LEAN_THREAD_BYTES = 16 << 20

#: dtypes the lean writer writes as they are (FITS BITPIX 8, 16, 32, -32, -64; no BZERO/BSCALE).
_LEAN_DTYPES = frozenset({"uint8", "int16", "int32", "float32", "float64"})


def lean_writable(hdul: fits.HDUList) -> bool:
    """Whether :func:`write_fits_lean` writes ``hdul``: every HDU a primary or image HDU whose
    data are a NumPy array (or None) of :data:`_LEAN_DTYPES`, without scaling keywords."""
    for hdu in hdul:
        if type(hdu) not in (fits.PrimaryHDU, fits.ImageHDU):
            return False
        if "BSCALE" in hdu.header or "BZERO" in hdu.header:
            return False
        data = hdu.data
        if data is None:
            continue
        if not isinstance(data, np.ndarray) or data.dtype.name not in _LEAN_DTYPES:
            return False
    return True


def _ones_complement_sum(words_u8: np.ndarray, native_u4: np.ndarray | None = None) -> int:
    """FITS ones'-complement 32-bit sum (Seaman et al., FITS checksum proposal; astropy's
    ``_compute_checksum``) of big-endian bytes ``words_u8``; ``native_u4``: the same words
    already as native uint32 values (a little-endian host's 4-byte data), summed without a copy."""
    if native_u4 is not None:
        s = int(np.add.reduce(native_u4.reshape(-1), dtype=np.uint64))
    else:
        extra = words_u8.size % 4
        s = 0
        if extra:
            s += int.from_bytes(bytes(words_u8[-extra:]) + b"\0" * (4 - extra), "big")
            words_u8 = words_u8[:-extra]
        s += int(words_u8.view(">u4").sum(dtype="u8"))
    while hi := (s >> 32):
        s = (s & 0xFFFFFFFF) + hi
    return s


class _ChunkHasher:
    """Feed byte chunks to hash objects in order, on a thread of its own or inline.

    ``update(chunk, hashes, buffer)`` hands ``chunk`` (bytes or a memoryview) to every hash of
    ``hashes``; with a thread, the call returns at once and ``hashlib`` (which releases the GIL on
    large updates) hashes while the caller byteswaps and writes the next chunk. ``buffer``: the
    index of the reused buffer that ``chunk`` views (or None): :meth:`claim` waits until the
    chunk that last used it has been hashed, before the caller overwrites it. :meth:`close`
    waits for everything and re-raises a hashing thread's error.
    """

    def __init__(self, threaded: bool, n_buffers: int) -> None:
        import queue
        import threading

        self._free = [threading.Event() for _ in range(n_buffers)]
        for e in self._free:
            e.set()
        self._error: BaseException | None = None
        self._queue: Any = queue.SimpleQueue() if threaded else None
        self._thread = None
        if threaded:
            self._thread = threading.Thread(target=self._run, name="fits-lean-hash", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            chunk, hashes, buffer = item
            try:
                if self._error is None:
                    for h in hashes:
                        h.update(chunk)
            except BaseException as e:  # noqa: BLE001 - re-raised by close() in the writer's thread
                self._error = e
            finally:
                if buffer is not None:
                    self._free[buffer].set()

    def claim(self, buffer: int) -> None:
        """Wait until buffer ``buffer`` may be overwritten."""
        self._free[buffer].wait()
        if self._thread is not None:
            self._free[buffer].clear()

    def release(self, buffer: int) -> None:
        """Buffer ``buffer`` claimed but not handed to :meth:`update`: free it."""
        self._free[buffer].set()

    def update(self, chunk, hashes, buffer: int | None = None) -> None:
        if self._thread is None:
            for h in hashes:
                h.update(chunk)
        else:
            self._queue.put((chunk, hashes, buffer))

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error


def write_fits_lean(hdul: fits.HDUList, f: BinaryIO, *, hdu_digests: list[str] | None = None) -> str:
    """Write ``hdul`` (:func:`lean_writable`) with ``CHECKSUM``/``DATASUM`` to the open binary
    file ``f``: the bytes of ``hdul.writeto(f, checksum=True)``, returning their hex SHA-256.

    Each data plane is byteswapped to big-endian once, chunk by chunk into a small buffer
    reused by every chunk and HDU (:data:`_LEAN_CHUNK`; three in turn with the hash thread below),
    and written from it; ``DATASUM`` is summed from the native words (a little-endian 4-byte
    word read natively is the big-endian word of the swapped bytes) or from the buffer, so
    astropy's byteswapped copy for the sum is not made; the SHA-256 is computed on the bytes
    as they are written (no re-reading of the file), on a second thread when the data reach
    :data:`_LEAN_THREAD_BYTES` (:class:`_ChunkHasher`; the byteswap then rotates through
    :data:`_LEAN_BUFFERS` buffers, so the hash and the write of one chunk overlap the byteswap
    of the next). Headers, ``CHECKSUM`` and the card
    comments are astropy's own (``add_checksum`` with the data sum given).
    ``tests/test_lean_writer.py`` compares the bytes with astropy's (both paths).

    ``hdu_digests``: a list to which the SHA-256 (hex) of each HDU's data is appended, in HDU
    order, as :func:`backend.services.manifests.hdu_digest` defines it (the big-endian bytes
    prefixed by dtype and shape), hashed from the same swapped chunks as they are written:
    the manifest's digests without a second byteswapped copy of the product.

    Raises
    ------
    ValueError
        If ``hdul`` is not :func:`lean_writable`.
    """
    if not lean_writable(hdul):
        raise ValueError("write_fits_lean writes primary/image HDUs of plain dtypes only")
    hdul.verify(option="exception")
    hdul.update_extend()
    sha = hashlib.sha256()
    little = sys.byteorder == "little"
    threaded = sum(h.data.nbytes for h in hdul if h.data is not None) >= _LEAN_THREAD_BYTES
    # the reused byteswap buffers (cache-sized, not a frame; one when hashing inline), made before
    # the hash thread starts: nothing between its start and the ``try`` that ends it can raise
    bufs = [np.empty(_LEAN_CHUNK, np.uint8) for _ in range(_LEAN_BUFFERS if threaded else 1)]
    turn = [0]

    def put(b, dig=None, buffer: int | None = None) -> None:
        f.write(b)
        hasher.update(b, (sha,) if dig is None else (sha, dig), buffer)

    def swapped_chunks(flat: np.ndarray):
        """``(index, bytes)``: big-endian bytes of ``flat`` (1-D, native, C-contiguous) chunk by
        chunk, in the rotating buffers (each claimed from the hasher before it is overwritten)."""
        be = flat.dtype.newbyteorder(">")
        per = _LEAN_CHUNK // flat.dtype.itemsize
        for i in range(0, flat.size, per):
            part = flat[i:i + per]
            k = turn[0] % len(bufs)
            turn[0] += 1
            hasher.claim(k)
            dst = bufs[k][:part.nbytes]
            np.copyto(dst.view(be), part)
            yield k, dst

    digs: list[tuple[list[str], Any]] = []  # (hdu_digests, its HDU's hash), read once all is hashed
    hasher = _ChunkHasher(threaded, len(bufs))  # put/swapped_chunks see it when they are called
    try:
        _write_lean_hdus(hdul, little, put, swapped_chunks, hasher, hdu_digests, digs)
    except BaseException:
        try:
            hasher.close()  # the thread ends (what it hashed is not used)
        except BaseException:  # noqa: BLE001 - the write's own error is the one to raise
            pass
        raise
    hasher.close()  # every chunk hashed (and a hashing error raised) before the digests are read
    for target, dig in digs:
        target.append(dig.hexdigest())
    return sha.hexdigest()


def _write_lean_hdus(hdul: fits.HDUList, little: bool, put: Callable, swapped_chunks: Callable,
                     hasher: _ChunkHasher, hdu_digests: list[str] | None, digs: list) -> None:
    """:func:`write_fits_lean`'s loop over the HDUs: DATASUM, header with CHECKSUM, data, padding."""
    for hdu in hdul:
        data = hdu.data
        raw = flat = None
        datasum = 0
        dig = None
        if hdu_digests is not None:
            if data is None:
                dig = hashlib.sha256(b"")
            else:
                dig = hashlib.sha256(f"{data.dtype.newbyteorder('>').str}{tuple(data.shape)}".encode())
        if data is not None and data.size:
            if data.dtype.itemsize == 1 or data.dtype.byteorder == ">" or (not little and data.dtype.isnative):
                raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)  # already big-endian bytes
                datasum = _ones_complement_sum(raw)
            else:
                flat = np.ascontiguousarray(data).reshape(-1)
                if flat.dtype.itemsize == 4:  # a native 4-byte word is the big-endian word of the swapped bytes
                    datasum = _ones_complement_sum(np.empty(0, np.uint8), flat.view(np.uint32))
                else:  # 2- and 8-byte words: sum the swapped chunks (each a whole number of 4-byte words but the last)
                    total = 0
                    for k, chunk in swapped_chunks(flat):
                        total += _ones_complement_sum(chunk)
                        hasher.release(k)  # summed, not hashed: free again at once
                    while hi := (total >> 32):
                        total = (total & 0xFFFFFFFF) + hi
                    datasum = total
        hdu._calculate_datasum = lambda ds=datasum: ds  # noqa: B023 (astropy's add_checksum asks for it)
        try:
            hdu._output_checksum = True
            hdu._prewriteto()
            try:
                put(hdu._header.tostring(sep="", endcard=True, padding=True).encode("ascii"))
                nbytes = 0
                if raw is not None:
                    put(memoryview(raw), dig)
                    nbytes = raw.nbytes
                elif flat is not None:
                    for k, chunk in swapped_chunks(flat):  # the one byteswap of this plane, chunk by chunk
                        put(memoryview(chunk), dig, k)
                    nbytes = flat.nbytes
                pad = (-nbytes) % 2880
                if nbytes and pad:
                    put(b"\0" * pad)
            finally:
                hdu._postwriteto()
        finally:
            del hdu._calculate_datasum
        if dig is not None:
            digs.append((hdu_digests, dig))


def utc_datetime(t: Time) -> dt.datetime:
    """An aware UTC ``datetime`` from an astropy ``Time``: :func:`pipelines.utc.datetime_from_time`.

    ``datetime`` has no second 60: a time inside a leap second (FITS 4.0 sect. 9.1.1 allows
    ``23:59:60.x`` in UTC) is stored in the last millisecond of 23:59:59, in order and distinct
    from the times around it; the header's ``DATE-OBS`` keeps the exact time."""
    return datetime_from_time(t)
