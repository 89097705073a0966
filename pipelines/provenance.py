"""The L2 provenance keywords, kept as data, and the one writer that stamps them.

Every provenance keyword of an L2 product (what made it, from which inputs, at which
level) is a row of :data:`L2_PROVENANCE`: its name, its comment, and who knows its value
(the calibration flow, the file writer, the product store). :func:`stamp_provenance` is the
only function that writes them; a keyword missing from the spec is refused, so the spec is
the list of what a product says about itself (the way punchbowl keeps its level specs).

Calibration files are recorded with four keywords per kind (name, version, id, SHA-256;
``CAL*`` as punchbowl does), :data:`CAL_KEYWORDS`:

==============  ========  ========  ========  ========
kind            name      version   id        sha256
==============  ========  ========  ========  ========
dark            CALDARK   CALDKVER  CALDKID   CALDKSHA
flat            CALFLAT   CALFLVER  CALFLID   CALFLSHA
radiometric     CALRAD    CALRDVER  CALRDID   CALRDSHA
stray_light     CALSTRAY  CALSTVER  CALSTID   CALSTSHA
mask_geometry   CALMASK   CALMKVER  CALMKID   CALMKSHA
psf             CALPSF    CALPSVER  CALPSID   CALPSSHA
==============  ========  ========  ========  ========
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from astropy.io import fits

__all__ = ["ProvenanceKeyword", "L2_PROVENANCE", "CAL_KEYWORDS", "stamp_provenance", "calibration_values"]


@dataclass(frozen=True)
class ProvenanceKeyword:
    """One row of the L2 provenance spec.

    Attributes
    ----------
    name : str
        FITS keyword (at most 8 characters).
    comment : str or None
        Card comment; ``None`` keeps the comment a card already has (``BUNIT`` of the raw
        frame), and no comment on a new card.
    stamped_by : str
        ``flow`` (:func:`pipelines.calibration.l2.flow.calibrate_frame`), ``writer``
        (:func:`pipelines.products.build_product_hdul`) or ``store`` (the platform's product
        store: ids and file name).
    drop_long_comment : bool
        Leave the comment out when the card would not fit in 80 characters (a calibration
        file's long name), instead of letting astropy cut it.
    """

    name: str
    comment: str | None
    stamped_by: str
    drop_long_comment: bool = False


#: Keywords (name, version, id, sha256) recording each kind of calibration file.
CAL_KEYWORDS: dict[str, tuple[str, str, str, str]] = {
    "dark": ("CALDARK", "CALDKVER", "CALDKID", "CALDKSHA"),
    "flat": ("CALFLAT", "CALFLVER", "CALFLID", "CALFLSHA"),
    "radiometric": ("CALRAD", "CALRDVER", "CALRDID", "CALRDSHA"),
    "stray_light": ("CALSTRAY", "CALSTVER", "CALSTID", "CALSTSHA"),
    "mask_geometry": ("CALMASK", "CALMKVER", "CALMKID", "CALMKSHA"),
    "psf": ("CALPSF", "CALPSVER", "CALPSID", "CALPSSHA"),
}


def _calibration_rows() -> tuple[ProvenanceKeyword, ...]:
    rows = []
    for kind, (kname, kver, kid, ksha) in CAL_KEYWORDS.items():
        label = kind.replace("_", " ")
        rows += [ProvenanceKeyword(kname, f"{label} calibration file", "flow", drop_long_comment=True),
                 ProvenanceKeyword(kver, f"{label} calibration version (CALVER)", "flow"),
                 ProvenanceKeyword(kid, f"{label} calibration file id", "flow"),
                 ProvenanceKeyword(ksha, None, "flow")]  # 64 hex digits: no room for a comment
    return tuple(rows)


#: The L2 provenance spec: every keyword a product carries about its making.
L2_PROVENANCE: tuple[ProvenanceKeyword, ...] = _calibration_rows() + (
    ProvenanceKeyword("RAWFILE", "raw frame of this product", "flow"),
    ProvenanceKeyword("LEVEL", "calibrated, north up (LST level 2)", "flow"),
    ProvenanceKeyword("BUNIT", None, "flow"),
    ProvenanceKeyword("CHANNEL", None, "flow"),
    ProvenanceKeyword("BACKEND", "array backend used for the arithmetic", "flow"),
    ProvenanceKeyword("PRODID", "product id in the LST data platform", "store"),
    ProvenanceKeyword("PRODVER", "product version: its calibration set id", "store"),
    ProvenanceKeyword("CALSET", "calibration set id (files, options, software)", "store"),
    ProvenanceKeyword("FRAMEID", "raw frame id in the LST data platform", "store"),
    ProvenanceKeyword("FILENAME", None, "store"),
    ProvenanceKeyword("SOFTNAME", "software that made this product", "writer"),
    ProvenanceKeyword("SOFTVERS", "software version", "writer"),
    ProvenanceKeyword("DATE", "[UTC] file creation time", "writer"),
    ProvenanceKeyword("FILETYPE", "LST level-2 calibrated image", "writer"),
)

_SPEC = {k.name: k for k in L2_PROVENANCE}


def _fits(name: str, value: Any, comment: str) -> bool:
    """Whether ``name = value / comment`` fits one 80-character card (the value field of a
    string is at least 20 characters, FITS standard 4.0 sect. 4.2.1)."""
    if isinstance(value, str):
        field = max(len(value) + 2, 20)
    else:
        field = 20
    return 10 + field + 3 + len(comment) <= 80


def stamp_provenance(header: fits.Header, values: Mapping[str, Any]) -> fits.Header:
    """Write provenance keywords on ``header`` (in place, in the order given) with the spec's comments.

    Parameters
    ----------
    header : astropy.io.fits.Header
    values : mapping of str to value
        Keyword -> value, each a keyword of :data:`L2_PROVENANCE`.

    Returns
    -------
    astropy.io.fits.Header
        ``header``.

    Raises
    ------
    KeyError
        If a keyword is not in the spec (add it to :data:`L2_PROVENANCE` first).
    """
    for name, value in values.items():
        try:
            spec = _SPEC[name]
        except KeyError:
            raise KeyError(f"{name} is not an L2 provenance keyword (pipelines.provenance.L2_PROVENANCE)") from None
        if spec.comment is None:
            header[name] = value
        else:
            keep = not spec.drop_long_comment or _fits(name, value, spec.comment)
            header[name] = (value, spec.comment if keep else "")
    return header


def calibration_values(kind: str, name: str, version: int, file_id: int | None, sha256: str) -> dict[str, Any]:
    """The four ``CAL*`` values of one calibration file (``id`` left out when unknown)."""
    kname, kver, kid, ksha = CAL_KEYWORDS[kind]
    out: dict[str, Any] = {kname: name, kver: int(version)}
    if file_id is not None:
        out[kid] = int(file_id)
    out[ksha] = sha256
    return out
