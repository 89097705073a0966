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

#: Each calibration first sleeps this long (``LSTDP_FAULTS_FRAME_DELAY_S``): a job then lasts at
#: least FRAMES / 2 * FRAME_DELAY_S = 4 s whatever the machine's speed, so at the 30 % mark
#: 2.8 s of work is left for the fault to land on (without it a fast, quiet machine runs the
#: 64 px frames in tens of milliseconds each and the job could end between two progress polls).
FRAME_DELAY_S = 0.2


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_database_restarted_mid_job(scenario, mode):
    scenario.worker(LSTDP_FAULTS_FRAME_DELAY_S=FRAME_DELAY_S)
    job = scenario.submit(FRAMES)
    v = H.wait_progress(job, 0.3)
    assert not v.terminal, "the job ended before the fault: make it longer"
    scenario.pg.restart(mode)
    last = time.monotonic()
    scenario.note(f"PostgreSQL restarted (-m {mode}) at {v.finished}/{FRAMES} finished")
    _, _, violations = scenario.finish(job, scenario.bound(), since=last)
    assert not violations, "\n".join(violations) + "\n" + scenario.telling_lines()


def test_database_frozen_mid_job(scenario):
    scenario.worker(LSTDP_FAULTS_FRAME_DELAY_S=FRAME_DELAY_S)
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
