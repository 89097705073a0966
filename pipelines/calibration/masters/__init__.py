"""Calibration masters: derived once per epoch from calibration sequences, each a new
calibration version that the L2 chain (:mod:`pipelines.calibration.l2`) applies.

:mod:`~pipelines.calibration.masters.flatfield` the flat-field master (KLL or sub-pixel),
:mod:`~pipelines.calibration.masters.kll` the Kuhn-Lin-Loranz flat,
:mod:`~pipelines.calibration.masters.subpixel_flat` the sub-pixel-dither flat,
:mod:`~pipelines.calibration.masters.limb` the image-only solar-limb fit the flat uses to
register its dithers, :mod:`~pipelines.calibration.masters.stray_light` the stray-light map,
:mod:`~pipelines.calibration.masters.radiometry` the radiometric coefficient and its
cross-calibration, :mod:`~pipelines.calibration.masters.psf` the PSF master.

Never imports the simulator or :mod:`validation`.
"""
