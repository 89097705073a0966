"""Detection gates on injected events of known truth (a small run of
``benchmarks/validate_detection.py``; the full run writes
``benchmarks/reports/detection_validation.md``).

Gates: flare recall and precision >= 0.9 for injected enhancements above 3 sigma (with
injections below 3 sigma in the same sequences); CME recall >= 0.8 with PA within 10 deg and
speed within 20 %.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.validate_detection import (
    CME_CASES,
    FLARE_SIGMAS,
    validate_cmes,
    validate_flares,
)


def test_flare_gate_above_3_sigma():
    r = validate_flares(n_sequences=2, seed=7)
    assert r.n_truth == 8  # 4 of the 6 amplitudes per sequence are above 3 sigma
    assert any(k < 3 for k in FLARE_SIGMAS) and any(k > 3 for k in FLARE_SIGMAS)
    assert r.recall >= 0.9, r.extra
    assert r.precision >= 0.9, (r.n_true_detections, r.n_detections)
    # found at the injected peak frame, within 2 frames, and within 30 arcsec
    assert max(abs(t) for t in r.timing_err_s) <= 2 * 120.0
    assert max(r.position_err_arcsec) <= 30.0
    # the 1.5-sigma injections are below the detection limit
    assert r.extra["recall_by_sigma"][1.5][0] == 0


def test_cme_gate():
    cases = [CME_CASES[i] for i in (0, 3, 4, 7)]  # N, SE-fast, S-narrow, two CMEs in one sequence
    r = validate_cmes(cases, n_frames=14, quiet=0)
    assert r.n_truth == 5
    assert r.recall >= 0.8
    assert r.precision >= 0.8
    assert np.median(r.pa_err_deg) <= 10.0 and np.median(r.speed_err_rel) <= 0.2
