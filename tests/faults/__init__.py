"""Fault-injection tests (issue #10): killed workers, lost messages, server restarts, hung
servers, against private PostgreSQL and Redis servers started by the tests themselves
(ports of their own; the shared servers are never touched).

:mod:`.harness` holds the reusable pieces (servers, worker processes, frames, invariants);
:mod:`.worker_main` is the worker entry point with the test-only observation and fault
hooks. The benchmark ``benchmarks/faults.py`` uses the same harness.

Run (as root: the private PostgreSQL runs as the ``postgres`` user)::

    .venv/bin/python -m pytest tests/faults -m faults -s      # -s shows each scenario's story
    LSTDP_FAULTS_SEED=123 .venv/bin/python -m pytest tests/faults -k children   # replay the moments

Each scenario's worker logs and journal stay in its pytest ``tmp_path`` (printed).
"""
