"""LST's four channels and their nominal geometry, kept as data.

Numbers from ``LST.md`` (Chen et al. 2019, RAA 19, 159; Li H. et al. 2019, RAA 19, 158;
Feng et al. 2019, RAA 19, 162; Jing et al. 2024, Sol. Phys.). Values marked
*unconfirmed* there (SDI and SCI-WL frame size and plate scale) are defaults here, not
truths: a binned frame keeps the field of view and scales the plate scale.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChannelSpec", "CHANNELS", "MIN_FRAME_SIDE", "SATURATION_DN", "get_channel", "channel_from_header"]

#: Saturation level of LST's 16-bit sensors [DN] (LST.md: 16-bit CMOS).
SATURATION_DN = 65535.0


@dataclass(frozen=True)
class ChannelSpec:
    """Nominal description of one channel.

    Attributes
    ----------
    code : str
        ``SDI``, ``WST``, ``SCI-UV`` or ``SCI-WL``.
    instrument : str
        ``SDI``, ``WST`` or ``SCI`` (the DETECTOR keyword of a raw file).
    wavelength_nm, bandwidth_nm : float
        Passband centre and full width [nm].
    naxis : int
        Full frame size [pixel] (square).
    plate_scale : float
        At full size [arcsec / pixel].
    resolution : float
        On-orbit spatial resolution [arcsec] (FWHM).
    fov_rsun_min, fov_rsun_max : float
        Useful field of view in solar radii (inner edge ``None`` for the disk imagers;
        SCI: occulter at 1.1 Rsun, field stop at 2.5 Rsun).
    bunit : str
        Physical unit of the L2 product (``BUNIT``).
    cadence_s : float
        Nominal cadence [s].
    """

    code: str
    instrument: str
    description: str
    wavelength_nm: float
    bandwidth_nm: float
    naxis: int
    plate_scale: float
    resolution: float
    fov_rsun_min: float | None
    fov_rsun_max: float
    bunit: str
    cadence_s: float

    @property
    def is_coronagraph(self) -> bool:
        return self.instrument == "SCI"

    def plate_scale_for(self, naxis: int) -> float:
        """Plate scale [arcsec/pixel] of a frame binned to ``naxis`` pixels (same FOV)."""
        return self.plate_scale * self.naxis / naxis


RADIANCE = "erg cm-2 s-1 sr-1"

CHANNELS: dict[str, ChannelSpec] = {
    c.code: c
    for c in (
        ChannelSpec("SDI", "SDI", "Lyman-alpha solar disk imager", 121.6, 9.0, 4608, 0.5, 9.5,
                    None, 1.2, RADIANCE, 60.0),
        ChannelSpec("WST", "WST", "White-light solar telescope (360 nm)", 360.0, 4.0, 4608, 0.5, 3.0,
                    None, 1.2, RADIANCE, 120.0),
        ChannelSpec("SCI-UV", "SCI", "Lyman-alpha solar corona imager", 121.6, 20.0, 2048, 2.4, 4.3,
                    1.1, 2.5, "MSB", 60.0),
        ChannelSpec("SCI-WL", "SCI", "White-light solar corona imager (700 nm)", 700.0, 80.0, 2048, 2.4, 4.3,
                    1.1, 2.5, "MSB", 60.0),
    )
}


#: Smallest side [pixel] of a frame that ingest accepts as an LST frame (largest: the
#: channel's ``naxis``, the full detector; a binned frame keeps the field of view).
#: LST.md names no binned readout modes, so this is the platform's own floor, not an
#: instrument fact: 32 px is 2048 px SCI binned 64x64 (about 150 arcsec/pixel over SCI's
#: 81.1 arcmin; 36 px would be 4608 px SDI/WST binned 128x128), the smallest frame
#: ``pipelines.simulation`` makes (it refuses ``naxis`` < 32) and the smallest the tests
#: ingest (``tests/test_ingest.py``: 32 px). Far below it (a 3x3 image with an LST
#: header) nothing of the disk or corona would be resolved: not a frame.
MIN_FRAME_SIDE = 32


def get_channel(code: str) -> ChannelSpec:
    """The spec of ``code`` (case-insensitive; ``SCI_UV`` and ``SCIUV`` accepted).

    Raises
    ------
    KeyError
        If ``code`` names no LST channel.
    """
    key = code.strip().upper().replace("_", "-")
    if key in ("SCIUV", "SCI-LYA"):
        key = "SCI-UV"
    if key in ("SCIWL",):
        key = "SCI-WL"
    if key not in CHANNELS:
        raise KeyError(f"unknown LST channel {code!r}; expected one of {', '.join(CHANNELS)}")
    return CHANNELS[key]


def channel_from_header(header) -> str | None:
    """Identify the LST channel of a raw header, or ``None`` if it is not an LST frame.

    Reads tolerantly: ``INSTRUME`` may be ``LST`` (channel in ``DETECTOR``/``CHANNEL``) or
    the instrument itself (``SDI``, ``WST``, ``SCI``); for SCI the passband comes from
    ``CHANNEL`` or ``WAVELNTH`` (121.6 nm -> SCI-UV, 700 nm -> SCI-WL).
    """
    telescop = str(header.get("TELESCOP", "")).strip().upper()
    instrume = str(header.get("INSTRUME", "")).strip().upper()
    detector = str(header.get("DETECTOR", "")).strip().upper()
    channel = str(header.get("CHANNEL", "")).strip().upper().replace("_", "-")
    if channel in CHANNELS:
        if telescop in ("ASO-S", "ASOS", "") or instrume in ("LST", "SDI", "WST", "SCI"):
            return channel
    if telescop not in ("ASO-S", "ASOS") and instrume not in ("LST", "SDI", "WST", "SCI"):
        return None
    inst = detector if instrume == "LST" else instrume
    if inst in ("SDI", "WST"):
        return inst
    if inst == "SCI":
        try:
            wl = float(header.get("WAVELNTH"))
        except (TypeError, ValueError):
            return None
        wunit = str(header.get("WAVEUNIT", "nm")).strip().lower()
        wl_nm = wl / 10.0 if wunit in ("angstrom", "a") else wl
        if abs(wl_nm - 121.6) < 15:
            return "SCI-UV"
        if abs(wl_nm - 700.0) < 60:
            return "SCI-WL"
    return None
