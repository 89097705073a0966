"""Parsers of external solar-event catalogues, one pure function per catalogue.

Each ``parse_<name>(path) -> ParseResult`` reads one file and returns
:class:`~pipelines.catalogues.records.EventRecord` rows (mirroring ``backend.models.Event``),
the refused rows with a reason each, and the number of data rows read. No database, no
settings: the import service (``backend.services.events``) stores the records.

This package is also the registry of event sources: one :class:`Catalogue` entry per
catalogue (:data:`CATALOGUES`) and one :class:`DetectedSource` entry for the platform's own
detections (:data:`DETECTED`) hold everything the platform says about a source besides its
events: its names (coverage messages, association reasons), its observatory and instrument
(exports), its parser and coverage reader. The parsers and readers are named as
``"module:function"`` strings and imported on first use (:class:`LazyFunction`): importing
this package (as ``backend.models`` does, through :mod:`~pipelines.catalogues.records`)
loads no parser.

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

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.catalogues.records import (
    AssociationRecord,
    CatalogueError,
    EventRecord,
    ParseResult,
    full_noaa_number,
    refusal_summary,
)

__all__ = [
    "EventRecord",
    "AssociationRecord",
    "ParseResult",
    "CatalogueError",
    "LazyFunction",
    "Catalogue",
    "CATALOGUES",
    "DetectedSource",
    "DETECTED",
    "DETECTED_SOURCE",
    "SOURCES",
    "source_entry",
    "source_label",
    "association_label",
    "source_observation",
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


class LazyFunction:
    """A function named ``"package.module:function"``, imported on its first call.

    Calling it calls the function (``LazyFunction("pipelines.catalogues.cdaw:parse_cdaw")(path)``
    is ``parse_cdaw(path)``); :meth:`resolve` gives the function itself.

    Raises
    ------
    ValueError
        If ``target`` is not ``"module:function"``.
    ImportError, AttributeError
        On first use, if the module or the function does not exist.
    """

    __slots__ = ("target", "_fn")

    def __init__(self, target: str) -> None:
        module, sep, name = target.partition(":")
        if not (module and sep and name.isidentifier()):
            raise ValueError(f"{target!r} is not 'package.module:function'")
        self.target = target
        self._fn: Callable | None = None

    @property
    def module(self) -> str:
        """The module's dotted name (imported on first use)."""
        return self.target.partition(":")[0]

    @property
    def name(self) -> str:
        """The function's name in its module."""
        return self.target.partition(":")[2]

    def resolve(self) -> Callable:
        """The function (its module imported now if not yet)."""
        if self._fn is None:
            self._fn = getattr(importlib.import_module(self.module), self.name)
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyFunction) and other.target == self.target

    def __hash__(self) -> int:
        return hash(self.target)

    def __repr__(self) -> str:
        return f"LazyFunction({self.target!r})"


def _lazy(fn: Callable | str | None) -> Callable | None:
    return LazyFunction(fn) if isinstance(fn, str) else fn


@dataclass(frozen=True)
class Catalogue:
    """One catalogue: its source name, parser, files, names and instrument.

    Adding a catalogue is one module (its ``parse_<name>(path) -> ParseResult``) and one
    ``Catalogue(...)`` line in :data:`CATALOGUES` (README, "Adding a catalogue"); coverage,
    exports and association reasons read the entry.

    Attributes
    ----------
    source : str
        ``Event.source`` of its events (at most 32 characters; letters, digits, ``_``).
    parse : callable or str
        ``parse(path) -> ParseResult`` of one file, or its ``"module:function"`` name
        (imported on first use: stored as a :class:`LazyFunction`).
    folder : str
        Its folder in an events folder (``lstdp import-events <dir>``).
    pattern : str
        Glob of its files in that folder.
    title : str
        What it is, for people (import messages, the coverage's description).
    coverage : callable or str, optional
        ``coverage(path) -> pipelines.catalogues.coverage.FileCoverage``: the span a file says
        it covers (or its ``"module:function"`` name). Without one a file covers nothing known,
        and the coverage says so.
    observatory, instrument : str, optional
        HEK ``obs_observatory`` / ``obs_instrument`` of its events, when they all come from
        one instrument (:func:`backend.services.event_formats.observation`; HEK and DONKI
        rows name their own).
    label : str, optional
        Its short name in coverage messages ("CDAW: no coverage after 2013-12-31");
        default the title.
    association_label : str, optional
        How association reasons name it ("stated by CDAW (LASCO): ..."); default the source.
    """

    source: str
    parse: Callable[[str | os.PathLike], ParseResult] | str
    folder: str
    pattern: str
    title: str
    coverage: Callable | str | None = None
    observatory: str | None = None
    instrument: str | None = None
    label: str | None = None
    association_label: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "parse", _lazy(self.parse))
        object.__setattr__(self, "coverage", _lazy(self.coverage))


