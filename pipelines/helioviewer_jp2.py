"""Helioviewer JPEG 2000 frames: the image and the FITS header kept in the file's XML box.

Helioviewer (helioviewer.org, JHelioviewer) serves full-disk images as JPEG 2000 files whose
``xml `` box holds the original FITS header as ``<meta><fits><KEYWORD>value</KEYWORD>...``
(adjusted to the JP2's own size: CRPIX and CDELT describe the JP2 pixels). The image is
decoded with ``imagecodecs.jpeg2k_decode`` (its PyPI wheel bundles OpenJPEG, so no system
``libopenjp2`` is needed, unlike glymur); the boxes are walked with :mod:`struct` and the
XML parsed with :mod:`defusedxml.ElementTree` (the box comes from an input file: entity
declarations, so "billion laughs" expansion and external entities, are refused, not
expanded) (ISO/IEC 15444-1 Annex I: a box is a 4-byte
big-endian length, a 4-byte type, and its contents; length 1 means a 64-bit length follows,
length 0 means "to the end of the file").

**The pixel values are not the instrument's data.** Helioviewer scales every image to
8 bits for display (a clipped, instrument-dependent and possibly non-linear mapping of the
DN; the header's ``BUNIT``, ``DATAMIN``/``DATAMAX`` describe the original FITS, not the
bytes). A map read here has the right geometry (helioprojective WCS, DATE-OBS, observer,
``RSUN_OBS``) and relative structure (darker spots, brighter faculae), never physical units.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from defusedxml import DefusedXmlException
from defusedxml import ElementTree as SafeET

from pipelines.errors import DataError

__all__ = ["Jp2ReadError", "read_jp2_boxes", "read_helioviewer_header", "read_helioviewer_jp2",
           "helioviewer_map"]

#: JP2 signature box contents (ISO/IEC 15444-1 I.5.1): ``<CR><LF><0x87><LF>``.
_JP2_SIGNATURE = b"\x0d\x0a\x87\x0a"
#: Superboxes whose contents are boxes (ISO/IEC 15444-1 I.5.3, I.7.3).
_SUPERBOXES = {b"jp2h", b"res ", b"uinf", b"asoc"}


class Jp2ReadError(DataError):
    """A file is not a readable Helioviewer JPEG 2000 frame (the message says why, in one line)."""


def read_jp2_boxes(data: bytes) -> list[tuple[str, bytes]]:
    """The boxes of a JP2 file, superboxes opened, in file order.

    Parameters
    ----------
    data : bytes
        The whole file.

    Returns
    -------
    list of (str, bytes)
        ``(type, contents)`` of every box (types as 4-character strings such as ``'xml '``,
        ``'jp2c'``), the contents without the box header.

    Raises
    ------
    Jp2ReadError
        If the file does not start with the JP2 signature box or a box runs past the end
        of the file (a truncated download).
    """
    if len(data) < 12 or data[4:8] != b"jP  " or data[8:12] != _JP2_SIGNATURE:
        raise Jp2ReadError("not a JPEG 2000 (JP2) file: no JP2 signature box")
    out: list[tuple[str, bytes]] = []

    def walk(off: int, end: int) -> None:
        while off < end:
            if end - off < 8:
                raise Jp2ReadError(f"truncated JP2: {end - off} stray bytes at offset {off}")
            length, kind = struct.unpack(">I4s", data[off:off + 8])
            head = 8
            if length == 1:
                if end - off < 16:
                    raise Jp2ReadError(f"truncated JP2: box header cut at offset {off}")
                length = struct.unpack(">Q", data[off + 8:off + 16])[0]
                head = 16
            elif length == 0:
                length = end - off
            if length < head:
                raise Jp2ReadError(f"corrupt JP2: box {kind!r} at offset {off} has length {length}")
            if off + length > end:
                raise Jp2ReadError(f"truncated JP2: box {kind.decode('latin-1')!r} at offset {off} needs "
                                   f"{length} bytes, {end - off} left (file cut short?)")
            body = data[off + head:off + length]
            out.append((kind.decode("latin-1"), body))
            if kind in _SUPERBOXES:
                walk(off + head, off + length)
            off += length

    walk(0, len(data))
    return out


def _value(text: str | None) -> Any:
    """A FITS value from its XML text: int, float or the stripped string."""
    s = (text or "").strip()
    for kind in (int, float):
        try:
            return kind(s)
        except ValueError:
            pass
    return s


def read_helioviewer_header(xml_text: str) -> dict[str, Any]:
    """The FITS header of a Helioviewer ``xml `` box as a dict of upper-case keywords.

    Parameters
    ----------
    xml_text : str
        The box contents, ``<meta><fits>...</fits>...</meta>``.

    Returns
    -------
    dict
        Keyword -> value (int, float or str); ``HISTORY`` and ``COMMENT`` as one string
        each, with their line breaks; the ``<helioviewer>`` block's entries (inside
        ``<fits>`` or beside it) prefixed ``HV_`` (once).

    Raises
    ------
    Jp2ReadError
        If the XML does not parse, declares entities or refers to external ones (refused by
        :mod:`defusedxml`, never expanded), or has no ``<fits>`` element.
    """
    try:
        root = SafeET.fromstring(xml_text)
    except SafeET.ParseError as exc:
        raise Jp2ReadError(f"JP2 XML box does not parse: {exc}") from None
    except DefusedXmlException as exc:
        raise Jp2ReadError(f"JP2 XML box refused: it declares or refers to XML entities ({type(exc).__name__}); "
                           "a Helioviewer header needs none") from None
    fits_el = root if root.tag == "fits" else root.find("fits")
    if fits_el is None:
        raise Jp2ReadError("JP2 XML box has no <fits> element (not a Helioviewer frame)")
    header: dict[str, Any] = {}
    for el in fits_el:
        key = el.tag.upper()
        if key in ("HISTORY", "COMMENT"):
            header[key] = (el.text or "").strip()
        elif key == "HELIOVIEWER":
            for sub in el:
                header[_hv_key(sub.tag)] = _value(sub.text)
        else:
            header[key] = _value(el.text)
    hv = root.find("helioviewer")
    if hv is not None:
        for sub in hv:
            header[_hv_key(sub.tag)] = _value(sub.text)
    return header


def _hv_key(tag: str) -> str:
    """A ``<helioviewer>`` entry's keyword: upper case, ``HV_`` prefixed once."""
    key = tag.upper()
    return key if key.startswith("HV_") else f"HV_{key}"


