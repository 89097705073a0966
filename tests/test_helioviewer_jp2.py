"""The Helioviewer JPEG 2000 reader (pipelines.helioviewer_jp2) on the real SDO/HMI file."""

from __future__ import annotations

import struct

import astropy.units as u
import numpy as np
import pytest

from pipelines.errors import DataError
from pipelines.helioviewer_jp2 import (Jp2ReadError, helioviewer_map, read_helioviewer_header, read_helioviewer_jp2,
                                       read_jp2_boxes)
from pipelines.calibration.masters.limb import fit_solar_limb
from tests.conftest import SAMPLE

HMI = SAMPLE / "helioviewer-jp2" / "2023_01_31__03_39_23_200__SDO_HMI_HMI_continuum.jp2"


def test_header_of_the_xml_box_is_read_right():
    data, h = read_helioviewer_jp2(HMI)
    assert h["DATE-OBS"] == "2023-01-31T03:39:23.200"
    assert h["CDELT1"] == h["CDELT2"] == pytest.approx(4.80000016)
    assert (h["CRPIX1"], h["CRPIX2"]) == (256.5, 256.5)
    assert h["RSUN_OBS"] == pytest.approx(973.96844)
    assert h["NAXIS1"] == h["NAXIS2"] == 512 and h["CTYPE1"] == "HPLN-TAN"
    assert h["TELESCOP"] == "SDO" and h["WAVELNTH"] == 6173.0 and isinstance(h["NAXIS1"], int)
    assert "Polynomial Coefficients" in h["HISTORY"]
    assert data.shape == (512, 512) and data.dtype == np.uint8


def test_the_image_puts_the_sun_where_the_header_says():
    """The limb fitted on the bytes: centre at CRPIX, radius RSUN_OBS / CDELT (within 1 px)."""
    data, h = read_helioviewer_jp2(HMI)
    lf = fit_solar_limb(data.astype(float), edge="steepest")
    assert lf.x0 + 1 == pytest.approx(h["CRPIX1"], abs=1.0)
    assert lf.y0 + 1 == pytest.approx(h["CRPIX2"], abs=1.0)
    assert lf.radius == pytest.approx(h["RSUN_OBS"] / h["CDELT1"], abs=1.5)


def test_map_has_the_geometry_and_no_physical_unit():
    m = helioviewer_map(HMI)
    assert m.date.isot == "2023-01-31T03:39:23.200"
    assert m.scale[0].to_value(u.arcsec / u.pix) == pytest.approx(4.8, abs=1e-6)
    assert m.rsun_obs.to_value(u.arcsec) == pytest.approx(973.96844)
    assert m.reference_pixel.x.to_value(u.pix) == pytest.approx(255.5)
    assert m.unit is None, "byte-scaled display values carry no unit"
    assert "not DN" in m.meta["history"]
    assert m.observer_coordinate.radius.to_value(u.m) == pytest.approx(147397840000.0)


@pytest.mark.parametrize("cut", [100, 3000, 40000, 84000])
def test_truncated_file_is_refused_clearly(tmp_path, cut):
    p = tmp_path / "cut.jp2"
    p.write_bytes(HMI.read_bytes()[:cut])
    with pytest.raises(Jp2ReadError, match="truncated JP2") as exc:
        read_helioviewer_jp2(p)
    assert isinstance(exc.value, DataError) and "cut.jp2" in str(exc.value)


def test_not_a_jp2_is_refused(tmp_path):
    with pytest.raises(Jp2ReadError, match="not a JPEG 2000"):
        read_helioviewer_jp2(SAMPLE / "bad-input" / "not_actually_fits.fits")
    with pytest.raises(Jp2ReadError, match="cannot read"):
        read_helioviewer_jp2(tmp_path / "missing.jp2")


def _without_box(raw: bytes, kind: bytes) -> bytes:
    out, off = b"", 0
    while off < len(raw):
        n, t = struct.unpack(">I4s", raw[off:off + 8])
        n = len(raw) - off if n == 0 else n
        if t != kind:
            out += raw[off:off + n]
        off += n
    return out


def test_no_xml_box_or_damaged_codestream_is_refused(tmp_path):
    raw = HMI.read_bytes()
    p = tmp_path / "noxml.jp2"
    p.write_bytes(_without_box(raw, b"xml "))
    with pytest.raises(Jp2ReadError, match="no XML box"):
        read_helioviewer_jp2(p)
    kinds = [k for k, _ in read_jp2_boxes(raw)]
    assert kinds == ["jP  ", "ftyp", "jp2h", "ihdr", "colr", "xml ", "jp2c"]
    # the codestream's own header zeroed, box lengths kept: the decoder refuses it
    i = raw.index(b"jp2c") + 4
    bad = raw[:i] + bytes(64) + raw[i + 64:]
    q = tmp_path / "bad.jp2"
    q.write_bytes(bad)
    with pytest.raises(Jp2ReadError, match="does not decode"):
        read_helioviewer_jp2(q)


def test_header_parser_refuses_xml_without_fits():
    with pytest.raises(Jp2ReadError, match="no <fits>"):
        read_helioviewer_header("<meta><other/></meta>")
    with pytest.raises(Jp2ReadError, match="does not parse"):
        read_helioviewer_header("<meta><fits>")
    h = read_helioviewer_header("<meta><fits><naxis>2</naxis><cdelt1>0.6</cdelt1><object>Sun</object></fits>"
                                "<helioviewer><hv_rotation>0</hv_rotation></helioviewer></meta>")
    assert h == {"NAXIS": 2, "CDELT1": 0.6, "OBJECT": "Sun", "HV_ROTATION": 0}


def _with_xml_box(raw: bytes, xml: bytes) -> bytes:
    """``raw`` with its ``xml `` box's contents replaced by ``xml``."""
    out, off = b"", 0
    while off < len(raw):
        n, t = struct.unpack(">I4s", raw[off:off + 8])
        n = len(raw) - off if n == 0 else n
        out += struct.pack(">I4s", 8 + len(xml), t) + xml if t == b"xml " else raw[off:off + n]
        off += n
    return out


LAUGHS = ('<?xml version="1.0"?><!DOCTYPE meta [<!ENTITY a "lol">'
          + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(8))
          + ']><meta><fits><object>&i;</object></fits></meta>')
SMALL_ENTITY = ('<?xml version="1.0"?><!DOCTYPE meta [<!ENTITY s "Sun">]>'
                '<meta><fits><naxis>2</naxis><object>&s;</object></fits></meta>')
EXTERNAL = ('<?xml version="1.0"?><!DOCTYPE meta [<!ENTITY x SYSTEM "file:///etc/hostname">]>'
            '<meta><fits><object>&x;</object></fits></meta>')


@pytest.mark.parametrize("xml", [LAUGHS, SMALL_ENTITY, EXTERNAL], ids=["billion-laughs", "entity", "external"])
def test_an_xml_box_with_entities_is_refused_not_expanded(tmp_path, xml):
    """Issue 24: the XML box comes from an input file: entity declarations (billion laughs,
    external entities, and even a harmless one) are refused with the data error, never expanded."""
    with pytest.raises(Jp2ReadError, match="refused.*entities") as info:
        read_helioviewer_header(xml)
    assert isinstance(info.value, DataError)
    p = tmp_path / "entities.jp2"
    p.write_bytes(_with_xml_box(HMI.read_bytes(), xml.encode()))
    with pytest.raises(Jp2ReadError, match="refused.*entities"):
        read_helioviewer_jp2(p)
