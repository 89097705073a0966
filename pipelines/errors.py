"""One base error and one base warning for the pipelines (and the platform).

``DataError`` subclasses describe bad input: they are never retried, the file or job is
rejected with the message. Transient faults (database locked, broker down) are not
``LSTDPError`` and may be retried by the Celery tasks.
"""

__all__ = [
    "LSTDPError",
    "DataError",
    "FitsReadError",
    "NotLSTFrameError",
    "CalibrationMissingError",
    "LSTDPWarning",
    "CalibrationDistanceWarning",
    "HeaderFixWarning",
]


class LSTDPError(Exception):
    """Base class of every error the platform raises on purpose."""


class DataError(LSTDPError):
    """The input data cannot be used; retrying will not help."""


class FitsReadError(DataError):
    """A file is not a readable FITS image (the message says why, in one line)."""


class NotLSTFrameError(DataError):
    """A readable FITS file that is not a frame of one of LST's four channels."""


class CalibrationMissingError(DataError):
    """No calibration file of a needed kind is valid at the frame's DATE-OBS."""


class LSTDPWarning(UserWarning):
    """Base class of every warning the platform emits."""


class CalibrationDistanceWarning(LSTDPWarning):
    """The chosen calibration file was made far in time from the frame."""


class HeaderFixWarning(LSTDPWarning):
    """A header quirk was repaired on read (non-ISO date, solar_x CTYPE, ...)."""
