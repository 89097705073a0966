"""Time series of other observatories read for context (GOES XRS); pure readers, no database."""

from pipelines.timeseries.goes_xrs import XRSSeries, XRSReadError, read_goes_xrs

__all__ = ["XRSSeries", "XRSReadError", "read_goes_xrs"]
