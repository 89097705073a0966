"""Validation campaigns of the science against a simulated world whose truth is known.

Not part of the product: nothing under ``pipelines/`` or ``backend/`` imports it
(``tests/test_architecture.py``). It may import the simulator (:mod:`pipelines.simulation`)
and the science. Run by ``benchmarks/validate_calibration.py``,
``benchmarks/validate_detection.py`` and the tests under ``tests/validation/`` (marker
``validation``).

:mod:`~validation.gates`
    The L2 chain against the simulator's truth: the measurements and the gates
    (:data:`~validation.gates.GATES`).
:mod:`~validation.blind_chain`, :mod:`~validation.blind_flat`, :mod:`~validation.blind_centre`,
:mod:`~validation.blind_stray`, :mod:`~validation.blind_units`, :mod:`~validation.blind_radiometry`
    Blind campaigns: masters derived from simulated calibration sequences with hidden
    instrument parameters, the chain scored against the truth.
:mod:`~validation.synthetic`
    In-memory scenes with injected CMEs and prominence eruptions, for the detectors' tests
    and validation.
"""
