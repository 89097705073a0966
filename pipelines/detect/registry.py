"""The platform's event detectors, one :class:`Detector` entry each (like
:data:`pipelines.catalogues.CATALOGUES` for the catalogues).

=========== ============================ ==== ============== ======= ==========================
name        frm_name                     type channels       default detect function
=========== ============================ ==== ============== ======= ==========================
flares      ``lst-sdi-flare``            FL   SDI            SDI     ``flares.detect_flares``
cmes        ``lst-sci-cme``              CE   SCI-UV, SCI-WL SCI-UV  ``cme.detect_cmes``
prominences ``lst-prominence-eruption``  PR   SDI, SCI-UV    SDI     ``prominence.detect_prominence_eruptions``
white-light ``lst-wst-wlf``              FL   WST            WST     ``whitelight.detect_white_light_flares``
=========== ============================ ==== ============== ======= ==========================

The names are those of ``lstdp detect --kind``. Pure: no database, no settings, nothing
from ``backend``. The service layer (:func:`backend.services.detection.run_detector`) looks
a detector up here, checks the channel and calls its service function (the platform's map
``backend.services.detection.SERVICES``, by registry name), which reads the written L2
products and stores what the detector finds as events.

Adding a detector
-----------------
1. Its module in ``pipelines/detect/``: a pure detect function, a frozen parameters
   dataclass, and ``DETECTOR_NAME`` (HEK ``frm_name``) / ``DETECTOR_VERSION``.
2. One :class:`Detector` line in :data:`DETECTORS` (its module is imported on first use);
   and, if it should run by itself after a calibration job over its channels, its
   ``(name, channel)`` pairs in :data:`pipelines.detect.follow_ups.FOLLOW_UPS`.
3. Its service function in :mod:`backend.services.detection`, one line in its ``SERVICES``
   map (registry name -> function), called as ``fn(session, *, channel, start, end, params,
   product_root) -> list[Event]``: the loading of one kind of input series
   (``_run_sequence_detector``: block-averaged limb/coronal stacks; ``_lazy_series``:
   full-resolution image series read on demand) and the event rows. A detector on a new
   kind of input series needs a new loader there.

Its events are ``source="detected"`` (:data:`pipelines.catalogues.DETECTED_SOURCE`), told
apart by ``frm_name``: that source's names, observatory and instrument are its one entry
:data:`pipelines.catalogues.DETECTED`, so a new detector touches no coverage, export or
association map.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pipelines.detect.follow_ups import FOLLOW_UPS, follow_ups  # noqa: F401 - re-exported

__all__ = ["Detector", "DETECTORS", "FOLLOW_UPS", "get_detector", "follow_ups"]


@dataclass(frozen=True)
class Detector:
    """One detector of the platform.

    What is data here (name, event type, channels, label, description) needs no import; what
    comes from the detector's module (``frm_name``, ``version``, the detect function and the
    default parameters) loads that module on first use, so that ``lstdp --help``, the
    reconciler and the job planner load no detector (and with them no SciPy or astropy).

    Attributes
    ----------
    name : str
        Registry name (``lstdp detect --kind``).
    module : str
        The detector's module in ``pipelines.detect`` (``flares``).
    event_type : str
        HEK event type of its events.
    channels : tuple of str
        LST channels it runs on.
    default_channel : str
        The channel used when none is given (one of ``channels``).
    function : str
        The name of the pure detect function in ``module``.
    make_params : callable
        ``make_params(module, channel) -> params``: the default parameters object on a channel.
    label : str
        What it finds, plural (``CMEs``), for messages.
    description : str
        One line for users.
    """

    name: str
    module: str
    event_type: str
    channels: tuple[str, ...]
    default_channel: str
    function: str
    make_params: Callable[[ModuleType, str], Any]
    label: str
    description: str

    def __post_init__(self) -> None:
        if self.default_channel not in self.channels:
            raise ValueError(f"{self.name}: default channel {self.default_channel} is not one of {self.channels}")

    @property
    def code(self) -> ModuleType:
        """The detector's module (imported on first use)."""
        return importlib.import_module(f"pipelines.detect.{self.module}")

    @property
    def frm_name(self) -> str:
        """HEK ``frm_name`` of the events it stores (the module's ``DETECTOR_NAME``)."""
        return self.code.DETECTOR_NAME

    @property
    def version(self) -> str:
        """Version of the events it stores (the module's ``DETECTOR_VERSION``)."""
        return self.code.DETECTOR_VERSION

    @property
    def detect(self) -> Callable[..., Any]:
        """The pure detect function."""
        return getattr(self.code, self.function)

    def default_params(self, channel: str) -> Any:
        """``default_params(channel) -> params``: the default parameters object on ``channel``."""
        return self.make_params(self.code, channel)

    def channel(self, channel: str | None = None) -> str:
        """``channel``, or the default one when None.

        Raises
        ------
        ValueError
            For a channel the detector does not run on.
        """
        if channel is None:
            return self.default_channel
        if channel not in self.channels:
            raise ValueError(f"{self.label} are detected on {' or '.join(self.channels)}, not {channel!r}")
        return channel

    def params(self, channel: str | None = None) -> Any:
        """The default parameters on ``channel`` (default: :attr:`default_channel`)."""
        return self.default_params(self.channel(channel))


def _prominence_params(module: ModuleType, channel: str) -> Any:
    return module.ProminenceParams.sdi() if channel == "SDI" else module.ProminenceParams.sci_uv()


#: The detectors by name, in the order ``lstdp detect --help`` lists them.
DETECTORS: dict[str, Detector] = {
    d.name: d
    for d in (
        Detector("flares", "flares", "FL", ("SDI",), "SDI", "detect_flares",
                 lambda module, channel: module.FlareDetectionParams(),
                 "flares", "Lyman-alpha flares on SDI full-disk series (macropixel running background)"),
        Detector("cmes", "cme", "CE", ("SCI-UV", "SCI-WL"), "SCI-UV", "detect_cmes",
                 lambda module, channel: module.CMEParams(),
                 "CMEs", "coronal mass ejections in SCI coronagraph series (height-time tracks)"),
        Detector("prominences", "prominence", "PR", ("SDI", "SCI-UV"), "SDI", "detect_prominence_eruptions",
                 _prominence_params,
                 "prominence eruptions", "prominence eruptions above the limb (SDI 1.02-1.2 Rsun, SCI-UV 1.15-2.45 Rsun)"),
        Detector("white-light", "whitelight", "FL", ("WST",), "WST", "detect_white_light_flares",
                 lambda module, channel: module.WhiteLightParams(),
                 "white-light flares",
                 "white-light flares on WST 360 nm series (8 % over the pre-flare level, Jing et al. 2024)"),
    )
}


def get_detector(name: str) -> Detector:
    """The detector called ``name``.

    Raises
    ------
    KeyError
        For an unknown name (the message lists the known ones).
    """
    try:
        return DETECTORS[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown detector {name!r}; expected one of {', '.join(DETECTORS)}") from None


for _name, _channel in FOLLOW_UPS:  # a follow-up names a detector and one of its channels
    get_detector(_name).channel(_channel)
del _name, _channel
