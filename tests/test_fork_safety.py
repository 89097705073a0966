"""No database connection crosses a fork (issue 10, point 1).

A Celery prefork worker opens connections in its main process (the start-up reaper) and
forks pool children, also later, to replace a killed one. A child that reuses its parent's
pooled connection talks to PostgreSQL through the parent's socket ("there is already a
transaction in progress", "can't change 'autocommit' now"). Here a real fork on real
PostgreSQL: the process-wide engine hands the child a connection of its own (another
server backend), and the parent's pooled connection stays the parent's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.postgres

SCRIPT = r"""
import json, os, sys
os.environ["DATABASE_URL"] = sys.argv[1]
from sqlalchemy import text
from backend import db

def backend_pid(engine):
    with engine.connect() as c:
        return c.execute(text("SELECT pg_backend_pid()")).scalar()

cached = db.get_engine()              # the engine every session of the process uses
control = db.make_engine(sys.argv[1])  # an engine nothing resets: shows what a fork shares
parent = backend_pid(cached)
parent_control = backend_pid(control)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    out = [backend_pid(cached), backend_pid(control)]
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.waitpid(pid, 0)
child, child_control = json.loads(os.read(r, 200))
print(json.dumps({"parent": parent, "child": child, "parent_after": backend_pid(cached),
                  "parent_control": parent_control, "child_control": child_control}))
"""


def test_a_forked_child_never_shares_its_parents_connection(pg_url):
    out = subprocess.run([sys.executable, "-c", SCRIPT, pg_url], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # without the reset a fork shares the socket: the same server backend on both sides
    assert got["child_control"] == got["parent_control"]
    # the process-wide engine gives the child its own backend; the parent keeps its own
    assert got["child"] != got["parent"]
    assert got["parent_after"] == got["parent"]


def test_the_worker_resets_connections_in_every_pool_child():
    from celery.signals import worker_process_init

    from backend.worker import tasks

    receivers = [r[1]() for r in worker_process_init.receivers]
    assert tasks._own_connections in receivers


def test_worker_parent_imports_numba_and_the_kernels_before_the_pool_forks():
    """A pool child never runs ``import numba`` itself (a time limit raised inside it left numba
    half-initialised: ``module 'numba' has no attribute 'core'`` for every later product of that
    child): the worker's ``worker_init`` handler imports numba, the compiled kernels and the entry
    points' registries in the parent, in a fresh interpreter as a worker starts."""
    import subprocess
    import sys

    code = ("import sys; from backend.worker.tasks import _preload_lazy_imports; "
            "assert 'pipelines.calibration.l2._fused_numba' not in sys.modules; _preload_lazy_imports(); "
            "print(all(m in sys.modules for m in ('numba.core.entrypoints', 'pipelines.calibration.l2._fused_numba')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "LSTDP_NUMBA": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True", r.stdout + r.stderr[-2000:]
