"""A poison frame (issue #10): its calibration kills the worker process every time
(``LSTDP_FAULTS_POISON`` of :mod:`tests.faults.worker_main`: SIGKILL from inside the
science step, after the product is ``writing``).

Done when: the job ends (no infinite loop: at most ``MAX_DELIVERIES`` calibrations of the
poison frame start), with that frame's product ``failed`` and a reason that names the
deliveries, every other frame written, and the invariants of the other scenarios.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from backend.db import session_scope
from backend.models import Frame, Product, ProductState
from tests.faults import harness as H

pytestmark = [pytest.mark.faults, pytest.mark.slow]

FRAMES = 30
POISON_FRAME = 5


def test_poison_frame_fails_after_max_deliveries(scenario):
    poison = H.frame_name(POISON_FRAME)
    max_deliveries = int(scenario.env["MAX_DELIVERIES"])
    scenario.worker(LSTDP_FAULTS_POISON=poison)
    job = scenario.submit(FRAMES)
    t_submit = time.monotonic()
    view, _, violations = scenario.finish(job, scenario.bound(), since=t_submit)

    events = H.read_journal(scenario.journal)
    kills = sum(1 for e in events if e["ev"] == "poison_kill")
    with session_scope() as s:
        rows = s.execute(select(Frame.original_name, Product.state, Product.error).join(Product)).all()
    scenario.note(f"poison frame killed its process {kills} times; job {view}")
    if kills > max_deliveries:
        violations.append(f"the poison frame was calibrated {kills} times (MAX_DELIVERIES {max_deliveries})")
    bad = [r for r in rows if r.original_name == poison]
    if len(bad) != 1 or bad[0].state != ProductState.failed:
        violations.append(f"poison frame's products: {[(r.state.value, r.error) for r in bad]} (expected one failed)")
    elif "deliver" not in (bad[0].error or "").lower():
        violations.append(f"poison frame failed with a reason that names no deliveries: {bad[0].error!r}")
    others = [r for r in rows if r.original_name != poison]
    not_written = [r.original_name for r in others if r.state != ProductState.written]
    if len(others) != FRAMES - 1 or not_written:
        violations.append(f"{len(others)} other products, not written: {not_written[:10]}")
    if view is not None and view.terminal and view.state != "failed":
        violations.append(f"job {view.state}, expected failed (one frame failed)")
    assert kills >= 1, "the poison frame never ran: the fault was not injected"
    assert not violations, "\n".join(violations) + "\n" + scenario.telling_lines()