def _cat(source: str, folder: str, pattern: str, title: str, label: str, association_label: str,
         observatory: str | None = None, instrument: str | None = None) -> Catalogue:
    """A built-in catalogue: parser ``pipelines.catalogues.<source>:parse_<source>``, coverage
    reader ``pipelines.catalogues.coverage:<source>_coverage``."""
    return Catalogue(source, f"pipelines.catalogues.{source}:parse_{source}", folder, pattern, title,
                     coverage=f"pipelines.catalogues.coverage:{source}_coverage", observatory=observatory,
                     instrument=instrument, label=label, association_label=association_label)


#: The catalogues, in the order ``import_all`` imports them (the WST-GOES flare links are
#: made after either is imported, so the order does not matter).
CATALOGUES: dict[str, Catalogue] = {
    c.source: c
    for c in (
        _cat("lst_wst", "aso-s_lst_wst", "*.txt", "LST/WST white-light flares (Jing et al. 2024)",
             "LST/WST flare list", "LST/WST", "ASO-S", "LST"),
        _cat("goes_xrs", "goes_xrs_reports", "*.txt", "NOAA/NGDC GOES XRS flare reports",
             "GOES XRS", "GOES", "GOES", "XRS"),
        _cat("cdaw", "cdaw", "*.txt", "CDAW SOHO/LASCO CME catalogue", "CDAW", "CDAW (LASCO)", "SOHO", "LASCO"),
        _cat("hek", "hek", "*.json", "HEK API responses", "HEK", "HEK"),
        _cat("donki", "donki", "*.json", "NASA CCMC DONKI CMEs", "DONKI", "DONKI"),
        _cat("noaa_srs", "noaa_srs", "*SRS.txt", "NOAA Solar Region Summaries", "NOAA SRS", "NOAA SRS",
             "NOAA SWPC", "SRS"),
        _cat("stix", "stix", "STIX_flarelist*.csv", "Solar Orbiter/STIX flare list (Hayes et al.)",
             "STIX", "STIX", "Solar Orbiter", "STIX"),
    )
}


#: ``Event.source`` of the events the platform's own detectors store (``pipelines.detect``).
DETECTED_SOURCE = "detected"


@dataclass(frozen=True)
class DetectedSource:
    """The platform's own detections as an event source: the fields of a :class:`Catalogue`
    that are not about files. Every detector of :data:`pipelines.detect.registry.DETECTORS`
    stores its events under this one source (told apart by ``frm_name``), so a new detector
    adds nothing here.

    Attributes
    ----------
    source, title, label, association_label, observatory, instrument : str
        As in :class:`Catalogue`.
    """

    source: str
    title: str
    label: str
    association_label: str
    observatory: str
    instrument: str


#: The detectors' source (:data:`DETECTED_SOURCE`): its names and instrument.
DETECTED = DetectedSource(DETECTED_SOURCE, "Events detected on LST L2 products (pipelines.detect)",
                          "LST detections", "LST", "ASO-S", "LST")

#: Every ``Event.source`` the platform knows: the detectors' and the catalogues' (in
#: :data:`CATALOGUES` order).
SOURCES: tuple[str, ...] = (DETECTED_SOURCE, *CATALOGUES)


def source_entry(source: str) -> Catalogue | DetectedSource | None:
    """The registry entry of ``source``: :data:`DETECTED` or its :data:`CATALOGUES` entry
    (None for a source the platform does not know)."""
    return DETECTED if source == DETECTED_SOURCE else CATALOGUES.get(source)


def source_label(source: str) -> str:
    """``source``'s short name in coverage messages (its entry's ``label``, else its title;
    the source itself for an unknown one)."""
    entry = source_entry(source)
    return (entry.label or entry.title) if entry is not None else source


def association_label(source: str) -> str:
    """How association reasons name ``source`` (its entry's ``association_label``, else the
    source itself)."""
    entry = source_entry(source)
    return (entry.association_label if entry is not None else None) or source


def source_observation(source: str) -> tuple[str | None, str | None]:
    """``(observatory, instrument)`` of ``source``'s entry; ``(None, None)`` when its events
    do not all come from one instrument (HEK, DONKI) or the source is unknown."""
    entry = source_entry(source)
    return (entry.observatory, entry.instrument) if entry is not None else (None, None)


def __getattr__(name: str) -> Callable:
    """``parse_<name>`` of a registered catalogue, its module imported now (PEP 562: the
    parsers load on first use, not with this package)."""
    for cat in CATALOGUES.values():
        if isinstance(cat.parse, LazyFunction) and cat.parse.name == name:
            return cat.parse.resolve()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
