"""Level 2: the per-frame calibration chain, run on every raw frame.

:mod:`~pipelines.calibration.l2.steps` the steps (pure: array and header in, array and header
out), :mod:`~pipelines.calibration.l2.flow` the flow that composes them per channel
(:func:`~pipelines.calibration.l2.flow.calibrate_frame`), :mod:`~pipelines.calibration.l2.options`
the job options, :mod:`~pipelines.calibration.l2.batch` the GPU batch executor,
:mod:`~pipelines.calibration.l2.kernels` the fused GPU kernels,
:mod:`~pipelines.calibration.l2.resample` north-up resampling,
:mod:`~pipelines.calibration.l2.uncertainty` the per-pixel uncertainty,
:mod:`~pipelines.calibration.l2.centre` the Sun's centre from the frame (limb / occulter fit),
:mod:`~pipelines.calibration.l2.cosmics` cosmic rays and hot pixels,
:mod:`~pipelines.calibration.l2.quality` the frame-wide systematics flagged (``QUALITY``).

The chain applies masters (:mod:`pipelines.calibration.masters`); it never imports the
simulator or :mod:`validation`.
"""
