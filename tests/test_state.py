"""The product and job state machines: one transition function each, illegal moves refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from backend.models import Job, JobState, Product, ProductState
from backend.state import (JOB_MOVES, MAX_REASON_CHARS, PRODUCT_MOVES, IllegalTransition, move_job,
                           move_product, reason_text)

ROOT = Path(__file__).resolve().parent.parent


def test_no_state_is_assigned_outside_the_transition_functions():
    raw = []
    for pkg in ("backend", "pipelines"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            if f == ROOT / "backend" / "state.py":
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
                for t in targets:
                    elts = t.elts if isinstance(t, ast.Tuple) else [t]
                    if any(isinstance(e, ast.Attribute) and e.attr == "state" for e in elts):
                        raw.append(f"{f.relative_to(ROOT)}:{node.lineno}")
                if isinstance(node, ast.Call):
                    fn = node.func
                    if (isinstance(fn, ast.Name) and fn.id == "setattr" and len(node.args) > 1
                            and isinstance(node.args[1], ast.Constant) and node.args[1].value == "state"):
                        raw.append(f"{f.relative_to(ROOT)}:{node.lineno} setattr")
                    if isinstance(fn, ast.Attribute) and fn.attr == "values" and any(
                            k.arg == "state" for k in node.keywords):
                        raw.append(f"{f.relative_to(ROOT)}:{node.lineno} UPDATE ... state")
    assert raw == []


def test_every_state_has_its_moves():
    assert set(PRODUCT_MOVES) == set(ProductState) and set(JOB_MOVES) == set(JobState)


def test_product_moves_and_reasons():
    p = Product(id=1, state=ProductState.planned)
    move_product(p, ProductState.writing)
    with pytest.raises(IllegalTransition, match="needs a reason"):
        move_product(p, ProductState.failed)
    move_product(p, ProductState.failed, "x" * (MAX_REASON_CHARS + 50))
    assert p.state == ProductState.failed and len(p.error) == MAX_REASON_CHARS
    move_product(p, ProductState.failed, "failed again")  # a second failure replaces the reason
    assert p.error == "failed again"
    move_product(p, ProductState.planned)
    assert p.error is None
    move_product(p, ProductState.writing)
    move_product(p, ProductState.written)
    for to in set(ProductState) - {ProductState.failed}:  # written leaves only for failed
        with pytest.raises(IllegalTransition, match="written -> "):
            move_product(p, to)
    assert p.state == ProductState.written
    with pytest.raises(IllegalTransition, match="needs a reason"):
        move_product(p, ProductState.failed)
    # lstdp fsck --repair: the file of a written product is missing or damaged on disk
    move_product(p, ProductState.failed, "file missing on disk (found by lstdp fsck)")
    assert p.state == ProductState.failed and p.error == "file missing on disk (found by lstdp fsck)"
    assert PRODUCT_MOVES[ProductState.written] == {ProductState.failed}


def test_job_moves_set_times_and_refuse_leaving_an_end():
    j = Job(id="j", state=JobState.queued, total=3, done=1, failed=2)
    move_job(j, JobState.running)
    assert j.started_at is not None and j.finished_at is None
    move_job(j, JobState.failed)
    assert j.finished_at is not None and j.error == "2 of 3 frames failed"
    with pytest.raises(IllegalTransition, match="failed -> running"):
        move_job(j, JobState.running)
    k = Job(id="k", state=JobState.queued)
    with pytest.raises(IllegalTransition, match="queued -> succeeded"):
        move_job(k, JobState.succeeded)
    move_job(k, JobState.failed, "could not enqueue")
    assert k.error == "could not enqueue"
    assert reason_text("") is None and reason_text("a\nb") == "a\nb"


def test_a_late_plan_message_leaves_an_ended_job_alone(db_session):
    from backend.worker.processing import plan_job

    job = Job(id="late-plan", state=JobState.succeeded, total=2, done=2, failed=0, skipped=0,
              parameters={"channels": ["SDI"], "start": "2024-01-01T00:00:00+00:00",
                          "end": "2024-01-02T00:00:00+00:00"})
    db_session.add(job)
    db_session.flush()
    assert plan_job(db_session, job.id) == []
    assert (job.state, job.done, job.total) == (JobState.succeeded, 2, 2)
