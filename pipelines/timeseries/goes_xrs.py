"""GOES XRS (X-Ray Sensor) irradiance time series: one reader for the layouts NOAA and the SDAC publish.

:func:`read_goes_xrs` reads a file with ``sunpy.timeseries.TimeSeries(path, source='XRS')``
and returns an :class:`XRSSeries`: the sample times as an astropy ``Time`` (UTC, leap seconds
kept), the 1-8 Å (XRS-B) and 0.5-4 Å (XRS-A) fluxes in W m-2 with every unusable sample a
NaN (a gap, never a value), and the per-sample quality words as the file gives them.

Layouts (``XRSSeries.layout``)
    ``goes13-15-irrad``  GOES 13-15 reprocessed high-resolution irradiances (``sci_gxrs-l2-irrad``,
                          2.048 s; ``a_flux``/``b_flux``, ``a_flags``/``b_flags``; time in seconds
                          since 1970-01-01 UTC).
    ``goes13-15-avg1m``  GOES 13-15 reprocessed 1-min averages (``sci_xrsf-l2-avg1m_g13..15``;
                          ``xrsa_flux``, ``xrsa_flag``).
    ``goes-r-avg1m``     GOES-R (16, 17, 18) L2 1-min averages (``sci_xrsf-l2-avg1m_g16..``).
    ``goes-r-flx1s``     GOES-R L2 1-s fluxes (``sci_xrsf-l2-flx1s``; ``xrsa_flags``).
    ``sdac-fits``        the older SDAC/GSFC FITS files (``go15YYYYMMDD.fits``: FLUXES table of
                          TIME and FLUX, no per-sample flag).

Which samples are gaps
    * the flux equals the variable's ``_FillValue`` (-9999 in GOES-R and avg1m files, -99999 in
      the irradiance files and the SDAC FITS, whose FLUXES header says "Flux value of -99999.0
      means no data"), is not finite, or is zero or negative (not a measurable irradiance; a
      log axis cannot draw it), or is above the variable's ``valid_max``;
    * the sample's quality word fails the file's own ``good_data`` rule. Every netCDF layout
      above declares its flags with the CF attributes ``flag_meanings``/``flag_masks``/
      ``flag_values``; the entry named ``good_data`` gives a mask ``m`` and a value ``v``, and a
      sample is good when ``flag & m == v``. That is: irradiance files (mask 1023) and 1-s
      GOES-R fluxes (mask 65535) accept only 0 (any of calibration, off_pointed, eclipse,
      temperature_recovery, spike, unknown_bad_data, saturated, gain_state_change,
      particle_spike, ... makes a gap); the 1-min averages accept any word whose low bits
      (GOES 13-15: mask 7 = bad_data, eclipsed_by_earth, temperature_recovery; GOES-R: mask 3
      = eclipse, bad_data) are clear, because the files say "good_data is independent of
      electron contamination flags" (the electron-correction bits ride along in the stored
      quality word). A flag equal to its ``_FillValue`` (flag missing) is a gap too. Sources:
      the files' own flag attributes, and NOAA NCEI, *GOES-R Series XRS L2 Products User Guide*
      and *GOES 1-15 XRS reprocessed science-quality data* ReadMe (flag definitions as in the
      files). The SDAC FITS has no per-sample flag (its STATUS table holds file-level status
      words, kept in ``XRSSeries.notes`` when non-zero): only fill values make gaps there.
    * Not gaps: values at a file's lower limit (1e-9 W m-2: the ``valid_min`` of the 1-min
      averages, and the floor the SDAC FITS clips a quiet XRS-A channel to, 78 % of the XRS-A
      samples of 2011-06-07) are kept as the files give them, as sunpy does; a curve that sits
      on 1e-9 is at that floor, not measured there.

Times and leap seconds
    The netCDF ``time`` variables count seconds from an epoch in POSIX style (GOES-R: "Record
    start time, neglecting leap seconds"; GOES 13-15: "seconds since 1970-01-01 00:00:00.0
    UTC"); astropy's ``unix`` format is that count and places a sample taken during an inserted
    leap second at ``23:59:60.xxx`` UTC. sunpy rounds such a sample to ``23:59:59.999`` (it
    converts to Python ``datetime``, which has no leap second), which would shift it by up to a
    second and can put it before the sample it follows; this reader keeps sunpy's values and
    flags but takes the times from the file through astropy ``Time`` (scale ``utc``), so times
    stay strictly increasing in TAI and no sample is shifted or duplicated. sunpy's times are
    checked against these (they agree to 1 ms except at a leap second).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from astropy.time import Time

from pipelines.errors import DataError

__all__ = ["XRSSeries", "XRSReadError", "read_goes_xrs", "GOOD_RULE"]


class XRSReadError(DataError):
    """A file is not a readable GOES XRS time series (the message says why, in one line)."""


#: How the quality words were judged, one line per layout (stored with each series).
GOOD_RULE = {
    "goes13-15-irrad": "good when flag & 1023 == 0 (file's good_data flag); fill, <= 0 or > valid_max flux is a gap",
    "goes13-15-avg1m": "good when flag & 7 == 0 (file's good_data; electron-correction bits ignored as the file says); "
                       "fill, <= 0 or > valid_max flux is a gap",
    "goes-r-avg1m": "good when flag & 3 == 0 (file's good_data; electron-contamination bits ignored as the file says); "
                    "fill, <= 0 or > valid_max flux is a gap",
    "goes-r-flx1s": "good when flag & 65535 == 0 (file's good_data flag); fill, <= 0 or > valid_max flux is a gap",
    "sdac-fits": "no per-sample flag in this layout; -99999 (no data), <= 0 or non-finite flux is a gap",
}

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_FITS_MAGIC = b"SIMPLE  ="


@dataclass
class XRSSeries:
    """One GOES XRS file as read: times, fluxes (NaN = gap) and quality words.

    Attributes
    ----------
    satellite : str
        ``GOES-13`` .. ``GOES-18``.
    layout : str
        One of the layouts of the module docstring.
    time : astropy.time.Time, shape (n,)
        Sample times, scale ``utc`` (a leap second reads ``23:59:60.xxx``), strictly increasing.
    xrsa, xrsb : numpy.ndarray of float64, shape (n,)
        XRS-A (0.5-4 Å) and XRS-B (1-8 Å) flux [W m-2]; NaN where the sample is a gap.
    xrsa_quality, xrsb_quality : numpy.ndarray of int64, shape (n,)
        The files' quality words as stored (-1: the layout has none, or the flag is missing).
    cadence_s : float
        Median spacing of the samples [s] (TAI seconds, so a leap second does not distort it).
    quality_rule : str
        How samples were judged (:data:`GOOD_RULE`).
    notes : list of str
        What the reader noticed (leap seconds, dropped duplicate times, status words).
    """

    satellite: str
    layout: str
    time: Time
    xrsa: np.ndarray
    xrsb: np.ndarray
    xrsa_quality: np.ndarray
    xrsb_quality: np.ndarray
    cadence_s: float
    quality_rule: str
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.xrsa.shape[0])

    @property
    def unix_tai(self) -> np.ndarray:
        """Sample times as astropy ``unix_tai`` seconds (float64, shape (n,)): TAI seconds since
        1970-01-01 00:00:08 TAI, counting leap seconds, hence strictly increasing."""
        return np.asarray(self.time.unix_tai, dtype=np.float64)

    @property
    def leap_second_samples(self) -> int:
        """How many samples fall inside an inserted leap second (``23:59:60.xxx`` UTC)."""
        return int(sum(":60." in s for s in np.atleast_1d(self.time.isot)))


def _satellite(ts, header_platform: str | None, name: str) -> str:
    for cand in (getattr(ts, "observatory", None), header_platform):
        if cand:
            s = str(cand).strip().upper().replace(" ", "-")
            if s.startswith("G") and s[1:].isdigit():
                return f"GOES-{int(s[1:])}"
            if s.startswith("GOES-") and s[5:].isdigit():
                return f"GOES-{int(s[5:])}"
    import re

    # the file has no platform attribute: the name (NOAA's ``_gNN_``, SDAC's ``goNN``, ``goes_NN``)
    m = re.search(r"_g(\d{2})_", name) or re.match(r"go(\d{2})\d{8}", name) or re.search(r"goes[_-]?(\d{2})", name, re.I)
    if m:
        return f"GOES-{int(m.group(1))}"
    raise XRSReadError(f"cannot tell which GOES satellite made {name}")


def _attr(v, key, default=None):
    val = v.attrs.get(key, default)
    if isinstance(val, bytes | np.bytes_):
        val = val.decode("utf-8", "replace")
    return val


def _good_rule(flag_var) -> tuple[int, int]:
    """(mask, value) of the ``good_data`` entry of a CF flag variable; (all bits, 0) without one."""
    meanings = _attr(flag_var, "flag_meanings")
    masks, values = flag_var.attrs.get("flag_masks"), flag_var.attrs.get("flag_values")
    if meanings and masks is not None and values is not None:
        names = str(meanings).split()
        masks, values = np.atleast_1d(masks), np.atleast_1d(values)
        if "good_data" in names and len(names) == len(masks) == len(values):
            i = names.index("good_data")
            return int(masks[i]), int(values[i])
    return 0xFFFFFFFF, 0


def _quality(raw: np.ndarray) -> np.ndarray:
    q = np.asarray(raw, dtype=np.float64)
    out = np.full(q.shape, -1, dtype=np.int64)
    ok = np.isfinite(q)
    out[ok] = q[ok].astype(np.int64)
    return out


def _flux_gaps(flux: np.ndarray, var) -> np.ndarray:
    """Mask of unusable flux samples: fill, non-finite, <= 0, above ``valid_max``."""
    bad = ~np.isfinite(flux) | (flux <= 0)
    if var is not None:
        fill = var.attrs.get("_FillValue")
        if fill is not None:
            bad |= flux == float(np.asarray(fill).ravel()[0])
        vmax = var.attrs.get("valid_max")
        if vmax is not None:
            bad |= flux > float(np.asarray(vmax).ravel()[0])
    bad |= flux <= -9999.0
    return bad


def _layout_netcdf(name_a: str, attrs: dict, cadence: float) -> str:
    title = str(attrs.get("title", "")) + " " + str(attrs.get("id", ""))
    if name_a == "a_flux":
        return "goes13-15-irrad"
    if "GOES R" in str(attrs.get("instrument", "")) or "EXIS" in str(attrs.get("instrument", "")):
        return "goes-r-flx1s" if cadence < 30 else "goes-r-avg1m"
    return "goes13-15-avg1m" if "avg1m" in title or cadence >= 30 else "goes13-15-irrad"


def _read_sunpy(path: Path):
    import sunpy.timeseries

    with warnings.catch_warnings():
        # sunpy warns about the leap second it rounds (handled here) and pandas about sunpy's
        # own calls; neither is about the data
        warnings.simplefilter("ignore")
        try:
            ts = sunpy.timeseries.TimeSeries(str(path), source="XRS")
        except Exception as exc:  # noqa: BLE001 - whatever sunpy raises, the file is unusable
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise XRSReadError(f"sunpy cannot read it as GOES XRS ({type(exc).__name__}: {first})") from None
    if isinstance(ts, list) or type(ts).__name__ != "XRSTimeSeries":
        raise XRSReadError("sunpy does not read it as one GOES XRS time series")
    return ts


def _netcdf_times(f) -> np.ndarray:
    """The raw ``time`` variable as astropy ``unix`` seconds (the count sunpy uses)."""
    var = f["time"]
    units = _attr(var, "units", "")
    if not str(units).startswith("seconds since"):
        raise XRSReadError(f"time units {units!r} are not 'seconds since <epoch>'")
    epoch = str(units)[len("seconds since"):].strip()
    if epoch.endswith("UTC"):
        epoch = epoch[:-3].strip()
    try:
        t0 = Time(epoch.replace("T", " "), scale="utc")
    except ValueError:
        raise XRSReadError(f"cannot read the time epoch {epoch!r}") from None
    t = np.asarray(var[:], dtype=np.float64)
    fill = var.attrs.get("_FillValue")
    if fill is not None:
        t = np.where(t == float(np.asarray(fill).ravel()[0]), np.nan, t)
    return t0.unix + t


def read_goes_xrs(path: str | Path) -> XRSSeries:
    """Read one GOES XRS file (netCDF-4 of NOAA or FITS of the SDAC) into an :class:`XRSSeries`.

    Parameters
    ----------
    path : path-like
        A GOES XRS file of one of the layouts in the module docstring.

    Returns
    -------
    XRSSeries
        Samples in time order; a flagged or fill sample is NaN (a gap); samples without a time
        (time fill) are dropped, as are exact repeats of a sample time (the notes say how many).

    Raises
    ------
    XRSReadError
        If the file is missing, is neither HDF5/netCDF-4 nor FITS, sunpy cannot read it as GOES
        XRS, it holds no sample, or its times disagree with sunpy's.
    """
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            magic = fh.read(9)
    except OSError as exc:
        raise XRSReadError(f"cannot read the file: {exc.strerror or exc}") from None
    if magic.startswith(_HDF5_MAGIC[:8]):
        kind = "netcdf"
    elif magic.startswith(_FITS_MAGIC):
        kind = "fits"
    else:
        raise XRSReadError("neither a netCDF-4 (HDF5) nor a FITS file")
    ts = _read_sunpy(p)
    df = ts.to_dataframe()
    if len(df) == 0:
        raise XRSReadError("no sample in the file")
    xrsa = df["xrsa"].to_numpy(dtype=np.float64, copy=True)
    xrsb = df["xrsb"].to_numpy(dtype=np.float64, copy=True)
    notes: list[str] = []
    if kind == "netcdf":
        import h5netcdf

        with h5netcdf.File(p, "r", decode_vlen_strings=True) as f:
            attrs = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes | np.bytes_) else v)
                     for k, v in f.attrs.items()}
            var_a = f.variables.get("a_flux") or f.variables.get("xrsa_flux")
            var_b = f.variables.get("b_flux") or f.variables.get("xrsb_flux")
            flag_a = f.variables.get("a_flags") or f.variables.get("xrsa_flags") or f.variables.get("xrsa_flag")
            flag_b = f.variables.get("b_flags") or f.variables.get("xrsb_flags") or f.variables.get("xrsb_flag")
            if var_a is None or var_b is None or "time" not in f.variables:
                raise XRSReadError("no xrsa/xrsb flux or time variable")
            unix = _netcdf_times(f)
            bad_a, bad_b = _flux_gaps(xrsa, var_a), _flux_gaps(xrsb, var_b)
            qa = _quality(df["xrsa_quality"].to_numpy()) if "xrsa_quality" in df else np.full(len(df), -1)
            qb = _quality(df["xrsb_quality"].to_numpy()) if "xrsb_quality" in df else np.full(len(df), -1)
            for q, flag, bad in ((qa, flag_a, bad_a), (qb, flag_b, bad_b)):
                if flag is None:
                    notes.append("no quality flag variable: every sample taken as flagged")
                    bad |= True
                    continue
                mask, value = _good_rule(flag)
                fill = flag.attrs.get("_FillValue")
                bad |= q < 0
                if fill is not None:
                    bad |= q == int(np.asarray(fill).ravel()[0])
                bad |= (q & mask) != value
            name_a = var_a.name.rsplit("/", 1)[-1]
        if unix.shape[0] != len(df):
            raise XRSReadError(f"{unix.shape[0]} times for {len(df)} flux samples")
        keep = np.isfinite(unix)
        if not keep.all():
            notes.append(f"{int((~keep).sum())} samples without a time (time fill) dropped")
        time = Time(unix[keep], format="unix", scale="utc")
        xrsa, xrsb, qa, qb, bad_a, bad_b = (x[keep] for x in (xrsa, xrsb, qa, qb, bad_a, bad_b))
        # sunpy's times (rounded at a leap second) must be these, else the rows are not aligned
        sunpy_t = ts.time[keep]
        off = np.abs((time - sunpy_t).to_value("s"))
        leap = np.array([":60." in s for s in np.atleast_1d(time.isot)])
        if np.any(off[~leap] > 1e-3) or np.any(off[leap] > 1.0):
            raise XRSReadError(f"sample times disagree with sunpy's by up to {off.max():.3f} s")
        cadence0 = float(np.median(np.diff(time.unix_tai))) if len(time) > 1 else 0.0
        layout = _layout_netcdf(name_a, attrs, cadence0)
        platform = attrs.get("platform")
    else:
        from astropy.io import fits

        time = ts.time
        qa = np.full(len(df), -1, dtype=np.int64)
        qb = qa.copy()
        bad_a, bad_b = _flux_gaps(xrsa, None), _flux_gaps(xrsb, None)
        layout = "sdac-fits"
        platform = None
        with fits.open(p) as hdul:
            platform = str(hdul[0].header.get("TELESCOP", "")).strip() or None
            if "STATUS" in hdul and hdul["STATUS"].data is not None:
                words = np.asarray(hdul["STATUS"].data["STATUS"]).ravel()
                if np.any(words != 0):
                    notes.append(f"file-level STATUS words {[int(w) for w in words]} (see the FITS STATUS comments)")
    xrsa[bad_a] = np.nan
    xrsb[bad_b] = np.nan
    order = np.argsort(time.unix_tai, kind="stable")
    tai = np.asarray(time.unix_tai)[order]
    dup = np.concatenate([[False], np.diff(tai) == 0])
    if dup.any():
        notes.append(f"{int(dup.sum())} repeated sample times dropped (the first kept)")
    sel = order[~dup]
    time = time[sel]
    xrsa, xrsb, qa, qb = xrsa[sel], xrsb[sel], qa[sel], qb[sel]
    tai = np.asarray(time.unix_tai)
    cadence = float(np.median(np.diff(tai))) if len(tai) > 1 else 0.0
    series = XRSSeries(satellite=_satellite(ts, platform, p.name), layout=layout, time=time, xrsa=xrsa, xrsb=xrsb,
                       xrsa_quality=qa.astype(np.int64), xrsb_quality=qb.astype(np.int64), cadence_s=cadence,
                       quality_rule=GOOD_RULE[layout], notes=notes)
    if series.leap_second_samples:
        notes.append(f"{series.leap_second_samples} sample(s) inside a leap second kept at 23:59:60 UTC")
    return series
