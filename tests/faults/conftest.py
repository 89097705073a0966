"""Fixtures of the fault-injection tests.

* ``fault_templates``: a few simulated 64 px WST raw frames and their masters (once per
  session, a few seconds); one of them calibrated in this process, so that the calibration's
  compiled kernels are cached before any worker needs them (:func:`.harness.compile_kernels`).
* ``pg_server``: one private PostgreSQL server for the session (port of its own; a test
  may restart, kill or freeze it: the next test finds it running again).
* ``template_db``: a database on it, migrated, with ``TEMPLATE_FRAMES`` frames and the
  masters ingested (raw and calibration stores in a session folder); each test copies it
  (``CREATE DATABASE ... TEMPLATE``, a fraction of a second).
* ``scenario``: one test's world: its own database, its own private Redis server, a
  DATA_DIR (product store, logs, journal), the settings of the fault tests
  (:data:`FAULT_SETTINGS`) in this process, and :class:`Scenario` to start workers,
  submit the job and judge how it ended. Workers and Redis are stopped by PID at the end.

Logs stay in the test's ``tmp_path`` (``worker-*.log``, ``journal.jsonl``); a failing test
prints their telling lines.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import require
from tests.faults import harness as H

#: Frames ingested once in the template database (the scenarios use 30 to 60 of them).
TEMPLATE_FRAMES = 60

#: The settings every scenario runs under: limits short enough that a lost product is taken
#: back within the test (lease = hard limit + 60 s = 70 s), a visibility timeout above the
#: hard limit (the worker's start-up check), the reconciler every second.
FAULT_SETTINGS = {
    "TASK_SOFT_TIME_LIMIT_S": 8,
    "TASK_TIME_LIMIT_S": 10,
    "BROKER_VISIBILITY_TIMEOUT_S": 15,
    "RECONCILE_INTERVAL_S": 1,
    "MAX_DELIVERIES": 3,
}

#: Log lines worth showing when a scenario fails.
TELLING = ("WorkerLostError", "ERROR", "CRITICAL", "Traceback", "reaped", "reconcil", "lost", "Restoring",
           "restored", "refus", "deliver", "consumer: Cannot connect", "Connection to broker lost",
           "OperationalError", "Signal 9", "exited with", "TimeLimitExceeded", "SoftTimeLimit")


@pytest.fixture(scope="session")
def fault_templates(tmp_path_factory) -> Path:
    templates = H.simulate_templates(tmp_path_factory.mktemp("fault-templates"), 4)
    H.compile_kernels(templates)  # Numba's cache filled before any worker calibrates (fresh clones)
    return templates


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    require(H.PG_BIN is not None and (H.PG_BIN / "postgres").exists(),
            "PostgreSQL server binaries not found under /usr/lib/postgresql")
    require(os.geteuid() == 0, "the private PostgreSQL server runs as the postgres user (runuser): needs root")
    with H.PostgresServer() as pg:
        yield pg


@dataclass
class TemplateDB:
    name: str
    raw_dir: Path
    calibration_dir: Path


@pytest.fixture(scope="session")
def template_db(pg_server, fault_templates, tmp_path_factory):
    from backend.migrate import upgrade

    saved = dict(os.environ)
    base = tmp_path_factory.mktemp("fault-store")
    name = "lstdp_faults_template"
    url = pg_server.create_database(name)
    upgrade(url)
    redis = H.RedisServer(base=base)  # not started: the ingest sends nothing
    env = H.worker_env(database_url=url, redis=redis, data_dir=base / "var", raw_dir=base / "raw",
                       calibration_dir=base / "calibration")
    try:
        H.use_settings(env)
        counts = H.prepare_frames(fault_templates, base, TEMPLATE_FRAMES)
        assert counts == {"calibration": 4, "ingested": TEMPLATE_FRAMES}, counts
    finally:
        os.environ.clear()
        os.environ.update(saved)
        from backend import db as dbmod
        from backend.settings import get_settings

        get_settings.cache_clear()
        dbmod.reset_caches()  # no connection may stay open on a template database
    return TemplateDB(name, base / "raw", base / "calibration")


@dataclass
class Scenario:
    """One test's servers, settings, workers and job."""

    pg: H.PostgresServer
    redis: H.RedisServer
    env: dict[str, str]
    dir: Path
    rng: random.Random
    workers: list[H.Worker] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def journal(self) -> Path:
        return Path(self.env["LSTDP_FAULTS_JOURNAL"])

    def worker(self, name: str = "w1", *, concurrency: int = 2, **extra_env) -> H.Worker:
        """Start a worker (``name@faults``) with the scenario's settings plus ``extra_env``."""
        env = {**self.env, **{k: str(v) for k, v in extra_env.items()}}
        w = H.Worker(f"{name}@faults", env, self.dir, concurrency=concurrency, rng=self.rng)
        self.workers.append(w)
        return w.start()

    def submit(self, n: int) -> str:
        return H.submit(n)

    def bound(self, work_s: float = 30.0) -> float:
        return H.settle_bound(self.env, work_s)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(text, flush=True)

    def finish(self, job_id: str, bound_s: float, *, since: float | None = None) -> tuple[H.JobView, float, list[str]]:
        """Settle the job (bound from ``since``, default now), then check the invariants and
        the follow-ups; returns (view, settle seconds, violations)."""
        since = time.monotonic() if since is None else since
        remaining = max(1.0, bound_s - (time.monotonic() - since))
        view, waited = H.settle(job_id, remaining)
        settle_s = time.monotonic() - since
        for server in (self.pg, self.redis):
            server.thaw()
        if view is not None and view.terminal:
            time.sleep(1.0)  # let the follow-up detections queued at the close start
        # every task still running ends first (a first delivery outliving its redelivered copy)
        running = H.quiesce(self.journal, float(self.env.get("TASK_TIME_LIMIT_S", 10)) + 5)
        violations = H.check_invariants(job_id, env=self.env)
        if view is None or not view.terminal:
            violations.insert(0, f"job not terminal {settle_s:.0f} s after the last fault (bound {bound_s:.0f} s): "
                                 f"{view}")
        if running:
            violations.append(f"{len(running)} task(s) still running after the job ended and the hard time limit: "
                              + ", ".join(f"{e['task'].rsplit('.', 1)[-1]}{e.get('args')} in {e['pid']}"
                                          for e in running[:5]))
        rep = H.delivery_report(H.read_journal(self.journal))
        for key, ids in rep.follow_ups.items():
            if len(ids) > 1:
                violations.append(f"follow-up detection {key} queued {len(ids)} times (expected at most once)")
        self.note(f"settled: {view} after {settle_s:.1f} s (bound {bound_s:.0f} s); "
                  f"max calibrate starts per product {rep.max_starts}; "
                  f"rewrites {sum(rep.rewrites.values())}; follow-ups {[(k, len(v)) for k, v in rep.follow_ups.items()]}")
        for v in violations:
            self.note(f"VIOLATION: {v}")
        if violations:
            for line in H.explain_unfinished(job_id, H.read_journal(self.journal), self.redis):
                self.note(f"WHY: {line}")
        return view, settle_s, violations

    def telling_lines(self, limit: int = 40) -> str:
        """The log lines that explain a failure, once each (tracebacks left out)."""
        out = [n for n in self.notes if n.startswith("WHY: ")]
        for w in self.workers:
            lines = [ln for ln in H.grep(w.log, *TELLING, limit=100_000)
                     if not ln.startswith((" ", "Traceback", "billiard.", "raise ", "celery.exceptions"))]
            seen = list(dict.fromkeys(ln[:400] for ln in lines))
            out.append(f"--- {w.log}: {len(seen)} telling line(s), the first {min(limit, len(seen))}")
            out.extend(seen[:limit])
        return "\n".join(out)