def read_helioviewer_jp2(path: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
    """Read a Helioviewer JPEG 2000 frame: its image and the FITS header of its XML box.

    Parameters
    ----------
    path : path-like
        A ``.jp2`` file as Helioviewer serves it.

    Returns
    -------
    data : numpy.ndarray, shape (NAXIS2, NAXIS1), uint8
        The byte-scaled display values (0-255, **not** DN), in FITS row order (row 0 at
        the bottom: the JPEG 2000 rows, stored top down, are flipped, as sunpy does).
    header : dict
        The FITS keywords of the XML box (:func:`read_helioviewer_header`); ``DATE-OBS``,
        ``CDELT1/2`` [arcsec/pixel], ``CRPIX1/2`` [pixel, 1-based], ``RSUN_OBS`` [arcsec]
        describe the JP2's pixels.

    Raises
    ------
    Jp2ReadError
        If the file is missing, not a JP2, truncated, has no XML header or no codestream,
        the codestream does not decode, or the image shape differs from NAXIS1/NAXIS2.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise Jp2ReadError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        boxes = read_jp2_boxes(raw)
    except Jp2ReadError as exc:
        raise Jp2ReadError(f"{p.name}: {exc}") from None
    xml = [body for kind, body in boxes if kind == "xml "]
    codestream = [body for kind, body in boxes if kind == "jp2c"]
    if not xml:
        raise Jp2ReadError(f"{p.name}: no XML box, so no FITS header (not a Helioviewer frame)")
    if not codestream:
        raise Jp2ReadError(f"{p.name}: no JPEG 2000 codestream box")
    try:
        header = read_helioviewer_header(xml[0].decode("utf-8", errors="replace"))
    except Jp2ReadError as exc:
        raise Jp2ReadError(f"{p.name}: {exc}") from None
    import imagecodecs

    try:
        img = imagecodecs.jpeg2k_decode(raw)
    except Exception as exc:  # imagecodecs raises its own Jpeg2kError (and RuntimeError on some builds)
        raise Jp2ReadError(f"{p.name}: JPEG 2000 codestream does not decode ({exc})") from None
    if img.ndim != 2:
        raise Jp2ReadError(f"{p.name}: expected a single-component image, got shape {img.shape}")
    n1, n2 = header.get("NAXIS1"), header.get("NAXIS2")
    if (n1, n2) != (None, None) and (n2, n1) != img.shape:
        raise Jp2ReadError(f"{p.name}: image {img.shape[1]}x{img.shape[0]} differs from the header's "
                           f"NAXIS1 x NAXIS2 = {n1}x{n2}")
    return np.ascontiguousarray(img[::-1]), header


def helioviewer_map(path: str | os.PathLike):
    """A :class:`sunpy.map.GenericMap` of a Helioviewer JP2 frame (float32 byte-scaled values).

    The header is the XML box's, less the keywords that describe the original FITS array
    and not the bytes (``BITPIX``, ``BZERO``, ``BSCALE``, ``BLANK``, ``CHECKSUM``,
    ``DATASUM``, ``DATAMIN``/``DATAMAX``/``DATAMEDN``/``DATAMEAN``/``DATARMS``), with
    ``BUNIT`` removed (the values have none) and a ``HISTORY`` line saying so.

    Raises
    ------
    Jp2ReadError
        As :func:`read_helioviewer_jp2`.
    """
    import sunpy.map

    data, header = read_helioviewer_jp2(path)
    meta = {k: v for k, v in header.items()
            if k not in ("BITPIX", "BZERO", "BSCALE", "BLANK", "CHECKSUM", "DATASUM", "DATAMIN", "DATAMAX",
                         "DATAMEDN", "DATAMEAN", "DATARMS", "DATASKEW", "DATAKURT", "BUNIT", "HISTORY",
                         "COMMENT")}
    meta["HISTORY"] = (f"{header.get('HISTORY', '')}\nRead from the Helioviewer JPEG 2000 {Path(path).name}: "
                       "values are Helioviewer's 8-bit display scaling, not DN").strip()
    return sunpy.map.Map(data.astype(np.float32), meta)
