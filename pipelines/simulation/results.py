"""What :func:`pipelines.simulation.simulate` returns: the frames, masters and flare it wrote."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class CalibrationFileInfo:
    """One calibration master written by :func:`~pipelines.simulation.simulate`."""

    path: Path
    kind: str
    channel: str
    version: int
    valid_from: str
    valid_to: str
    description: str
    sha256: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InjectedFlare:
    """The flare injected into the SDI series (times ISO 8601 UTC; position helioprojective).

    ``peak_enhancement`` is fractional: the flare multiplies the pre-flare brightness by
    ``1 + peak_enhancement * G`` at its peak, G a unit-height Gaussian of ``sigma_arcsec``.
    ``profile`` lists (DATE-OBS, enhancement at the kernel) for every frame of the series.
    """

    channel: str
    start: str
    peak: str
    end: str
    hpc_x: float
    hpc_y: float
    peak_enhancement: float
    sigma_arcsec: float
    decay_time_s: float
    profile: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class SimulatedFrame:
    """One raw frame and its truth."""

    channel: str
    raw_path: Path
    truth_path: Path
    date_obs: str
    exptime_s: float
    naxis: int
    plate_scale: float
    crpix: tuple[float, float]
    crota2: float
    rsun_arcsec: float
    scene: str
    peak_dn: int
    notes: list[str] = field(default_factory=list)
    #: CRPIX1/2 written in the raw header (1-based); differs from the true ``crpix`` by the
    #: pointing error of ``simulate(pointing_error_px=...)``, equal to it otherwise.
    header_crpix: tuple[float, float] | None = None


@dataclass
class SimulationResult:
    """What :func:`~pipelines.simulation.simulate` wrote."""

    out_dir: Path
    raw_files: list[Path]
    truth_files: list[Path]
    calibration_files: list[CalibrationFileInfo]
    manifest_path: Path
    flare: InjectedFlare | None
    frames: list[SimulatedFrame]
    limb_fits: list[dict[str, Any]] = field(default_factory=list)
    radiometric: dict[str, float] = field(default_factory=dict)
    flares: list[InjectedFlare] = field(default_factory=list)  # every injected flare; ``flare`` is the first

    @property
    def injected_flare(self) -> dict[str, Any] | None:
        """The injected flare as a JSON-ready dict (``start``/``peak``/``end`` ISO UTC,
        ``hpc_x``/``hpc_y`` [arcsec], ``peak_enhancement``, ...), or ``None``."""
        return dataclasses.asdict(self.flare) if self.flare is not None else None