@pytest.fixture
def scenario(pg_server, template_db, tmp_path):
    """A fresh database (copy of the template), a private Redis, settings in this process."""
    from backend import db as dbmod
    from backend.settings import get_settings

    saved = dict(os.environ)
    pg_server.ensure_running()
    name = f"faults_{uuid.uuid4().hex[:10]}"
    url = pg_server.create_database(name, template=template_db.name)
    redis = H.RedisServer(base=tmp_path)
    redis.start()
    seed = int(os.environ.get("LSTDP_FAULTS_SEED", random.randrange(1 << 30)))
    env = H.worker_env(database_url=url, redis=redis, data_dir=tmp_path / "var", raw_dir=template_db.raw_dir,
                       calibration_dir=template_db.calibration_dir, journal=tmp_path / "journal.jsonl",
                       **FAULT_SETTINGS)
    H.use_settings(env)
    sc = Scenario(pg_server, redis, env, tmp_path, random.Random(seed))
    sc.note(f"scenario in {tmp_path}, seed {seed} (LSTDP_FAULTS_SEED replays the moments of the faults)")
    try:
        yield sc
    finally:
        for w in sc.workers:
            w.stop(timeout_s=10)
        print(sc.telling_lines())
        redis.thaw()
        redis.kill9()
        pg_server.thaw()
        os.environ.clear()
        os.environ.update(saved)
        get_settings.cache_clear()
        dbmod.reset_caches()
        try:
            pg_server.ensure_running()
            pg_server.drop_database(name)
        except Exception as exc:  # noqa: BLE001 - a later test starts the server again
            print(f"could not drop {name}: {exc}")
