"""Frame-wide systematics of an L2 product: one quality word for the whole frame.

The per-pixel DQ array (:class:`pipelines.calibration.l2.steps.DQ`) says which pixels are bad.
Some errors are not any pixel's: a disk centre the chain could not measure moves the whole
WCS, a stray-light model that was refused leaves the whole corona biased, a flat whose
large-scale plane is stated rather than measured tilts the whole disk. Such a product is
not wrong pixel by pixel and must still say so: a frame-level bit in ``QUALITY`` (the
keyword SDO/AIA and HMI level-1 products use for their frame-level quality word, 0 =
nothing to report) and one keyword per bit saying why.

=====  =====================  ========  ==========================================================
bit    name                   reason    set when
=====  =====================  ========  ==========================================================
1      CENTRE_REFUSED         CENTFAIL  a centre fit was made and refused (further from the
                                        header than the pointing is believed to be off, or too
                                        uncertain): the header's centre is kept, unverified
2      CENTRE_FAILED          CENTFAIL  no centre fit could be made (no edge found, too few points)
4      STRAY_LIGHT_REFUSED    STRYFAIL  the stray-light model was refused for this frame: the
                                        master's fit was refused (``STRYREFU = T``, reason
                                        ``STRYWHY``) and its law is the fallback (the flow sets it,
                                        :func:`pipelines.calibration.l2.flow.calibrate_frame`)
8      FLAT_PLANE_STATED      FLATPLAN  the flat's large-scale plane (gain gradient) was stated
                                        (a prior), not measured: set when the flat master's
                                        ``FLATPLSR`` keyword is ``STATED``
=====  =====================  ========  ==========================================================

``QUALITY`` is written on every L2 product (0 when no bit is set). The reason keywords are
written only with their bit; a reason longer than fits one card with its comment is cut (the full text is in HISTORY).

When the centre fit is refused or fails, :func:`pipelines.calibration.l2.centre.fit_and_apply_centre`
also states the centre's systematic error in the WCS's own ``CSYERia`` keywords: the size of the
pointing uncertainty (the larger of the pointing error believed and the refused fit's distance
from the header), so that the product never claims a precision nobody measured.
"""

from __future__ import annotations

import enum

from astropy.io import fits

__all__ = ["FrameQuality", "QUALITY_KEYWORDS", "REASON_KEYWORDS", "SYSTEMATICS", "flag_frame", "frame_quality",
           "stamp_quality", "quality_names", "quality_reasons"]


class FrameQuality(enum.IntFlag):
    """Bits of the frame-level quality word ``QUALITY`` (see the module docstring)."""

    CENTRE_REFUSED = 1
    CENTRE_FAILED = 2
    STRAY_LIGHT_REFUSED = 4
    FLAT_PLANE_STATED = 8


#: The reason keyword of each bit.
REASON_KEYWORDS: dict[FrameQuality, str] = {
    FrameQuality.CENTRE_REFUSED: "CENTFAIL",
    FrameQuality.CENTRE_FAILED: "CENTFAIL",
    FrameQuality.STRAY_LIGHT_REFUSED: "STRYFAIL",
    FrameQuality.FLAT_PLANE_STATED: "FLATPLAN",
}

#: Keywords this module writes, with their comments.
QUALITY_KEYWORDS = {
    "QUALITY": "frame quality bits, 0 = none (see CENTFAIL..)",
    "CENTFAIL": "why the centre is unmeasured",
    "STRYFAIL": "why stray light was refused",
    "FLATPLAN": "why the flat plane is stated",
}

#: Search names of the bits (``systematics=`` of the product and event searches), lower case.
SYSTEMATICS: dict[str, FrameQuality] = {b.name.lower(): b for b in FrameQuality}

#: Characters of a string value that fit one card (80 - 10 - 2 quotes).
_MAX_VALUE = 68


def _room(comment: str) -> int:
    """Characters of a string value that fit one card with ``comment`` (80 - 10 - 2 quotes - ' / ')."""
    return _MAX_VALUE - 3 - len(comment)


def frame_quality(header) -> FrameQuality:
    """The ``QUALITY`` bits of a header (a FITS header or a dict); 0 when absent or not an integer."""
    try:
        return FrameQuality(int(header.get("QUALITY", 0) or 0) & sum(int(b) for b in FrameQuality))
    except (TypeError, ValueError):
        return FrameQuality(0)


def quality_names(bits: int) -> list[str]:
    """Search names (:data:`SYSTEMATICS` keys) of the bits set in ``bits``, in bit order."""
    return [name for name, b in SYSTEMATICS.items() if int(bits) & int(b)]


def stamp_quality(header: fits.Header, bits: int) -> None:
    """Write ``QUALITY`` = ``bits`` (in place)."""
    header["QUALITY"] = (int(FrameQuality(int(bits))), QUALITY_KEYWORDS["QUALITY"])


def flag_frame(header: fits.Header, bit: FrameQuality, reason: str) -> None:
    """Set a frame-level quality bit, its reason keyword and a HISTORY line (in place).

    Parameters
    ----------
    header : astropy.io.fits.Header
        Modified in place.
    bit : FrameQuality
        One bit.
    reason : str
        Why, in words; cut to one card in the reason keyword, whole in HISTORY.

    Raises
    ------
    ValueError
        If ``bit`` is not exactly one :class:`FrameQuality` bit.
    """
    bit = FrameQuality(bit)
    if bit not in REASON_KEYWORDS:
        raise ValueError(f"flag_frame sets one bit at a time, got {bit!r}")
    stamp_quality(header, int(frame_quality(header) | bit))
    key = REASON_KEYWORDS[bit]
    text = " ".join(str(reason).split()).replace("'", "")
    header[key] = (text[:_room(QUALITY_KEYWORDS[key])], QUALITY_KEYWORDS[key])
    header.add_history(f"quality: {bit.name} ({text})")


def quality_reasons(header) -> dict[str, str]:
    """``{bit name: reason}`` of the ``QUALITY`` bits set in ``header`` (a FITS header or a dict,
    e.g. a product row's stored header); the reason is ``''`` when its keyword is missing."""
    bits = frame_quality(header)
    return {b.name: str(header.get(REASON_KEYWORDS[b], "") or "") for b in FrameQuality if bits & b}
