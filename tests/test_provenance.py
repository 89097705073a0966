"""The L2 provenance spec and its one writer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from astropy.io import fits

from pipelines.provenance import CAL_KEYWORDS, L2_PROVENANCE, calibration_values, stamp_provenance

ROOT = Path(__file__).resolve().parent.parent
NAMES = {k.name for k in L2_PROVENANCE}


def test_the_spec_is_well_formed():
    assert len(NAMES) == len(L2_PROVENANCE) and all(len(n) <= 8 for n in NAMES)
    assert {k for kws in CAL_KEYWORDS.values() for k in kws} <= NAMES
    assert {k.stamped_by for k in L2_PROVENANCE} == {"flow", "writer", "store"}


def test_the_writer_refuses_keywords_outside_the_spec():
    with pytest.raises(KeyError, match="COLOUR is not an L2 provenance keyword"):
        stamp_provenance(fits.Header(), {"COLOUR": "blue"})


def test_comments_come_from_the_spec_and_long_calibration_names_drop_theirs():
    h = fits.Header()
    stamp_provenance(h, calibration_values("dark", "dark_v1.fits", 1, 7, "ab" * 32))
    assert h.comments["CALDARK"] == "dark calibration file" and h["CALDKID"] == 7
    assert h.comments["CALDKVER"] == "dark calibration version (CALVER)" and h.comments["CALDKSHA"] == ""
    long = "lst_sdi_mask_geometry_" + "x" * 40 + ".fits"
    stamp_provenance(h, calibration_values("mask_geometry", long, 2, None, "cd" * 32))
    assert h["CALMASK"] == long and h.comments["CALMASK"] == "" and "CALMKID" not in h
    h["BUNIT"] = ("DN", "raw unit")
    stamp_provenance(h, {"BUNIT": "MSB", "LEVEL": "L2"})
    assert h["BUNIT"] == "MSB" and h.comments["BUNIT"] == "raw unit"  # comment None: the card's own kept
    assert list(h)[-1] == "LEVEL"


def test_no_other_module_writes_a_provenance_keyword():
    """Every ``header["<provenance keyword>"] = ...`` of the product goes through the writer."""
    found = []
    for pkg in ("backend", "pipelines"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            if f.name == "provenance.py" or "simulation" in f.parts:  # the simulator writes raw frames
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                                and t.slice.value in NAMES and t.slice.value not in ("BUNIT", "CHANNEL")):
                            found.append(f"{f.relative_to(ROOT)}:{node.lineno} {t.slice.value}")
    assert found == []
