"""Search attributes of the LST data platform's own, for ``Fido.search`` (as ``a.lst.*``
once :mod:`lstdp_client.fido` is imported, or from this module).

>>> import sunpy.net.attrs as a
>>> import lstdp_client.attrs as la
>>> query = (a.Time("2004-03-01", "2004-03-02"), a.Instrument("LST"), la.Channel("SDI"),
...          la.CalibrationSet(3))

The sunpy core attrs the client also reads: ``a.Time`` (DATE-OBS range, UTC),
``a.Instrument("LST")``, ``a.Detector`` (SDI, WST, SCI-UV, SCI-WL), ``a.Level(2)``,
``a.Provider("LSTDP")`` and ``a.Source("ASO-S")``.
"""

from __future__ import annotations

from sunpy.net.attr import SimpleAttr

__all__ = ["Channel", "CalibrationSet", "ProductVersion"]


class Channel(SimpleAttr):
    """An LST channel: ``SDI`` (Lyman-alpha disk imager, 121.6 nm), ``WST`` (white light,
    360 nm), ``SCI-UV`` (Lyman-alpha corona, 121.6 nm) or ``SCI-WL`` (white-light corona,
    700 nm); case-insensitive, ``SCI_UV`` accepted (``pipelines/channels.py``).
    The same filter as ``a.Detector``."""

    def __init__(self, value: str) -> None:
        super().__init__(str(value).strip().upper().replace("_", "-"))


class CalibrationSet(SimpleAttr):
    """The calibration set (its id: ``GET /api/v1/calibration-sets``) the products were made with."""

    def __init__(self, value: int) -> None:
        v = int(value)
        if v < 1:
            raise ValueError(f"a calibration set id is >= 1, got {value!r}")
        super().__init__(v)


class ProductVersion(SimpleAttr):
    """A product version. On this platform a product's version is the id of its calibration
    set (``ProductPublic.version``), so ``ProductVersion(3)`` selects what ``CalibrationSet(3)`` does;
    the results' ``Version`` column is checked to equal it."""

    def __init__(self, value: int) -> None:
        v = int(value)
        if v < 1:
            raise ValueError(f"a product version is >= 1, got {value!r}")
        super().__init__(v)
