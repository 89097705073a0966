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
2. One :class:`Detector` line in :data:`DETECTORS`; and, if it should run by itself after
   a calibration job over its channels, its ``(name, channel)`` pairs in :data:`FOLLOW_UPS`.
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

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from pipelines.detect import cme, flares, prominence, whitelight

__all__ = ["Detector", "DETECTORS", "FOLLOW_UPS", "get_detector", "follow_ups"]


@dataclass(frozen=True)
class Detector:
    """One detector of the platform.

    Attributes
    ----------
    name : str
        Registry name (``lstdp detect --kind``).
    frm_name, version : str
        HEK ``frm_name`` and version of the events it stores (the module's
        ``DETECTOR_NAME``/``DETECTOR_VERSION``).
    event_type : str
        HEK event type of its events.
    channels : tuple of str
        LST channels it runs on.
    default_channel : str
        The channel used when none is given (one of ``channels``).
    detect : callable
        The pure detect function.
    default_params : callable
        ``default_params(channel) -> params``: the default parameters object on a channel.
    label : str
        What it finds, plural (``CMEs``), for messages.
    description : str
        One line for users.
    """

    name: str
    frm_name: str
    version: str
    event_type: str
    channels: tuple[str, ...]
    default_channel: str
    detect: Callable[..., Any]
    default_params: Callable[[str], Any]
    label: str
    description: str

    def __post_init__(self) -> None:
        if self.default_channel not in self.channels:
            raise ValueError(f"{self.name}: default channel {self.default_channel} is not one of {self.channels}")

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


def _prominence_params(channel: str) -> prominence.ProminenceParams:
    return prominence.ProminenceParams.sdi() if channel == "SDI" else prominence.ProminenceParams.sci_uv()


#: The detectors by name, in the order ``lstdp detect --help`` lists them.
DETECTORS: dict[str, Detector] = {
    d.name: d
    for d in (
        Detector("flares", flares.DETECTOR_NAME, flares.DETECTOR_VERSION, "FL", ("SDI",), "SDI",
                 flares.detect_flares, lambda channel: flares.FlareDetectionParams(),
                 "flares", "Lyman-alpha flares on SDI full-disk series (macropixel running background)"),
        Detector("cmes", cme.DETECTOR_NAME, cme.DETECTOR_VERSION, "CE", ("SCI-UV", "SCI-WL"), "SCI-UV",
                 cme.detect_cmes, lambda channel: cme.CMEParams(),
                 "CMEs", "coronal mass ejections in SCI coronagraph series (height-time tracks)"),
        Detector("prominences", prominence.DETECTOR_NAME, prominence.DETECTOR_VERSION, "PR", ("SDI", "SCI-UV"),
                 "SDI", prominence.detect_prominence_eruptions, _prominence_params,
                 "prominence eruptions", "prominence eruptions above the limb (SDI 1.02-1.2 Rsun, SCI-UV 1.15-2.45 Rsun)"),
        Detector("white-light", whitelight.DETECTOR_NAME, whitelight.DETECTOR_VERSION, "FL", ("WST",), "WST",
                 whitelight.detect_white_light_flares, lambda channel: whitelight.WhiteLightParams(),
                 "white-light flares",
                 "white-light flares on WST 360 nm series (8 % over the pre-flare level, Jing et al. 2024)"),
    )
}

#: ``(detector, channel)`` run after a calibration job over the channel, in the order they
#: are queued.
FOLLOW_UPS: tuple[tuple[str, str], ...] = (
    ("flares", "SDI"),
    ("prominences", "SDI"),
    ("cmes", "SCI-UV"),
    ("cmes", "SCI-WL"),
    ("prominences", "SCI-UV"),
    ("white-light", "WST"),
)


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


def follow_ups(channels: Collection[str]) -> list[tuple[str, str]]:
    """The ``(detector name, channel)`` pairs to run after a calibration job over ``channels``,
    in queue order (:data:`FOLLOW_UPS`)."""
    return [(name, channel) for name, channel in FOLLOW_UPS if channel in channels]


for _name, _channel in FOLLOW_UPS:  # a follow-up names a detector and one of its channels
    get_detector(_name).channel(_channel)
del _name, _channel
