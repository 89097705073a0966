"""The database restarted or hung mid-job (issue #10): ``pg_ctl restart -m fast`` and
``-m immediate`` (every connection cut, the server back at once), and PostgreSQL frozen
(SIGSTOP of the postmaster and every backend) for a few seconds.

Done when: the job ends within the lease plus three reconciler periods after the fault,
every frame with exactly one written product or one failed row with the reason, no
duplicate product, no partial or orphan file, follow-up detections queued at most once.
"""

from __future__ import annotations

import time

import pytest

from tests.faults import harness as H

pytestmark = [pytest.mark.faults, pytest.mark.slow]

FRAMES = 40


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_database_restarted_mid_job(scenario, mode):
    scenario.worker()
    job = scenario.submit(FRAMES)
    v = H.wait_progress(job, 0.3)
    assert not v.terminal, "the job ended before the fault: make it longer"
    scenario.pg.restart(mode)
    last = time.monotonic()
    scenario.note(f"PostgreSQL restarted (-m {mode}) at {v.finished}/{FRAMES} finished")
    _, _, violations = scenario.finish(job, scenario.bound(), since=last)
    assert not violations, "\n".join(violations) + "\n" + scenario.telling_lines()


def test_database_frozen_mid_job(scenario):
    scenario.worker()
    job = scenario.submit(FRAMES)
    v = H.wait_progress(job, 0.3)
    assert not v.terminal, "the job ended before the fault: make it longer"
    scenario.pg.freeze()
    time.sleep(5.0)
    scenario.pg.thaw()
    last = time.monotonic()
    scenario.note(f"PostgreSQL frozen 5 s at {v.finished}/{FRAMES} finished")
    _, _, violations = scenario.finish(job, scenario.bound(), since=last)
    assert not violations, "\n".join(violations) + "\n" + scenario.telling_lines()
