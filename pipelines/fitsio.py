"""One FITS reader that tolerates real headers' quirks, and one atomic FITS writer.

Reader quirks handled (all met in the project's real sample data):

* gzip files and tile-compressed HDUs (the first HDU with 2-D image data is used);
* ``BZERO``/``BSCALE`` scaled integers (astropy applies them) and ``BLANK`` on float data;
* non-ISO ``DATE-OBS`` (SSW ``01-May-23 13:07:58.713``, ``01/01/30, 02:58:23.429``,
  ``2007/05/03 10:20:18``, trailing ``Z``; ``DATE_OBS`` when ``DATE-OBS`` is missing);
* ``CTYPE = 'solar_x'/'solar_y'`` with ``CUNIT='arcsecs'`` (mapped to ``HPLN-TAN``/``HPLT-TAN``
  and ``arcsec``, as sunpy's ASO-S/HXI source does);
* missing observer keywords (``HGLN_OBS``, ``HGLT_OBS``, ``DSUN_OBS``): filled from Earth's
  ephemeris at DATE-OBS (ASO-S is in low Earth orbit, LST.md);
* NaN pixels (kept; counted by the caller).

Every refusal raises :class:`~pipelines.errors.FitsReadError` with a one-line reason.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from astropy.io import fits
from astropy.time import Time

from pipelines.errors import FitsReadError, HeaderFixWarning

__all__ = [
    "RawImage",
    "read_image",
    "parse_date_obs",
    "fix_header",
    "add_observer_keywords",
    "write_fits_atomic",
    "sha256_file",
]

_MONTHS = {m: i for i, m in enumerate(
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], start=1)}
_SSW_DMY = re.compile(r"^\s*(\d{1,2})-([A-Za-z]{3})-(\d{2}|\d{4})[ T]+(\d{1,2}):(\d{2}):(\d{2}(?:\.\d*)?)\s*$")
_YMD_SLASH = re.compile(r"^\s*(\d{2}|\d{4})/(\d{1,2})/(\d{1,2})[,\sT]+(\d{1,2}):(\d{2}):(\d{2}(?:\.\d*)?)\s*$")


def _century(yy: str) -> int:
    y = int(yy)
    if len(yy) == 4:
        return y
    # SSW convention: two-digit years 50-99 are 1950-1999, 00-49 are 2000-2049
    return 1900 + y if y >= 50 else 2000 + y


def parse_date_obs(value: str) -> Time:
    """Parse a DATE-OBS string in any of the formats met in solar FITS files.

    Parameters
    ----------
    value : str
        ISO 8601 (with or without ``Z``), SSW ``DD-Mon-YY hh:mm:ss.sss`` or
        ``YY/MM/DD, hh:mm:ss.sss``.

    Returns
    -------
    astropy.time.Time
        In the UTC scale.

    Raises
    ------
    ValueError
        If the string matches no known format.
    """
    s = str(value).strip()
    m = _SSW_DMY.match(s)
    if m:
        d, mon, yy, hh, mm, ss = m.groups()
        if mon.upper() not in _MONTHS:
            raise ValueError(f"unknown month in DATE-OBS {value!r}")
        iso = f"{_century(yy):04d}-{_MONTHS[mon.upper()]:02d}-{int(d):02d}T{int(hh):02d}:{mm}:{ss}"
        return Time(iso, format="isot", scale="utc")
    m = _YMD_SLASH.match(s)
    if m:
        yy, mo, d, hh, mm, ss = m.groups()
        iso = f"{_century(yy):04d}-{int(mo):02d}-{int(d):02d}T{int(hh):02d}:{mm}:{ss}"
        return Time(iso, format="isot", scale="utc")
    if re.search(r"[T ]\d{1,2}:\d{2}(:\d{2}(\.\d*)?)?[+-]\d{2}:?\d{2}$", s):  # ISO with a UTC offset
        try:
            when = dt.datetime.fromisoformat(s).astimezone(dt.UTC).replace(tzinfo=None)
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"unrecognised DATE-OBS {value!r}") from exc
        return Time(when, scale="utc")
    s = s.rstrip("Zz").replace(" ", "T", 1) if "T" not in s else s.rstrip("Zz")
    try:
        return Time(s, scale="utc")
    except ValueError as exc:
        raise ValueError(f"unrecognised DATE-OBS {value!r}") from exc


def add_observer_keywords(header: fits.Header, when: Time) -> bool:
    """Fill ``HGLN_OBS``, ``HGLT_OBS``, ``DSUN_OBS``, ``RSUN_REF`` from Earth at ``when``.

    Returns True if any keyword was added. Earth is the right default observer for ASO-S
    (low Earth orbit; LST.md). Uses ``sunpy.coordinates.get_earth``.
    """
    if all(k in header for k in ("HGLN_OBS", "HGLT_OBS", "DSUN_OBS")):
        return False
    from sunpy.coordinates import get_earth

    earth = get_earth(when)
    header["HGLN_OBS"] = (float(earth.lon.to_value("deg")), "[deg] observer Stonyhurst lon (Earth)")
    header["HGLT_OBS"] = (float(earth.lat.to_value("deg")), "[deg] observer Stonyhurst lat (Earth)")
    header["DSUN_OBS"] = (float(earth.radius.to_value("m")), "[m] observer-Sun distance (Earth)")
    return True


def fix_header(header: fits.Header) -> tuple[fits.Header, list[str]]:
    """Repair the known quirks of a header in place.

    Returns
    -------
    header : astropy.io.fits.Header
        The same object, repaired.
    fixes : list of str
        One short text per repair (also written as HISTORY by the caller if it wishes).

    Raises
    ------
    FitsReadError
        If there is no usable DATE-OBS.
    """
    fixes: list[str] = []
    raw_date = header.get("DATE-OBS") or header.get("DATE_OBS") or header.get("DATE_BEG")
    if raw_date is None and header.get("DATE-OBS") is None:
        raise FitsReadError("no DATE-OBS (nor DATE_OBS) keyword")
    try:
        t = parse_date_obs(str(raw_date))
    except ValueError as exc:
        raise FitsReadError(str(exc)) from None
    iso = t.isot
    if str(raw_date).strip() != iso:
        fixes.append(f"DATE-OBS {str(raw_date).strip()!r} -> {iso}")
    header["DATE-OBS"] = iso
    for axis, ctype in (("1", "HPLN-TAN"), ("2", "HPLT-TAN")):
        c = str(header.get(f"CTYPE{axis}", "")).strip().lower()
        if c in ("solar_x", "solar-x", "solarx", "solar_y", "solar-y", "solary"):
            header[f"CTYPE{axis}"] = ctype
            fixes.append(f"CTYPE{axis} {c!r} -> {ctype}")
        u = str(header.get(f"CUNIT{axis}", "")).strip().lower()
        if u in ("arcsecs", "arcsec.", "arcseconds"):
            header[f"CUNIT{axis}"] = "arcsec"
            fixes.append(f"CUNIT{axis} {u!r} -> arcsec")
    if add_observer_keywords(header, t):
        fixes.append("observer keywords from Earth's ephemeris")
    return header, fixes


@dataclass
class RawImage:
    """A FITS image as read: data (NaNs kept, float64 after BSCALE/BZERO), repaired header."""

    data: np.ndarray
    header: fits.Header
    hdu_index: int
    fixes: list[str]
    date_obs: Time
    nan_fraction: float


def _first_image_hdu(hdul: fits.HDUList) -> int:
    for i, hdu in enumerate(hdul):
        if isinstance(hdu, (fits.PrimaryHDU, fits.ImageHDU, fits.CompImageHDU)) and hdu.header.get("NAXIS", 0) >= 2:
            return i
    raise FitsReadError("no 2-D image HDU in the file")


def read_image(path: str | os.PathLike, *, warn: bool = False, dtype: Any = np.float64) -> RawImage:
    """Read the first 2-D image of a FITS file, repairing its header.

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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with fits.open(p, memmap=False) as hdul:
                hdul.verify("silentfix")
                idx = _first_image_hdu(hdul)
                hdu = hdul[idx]
                header = hdu.header.copy()
                data = hdu.data
                if data is None:
                    raise FitsReadError("image HDU holds no data")
                data = np.asarray(data, dtype=dtype)
    except FitsReadError:
        raise
    except OSError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "SIMPLE" in msg or "Empty or corrupt" in msg or "header" in msg.lower():
            with open(p, "rb") as f:
                raw = f.read(24)
            if raw[:2] == b"\x1f\x8b":
                raise FitsReadError("a gzip file that does not decompress to a FITS file") from None
            head = raw.decode("ascii", "replace").split("\n")[0].strip()
            raise FitsReadError(f"not a FITS file: no SIMPLE card, it starts with {head!r}") from None
        raise FitsReadError(f"unreadable FITS: {msg}") from None
    except (TypeError, ValueError, IndexError, EOFError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "buffer is too small" in msg or "cannot reshape" in msg:
            raise FitsReadError(
                f"truncated file: {p.stat().st_size} bytes, too short for the data unit its header declares"
            ) from None
        raise FitsReadError(f"unreadable FITS: {msg}") from None
    if data.ndim != 2:
        if data.ndim == 3 and data.shape[0] == 1:
            data = data[0]
        else:
            raise FitsReadError(f"image has {data.ndim} dimensions, expected 2")
    if data.size == 0:
        raise FitsReadError("image has no pixels")
    header, fixes = fix_header(header)
    if warn:
        for f in fixes:
            warnings.warn(f, HeaderFixWarning, stacklevel=2)
    nan_fraction = float(np.isnan(data).mean())
    if nan_fraction == 1.0:
        raise FitsReadError("every pixel is NaN")
    return RawImage(data=data, header=header, hdu_index=idx, fixes=fixes,
                    date_obs=Time(header["DATE-OBS"], scale="utc"), nan_fraction=nan_fraction)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def write_fits_atomic(hdul: fits.HDUList, path: str | os.PathLike, *, checksum: bool = True) -> str:
    """Write ``hdul`` to ``path`` atomically and return the file's SHA-256.

    The file is written under a temporary name in the same folder, flushed and fsynced,
    then renamed over ``path``: a crash never leaves a half-written file under the final
    name. ``CHECKSUM``/``DATASUM`` are added to every HDU (FITS standard 4.0, sect. 4.4.2.7).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".part", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            hdul.writeto(f, checksum=checksum, overwrite=True)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; products are for every reader
        os.replace(tmp, p)
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return sha256_file(p)


def utc_datetime(t: Time) -> dt.datetime:
    """An aware UTC ``datetime`` from an astropy ``Time``.

    ``datetime`` has no second 60: a time inside a leap second is carried into the next
    second (astropy's ``leap_second_strict='silent'``)."""
    return t.utc.to_datetime(timezone=dt.UTC, leap_second_strict="silent")
