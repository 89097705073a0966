"""Which detections follow a calibration job: the ``(detector, channel)`` pairs, as data.

Kept apart from :mod:`pipelines.detect.registry` so that planning and ending jobs
(:mod:`backend.services.job_plan`, the reconciler) needs no registry at all. The registry
re-exports both names and checks at its import that each pair names one of its detectors and
one of that detector's channels (``tests/test_detector_registry.py`` too).
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["FOLLOW_UPS", "follow_ups"]

#: ``(detector, channel)`` run after a calibration job over the channel, in the order they
#: are queued (detector names of :data:`pipelines.detect.registry.DETECTORS`).
FOLLOW_UPS: tuple[tuple[str, str], ...] = (
    ("flares", "SDI"),
    ("prominences", "SDI"),
    ("cmes", "SCI-UV"),
    ("cmes", "SCI-WL"),
    ("prominences", "SCI-UV"),
    ("white-light", "WST"),
)


def follow_ups(channels: Collection[str]) -> list[tuple[str, str]]:
    """The ``(detector name, channel)`` pairs to run after a calibration job over ``channels``,
    in queue order (:data:`FOLLOW_UPS`)."""
    return [(name, channel) for name, channel in FOLLOW_UPS if channel in channels]
