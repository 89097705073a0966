"""Parsers of external solar-event catalogues, one pure function per catalogue.

Each ``parse_<name>(path) -> ParseResult`` reads one file and returns
:class:`~pipelines.catalogues.records.EventRecord` rows (mirroring ``backend.models.Event``),
the refused rows with a reason each, and the number of data rows read. No database, no
settings: the import service (``backend.services.events``) stores the records.

========== ======================================== ==================================== ====
source     catalogue                                 files (under an ``events/`` folder)  type
========== ======================================== ==================================== ====
lst_wst    LST/WST white-light flares (Jing+ 2024)   ``aso-s_lst_wst/*.txt``              FL
goes_xrs   NOAA/NGDC GOES XRS flare reports          ``goes_xrs_reports/*.txt``           FL
cdaw       CDAW SOHO/LASCO CME catalogue             ``cdaw/*.txt``                       CE
hek        HEK API responses                         ``hek/*.json``                       any
donki      NASA CCMC DONKI CMEs                      ``donki/*.json``                     CE
noaa_srs   NOAA Solar Region Summaries               ``noaa_srs/*SRS.txt``                AR
stix       Solar Orbiter/STIX flare list (Hayes+)    ``stix/STIX_flarelist*.csv``         FL
========== ======================================== ==================================== ====
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipelines.catalogues.cdaw import parse_cdaw
from pipelines.catalogues.donki import parse_donki
from pipelines.catalogues.goes_xrs import parse_goes_xrs
from pipelines.catalogues.hek import parse_hek
from pipelines.catalogues.lst_wst import parse_lst_wst
from pipelines.catalogues.noaa_srs import parse_noaa_srs
from pipelines.catalogues.records import (
    AssociationRecord,
    CatalogueError,
    EventRecord,
    ParseResult,
    full_noaa_number,
    refusal_summary,
)
from pipelines.catalogues.stix import parse_stix

__all__ = [
    "EventRecord",
    "AssociationRecord",
    "ParseResult",
    "CatalogueError",
    "Catalogue",
    "CATALOGUES",
    "DETECTED_SOURCE",
    "SOURCES",
    "catalogue_files",
    "parse_catalogue",
    "full_noaa_number",
    "refusal_summary",
    "parse_lst_wst",
    "parse_goes_xrs",
    "parse_cdaw",
    "parse_hek",
    "parse_donki",
    "parse_noaa_srs",
    "parse_stix",
]


@dataclass(frozen=True)
class Catalogue:
    """One catalogue: its source name, parser and where its files lie in an events folder.

    Adding a catalogue is one module (its ``parse_<name>(path) -> ParseResult``) and one
    ``Catalogue(...)`` line in :data:`CATALOGUES` (README, "Adding a catalogue").

    Attributes
    ----------
    source : str
        ``Event.source`` of its events (at most 32 characters; letters, digits, ``_``).
    parse : callable
        ``parse(path) -> ParseResult`` of one file.
    folder : str
        Its folder in an events folder (``lstdp import-events <dir>``).
    pattern : str
        Glob of its files in that folder.
    title : str
        What it is, for people (messages, coverage).
    coverage : callable, optional
        ``coverage(path) -> pipelines.catalogues.coverage.FileCoverage``: the span a file says
        it covers. Optional for a new catalogue (the built-in ones have theirs in
        :data:`pipelines.catalogues.coverage.COVERAGE_READERS`); without one a file covers
        nothing known, and the coverage says so.
    observatory, instrument : str, optional
        HEK ``obs_observatory`` / ``obs_instrument`` of its events, when they all come from
        one instrument (:func:`backend.services.event_formats.observation`).
    """

    source: str
    parse: Callable[[str | os.PathLike], ParseResult]
    folder: str
    pattern: str
    title: str
    coverage: Callable | None = None
    observatory: str | None = None
    instrument: str | None = None


#: The catalogues, in the order ``import_all`` imports them (the WST-GOES flare links are
#: made after either is imported, so the order does not matter).
CATALOGUES: dict[str, Catalogue] = {
    c.source: c
    for c in (
        Catalogue("lst_wst", parse_lst_wst, "aso-s_lst_wst", "*.txt", "LST/WST white-light flares (Jing et al. 2024)"),
        Catalogue("goes_xrs", parse_goes_xrs, "goes_xrs_reports", "*.txt", "NOAA/NGDC GOES XRS flare reports"),
        Catalogue("cdaw", parse_cdaw, "cdaw", "*.txt", "CDAW SOHO/LASCO CME catalogue"),
        Catalogue("hek", parse_hek, "hek", "*.json", "HEK API responses"),
        Catalogue("donki", parse_donki, "donki", "*.json", "NASA CCMC DONKI CMEs"),
        Catalogue("noaa_srs", parse_noaa_srs, "noaa_srs", "*SRS.txt", "NOAA Solar Region Summaries"),
        Catalogue("stix", parse_stix, "stix", "STIX_flarelist*.csv", "Solar Orbiter/STIX flare list (Hayes et al.)"),
    )
}


#: ``Event.source`` of the events the platform's own detectors store (``pipelines.detect``).
DETECTED_SOURCE = "detected"

#: Every ``Event.source`` the platform knows: the detectors' and the catalogues' (in
#: :data:`CATALOGUES` order).
SOURCES: tuple[str, ...] = (DETECTED_SOURCE, *CATALOGUES)


def catalogue_files(source: str, path: str | os.PathLike) -> list[Path]:
    """The files of catalogue ``source`` at ``path``.

    ``path`` may be one file, the catalogue's own folder (e.g. ``goes_xrs_reports/``) or an
    events folder holding the catalogue folders. Files are returned sorted by name.

    Raises
    ------
    KeyError
        For an unknown source.
    CatalogueError
        If ``path`` does not exist.
    """
    cat = CATALOGUES[source]
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise CatalogueError(f"no such file or folder: {p}")
    folder = p / cat.folder if (p / cat.folder).is_dir() else p
    return sorted(f for f in folder.glob(cat.pattern) if f.is_file())


def parse_catalogue(source: str, path: str | os.PathLike) -> ParseResult:
    """Parse every file of catalogue ``source`` at ``path`` into one result.

    Parameters
    ----------
    source : str
        ``lst_wst``, ``goes_xrs``, ``cdaw``, ``hek``, ``donki``, ``noaa_srs`` or ``stix``.
    path : path-like
        A file, the catalogue folder or the events folder (see :func:`catalogue_files`).

    Returns
    -------
    ParseResult
        Events, refusals and row counts of all files together.

    Raises
    ------
    KeyError
        For an unknown source.
    CatalogueError
        If a file cannot be read, no file is found, or every row of a file is refused
        (the message gives the commonest reasons with their counts).
    """
    if source not in CATALOGUES:
        raise KeyError(f"unknown catalogue {source!r}; expected one of {', '.join(CATALOGUES)}")
    files = catalogue_files(source, path)
    if not files:
        raise CatalogueError(f"no {source} files ({CATALOGUES[source].pattern}) at {path}")
    total = ParseResult(source=source, path=str(path))
    for f in files:
        one = CATALOGUES[source].parse(f)
        if one.rows_in and not one.events:
            reasons = "; ".join(f"{n} x {why}" for why, n, _ in refusal_summary(one.refused, 3))
            raise CatalogueError(f"{source}: every one of the {one.rows_in} rows of {f.name} was refused ({reasons})")
        total.extend(one)
    return total.check()
