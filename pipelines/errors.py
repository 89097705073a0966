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
    "CatalogueWarning",
    "failure_reason",
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


class CatalogueWarning(LSTDPWarning):
    """A catalogue file was read with a repair (undecodable bytes, a truncated response)."""


def failure_reason(exc: BaseException) -> str:
    """The one-line reason recorded for a failed product, frame or file.

    An :class:`LSTDPError` (raised on purpose: bad data, a missing calibration, no array
    backend) gives its message's first line; anything else (a bug, a device or disk fault)
    is prefixed with its type so that it is told apart from bad data. Not cut to a length:
    where it is stored, the store's one rule applies (``backend.state.MAX_REASON_CHARS``).
    """
    first = str(exc).splitlines()[0] if str(exc) else ""
    if isinstance(exc, LSTDPError):
        return first or type(exc).__name__
    return f"{type(exc).__name__}: {first}"
