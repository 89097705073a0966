"""A message redelivered while its task still runs (issue #10): the broker's visibility
timeout shorter than a task.

The worker's start-up check refuses ``BROKER_VISIBILITY_TIMEOUT_S <= TASK_TIME_LIMIT_S``, so
the worker's settings stay consistent (hard limit 20 s, visibility 25 s) and the broker
side is made to redeliver after 3 s instead (``LSTDP_FAULTS_VISIBILITY_S`` of
:mod:`tests.faults.worker_main`: a broker whose visibility timeout is shorter than the
task, as a misconfigured or replaced Redis, or a clock jump, would be). One frame's first
calibration is slow (10 s inside the science step, its product already ``writing``), so
its message is delivered a second time to the worker's other process while the first
delivery still runs.

Done when: the second delivery of the running task writes nothing and counts nothing:
that product's file is written exactly once, and the job ends with every frame's one
product as in the other scenarios.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from backend.db import session_scope
from backend.models import Frame, Product
from tests.faults import harness as H

pytestmark = [pytest.mark.faults, pytest.mark.slow]

FRAMES = 30
SLOW_FRAME = 2
SLOW_S = 10
SETTINGS = {"TASK_SOFT_TIME_LIMIT_S": 18, "TASK_TIME_LIMIT_S": 20, "BROKER_VISIBILITY_TIMEOUT_S": 25}


def test_second_delivery_of_a_running_task_writes_and_counts_nothing(scenario):
    scenario.env.update({k: str(v) for k, v in SETTINGS.items()})
    H.use_settings(scenario.env)
    slow = H.frame_name(SLOW_FRAME)
    scenario.worker(LSTDP_FAULTS_VISIBILITY_S=3, LSTDP_FAULTS_SLOW=f"{slow}:{SLOW_S}")
    job = scenario.submit(FRAMES)
    t_submit = time.monotonic()
    _, _, violations = scenario.finish(job, SLOW_S + scenario.bound(), since=t_submit)

    with session_scope() as s:
        prod = s.scalar(select(Product).join(Frame).where(Frame.original_name == slow))
        pid, path, updated = prod.id, prod.path, prod.updated_at
    rep = H.delivery_report(H.read_journal(scenario.journal))
    starts = rep.starts.get(pid, 0)
    scenario.note(f"slow product {pid}: {starts} calibrate starts, {rep.writes.get(path, 0)} writes, "
                  f"{rep.counts.get(pid, 0)} settlements")
    assert starts >= 2, f"the slow task was not delivered twice ({starts} start(s)): the fault was not injected"
    if rep.writes.get(path, 0) != 1:
        violations.append(f"slow product {pid} written {rep.writes.get(path, 0)} times (expected once)")
    if path and Path(path).exists() and updated is not None:
        mtime = dt.datetime.fromtimestamp(os.stat(path).st_mtime, dt.UTC).replace(tzinfo=None)
        row = updated.replace(tzinfo=None) if updated.tzinfo is None else updated.astimezone(dt.UTC).replace(tzinfo=None)
        if mtime > row:
            violations.append(f"slow product {pid}: file replaced at {mtime:%H:%M:%S.%f} after its row said written "
                              f"at {row:%H:%M:%S.%f}")
    for other, n in rep.rewrites.items():
        violations.append(f"{Path(other).name} rewritten {n} time(s) after its row was committed written")
    assert not violations, "\n".join(dict.fromkeys(violations)) + "\n" + scenario.telling_lines()
