"""Per-channel departures of the simulated instrument from the simulator's own model shapes.

The simulator's default shapes (a pure power-law stray light, the radial coronal models of
:mod:`pipelines.simulation.models`, an occulter centred on the Sun, a header roll that is the
true roll) are one model family among several. A :class:`ChannelVariant` passed to
:func:`pipelines.simulation.simulate` (``variants={channel: ChannelVariant(...)}``) replaces
them for one channel; the families and their drawn parameters live in the validation
(``validation/families.py``), which the science never imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

__all__ = ["ChannelVariant"]


@dataclass(frozen=True)
class ChannelVariant:
    """What one channel's simulation does differently from the simulator's own shapes.

    Attributes
    ----------
    stray : object with ``brightness(rho) -> ndarray``, optional
        The injected SCI stray light [MSB] as a function of the heliocentric distance
        ``rho`` [Rsun] (array, any shape), in the truth's ``STRAY`` extension and in the raw
        frames. ``None``: :func:`pipelines.simulation.forward.stray_light_model`. The
        simulator's *given* stray-light master stays the nominal power law either way.
    corona_factor : callable, optional
        ``f(r) -> ndarray``: a radial factor [dimensionless] on the K corona (SCI-WL: the
        K term only, the F corona unchanged; SCI-UV: the Ly-alpha corona), ``r`` [Rsun] >= 1.
        ``None``: factor 1.
    occulter_offset_px : (float, float)
        Centre of the occulter and field-stop aperture minus the Sun centre (dx, dy) [pixel
        of the frame] on the detector (SCI). The stray light stays centred on the Sun.
    roll_error_deg : float
        Header ``CROTA`` minus the true roll [deg]: the header's roll is wrong by this.
    """

    stray: Any = None
    corona_factor: Callable[[np.ndarray], np.ndarray] | None = None
    occulter_offset_px: tuple[float, float] = (0.0, 0.0)
    roll_error_deg: float = 0.0
