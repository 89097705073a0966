"""Benchmark: a 200-frame recalibration job through 20 SIGKILLs of its workers (issue #10).

Private PostgreSQL and Redis servers (ports of their own, stopped at the end), two
``lstdp worker`` processes (queue ``cpu``, two pool processes each, started through
:mod:`tests.faults.worker_main`, which only observes), ``--frames`` simulated 64 px WST
frames ingested with their masters (:func:`tests.faults.harness.prepare_frames`). While
the job runs, ``--kills`` SIGKILLs at random moments (``--seed``): each a random pool
process, or with probability ``--main-share`` a worker's main process, which is then
restarted as a supervisor would (what is left of it killed, started again 1 s later).
After the last kill the job is waited for (at most ``--timeout``, default the lease plus
three reconciler periods plus a minute: :func:`tests.faults.harness.settle_bound`).

``--frame-delay S`` makes every calibration sleep ``S`` seconds first (the fault hook
``LSTDP_FAULTS_FRAME_DELAY_S``), so that the job outlasts its kills whatever the machine's
speed: the job cannot end sooner than ``ceil(frames / slots) * S`` (``slots`` = workers x
pool processes; a kill only adds work), while the kill schedule, drawn in advance, lasts at
most ``kills * (max_gap + 1)`` s. The run prints both and refuses a delay that does not make
the first exceed the second (with the first wave of frames discounted, as the kills start
after it). Without it (the default, 0) the job runs at the machine's own speed and a quiet,
fast machine may end it before the last kill (the run says so). The delay is added to both
task time limits, so the calibration itself keeps the margin it has without it.

Settings: ``TASK_SOFT_TIME_LIMIT_S=8``, ``TASK_TIME_LIMIT_S=10`` (lease 70 s),
``BROKER_VISIBILITY_TIMEOUT_S=15``, ``RECONCILE_INTERVAL_S=1``, ``MAX_DELIVERIES=3``.

Counted per frame of the job:

* ``products``: frames with exactly one product row, ``written``, its file present;
* ``lost``: frames with neither a written product nor a failed row with a reason;
* ``duplicated``: frames with more than one product row, or whose product file was
  written again after its row had been committed ``written``: seen in the workers'
  journal (a completed write after a calibration of that product had returned
  ``written``) or on disk (the file's mtime later than the row's ``updated_at``). A write
  again after an attempt that was killed before it returned is a redo, printed but not
  counted;
* ``orphans``: files in the product store without a row (FITS without a ``written`` row,
  a quicklook no row names) plus partial files (``.part`` temporaries of killed writes);
* ``settle_s``: seconds from the last kill until the job is terminal (``inf`` if it was
  not within the timeout);
* ``fsck``: what ``lstdp fsck`` (the check, no repair) says of the store at the end:
  ``clean``, or the number of problems it found (its lines are printed).

The end state is measured once the reconciler's sweep of placed objects has had its bound
after the job ended (:data:`SWEEP_PERIODS` reconcile periods): a calibration killed, or past
its soft time limit, between placing its files and committing its row leaves a write-ahead
record (``placed_objects``, :mod:`backend.worker.placements`) and the next pass after its
claim moved on removes what no row names; no ``--repair`` is run.

The last line printed is::

    RESULT frames=200 products=<n> lost=<l> duplicated=<d> orphans=<o> settle_s=<t> fsck=<clean|n>

Usage::

    .venv/bin/python benchmarks/faults.py                     # 200 frames, 20 kills
    .venv/bin/python benchmarks/faults.py --frames 40 --kills 5 --seed 3
"""

from __future__ import annotations

import argparse
import math
import datetime as dt
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.faults import harness as H  # noqa: E402

SETTINGS = {"TASK_SOFT_TIME_LIMIT_S": 8, "TASK_TIME_LIMIT_S": 10, "BROKER_VISIBILITY_TIMEOUT_S": 15,
            "RECONCILE_INTERVAL_S": 1, "MAX_DELIVERIES": 3}

#: Reconcile periods waited after the job ended before the end state is measured: one for a
#: pass to start after the last product settled, one for the pass itself (its sweep of placed
#: objects, :mod:`backend.worker.placements`), one of margin; at least 3 s (the follow-ups
#: queued at the close).
SWEEP_PERIODS = 3


def fsck(env: dict[str, str]) -> tuple[int, list[str]]:
    """``lstdp fsck`` (check only) on the benchmark's store: (exit code, its output lines).
    Run in this process (:func:`tests.faults.harness.run_cli`: the CLI's parsing, check and
    exit status, without a Python start)."""
    rc, out = H.run_cli(["fsck"], env)
    return rc, out.strip().splitlines()


def _say(msg: str) -> None:
    print(msg, flush=True)


def _naive_utc(t: dt.datetime) -> dt.datetime:
    return t.astimezone(dt.UTC).replace(tzinfo=None) if t.tzinfo else t


def measure(job_id: str, journal: Path) -> dict:
    """The per-frame counts of the module docstring, and the lines that explain them."""
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Job, Product, ProductState
    from backend.settings import get_settings
    from backend.worker.processing import frames_for_job

    store = get_settings().products
    rep = H.delivery_report(H.read_journal(journal))
    with session_scope() as s:
        frames = [f.id for f in frames_for_job(s, s.get(Job, job_id))]
        rows = s.execute(select(Product.id, Product.frame_id, Product.state, Product.error, Product.path,
                                Product.quicklook_path, Product.updated_at)).all()
    by_frame = defaultdict(list)
    for r in rows:
        by_frame[r.frame_id].append(r)
    products = lost = duplicated = 0
    details: list[str] = []
    for fid in frames:
        prods = by_frame.get(fid, [])
        written = [p for p in prods if p.state == ProductState.written and p.path and Path(p.path).exists()]
        failed = [p for p in prods if p.state == ProductState.failed and (p.error or "").strip()]
        if len(prods) == 1 and written:
            products += 1
        if not written and not failed:
            lost += 1
            details.append(f"lost: frame {fid}: {[(p.id, p.state.value) for p in prods] or 'no product row'}")
        again = False
        for p in written:
            mtime = dt.datetime.fromtimestamp(os.stat(p.path).st_mtime, dt.UTC).replace(tzinfo=None)
            if rep.rewrites.get(p.path) or mtime > _naive_utc(p.updated_at):
                again = True
                details.append(f"duplicated: frame {fid}: product {p.id} rewritten after its row said written "
                               f"(journal {rep.rewrites.get(p.path, 0)}, mtime {mtime:%H:%M:%S.%f} > row "
                               f"{_naive_utc(p.updated_at):%H:%M:%S.%f}: {mtime > _naive_utc(p.updated_at)})")
            elif rep.writes.get(p.path, 0) > 1:
                details.append(f"redo (not counted): frame {fid}: product {p.id} written {rep.writes[p.path]} times, "
                               "the earlier attempts killed before they returned")
        if len(prods) > 1:
            details.append(f"duplicated: frame {fid}: {len(prods)} product rows")
        duplicated += int(len(prods) > 1 or again)
    named_fits = Counter(r.path for r in rows if r.state == ProductState.written and r.path)
    named_png = {r.quicklook_path for r in rows if r.quicklook_path}
    orphans = 0
    if store.exists():
        for f in sorted(store.rglob("*")):
            if not f.is_file():
                continue
            if f.name.endswith((".part", ".part.png")):
                orphans += 1
                details.append(f"orphan: partial file {f.relative_to(store)}")
            elif f.suffix == ".fits" and not named_fits.get(str(f)):
                orphans += 1
                details.append(f"orphan: {f.relative_to(store)} has no written row")
            elif f.suffix == ".png" and str(f) not in named_png:
                orphans += 1
                details.append(f"orphan: quicklook {f.relative_to(store)} named by no row")
    return {"frames": len(frames), "products": products, "lost": lost, "duplicated": duplicated,
            "orphans": orphans, "details": details, "report": rep}


def job_floor_s(args) -> float:
    """The shortest time [s] the job can take after its first wave of calibrations ends:
    each calibration sleeps ``args.frame_delay`` and at most workers x concurrency run at
    once (kills only add work)."""
    slots = args.workers * args.concurrency
    return (math.ceil(args.frames / slots) - 1) * args.frame_delay


def run(args) -> dict:
    from backend.migrate import upgrade

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="lstdp-faults-bench-"))
    with H.PostgresServer() as pg, H.RedisServer(base=work) as redis:
        url = pg.create_database("lstdp_faults_bench")
        upgrade(url)
        settings = dict(SETTINGS)
        if args.frame_delay:  # the sleep is not the calibration's: its time limits keep their margin
            settings["TASK_SOFT_TIME_LIMIT_S"] += args.frame_delay
            settings["TASK_TIME_LIMIT_S"] += args.frame_delay
        env = H.worker_env(database_url=url, redis=redis, data_dir=work / "var", raw_dir=work / "raw",
                           calibration_dir=work / "calibration", journal=work / "journal.jsonl", **settings)
        H.use_settings(env)
        t0 = time.perf_counter()
        templates = H.simulate_templates(work / "templates", 4)
        H.compile_kernels(templates)  # Numba's cache filled before the workers calibrate (a fresh clone)
        counts = H.prepare_frames(templates, work, args.frames)
        _say(f"{args.frames} frames of {H.FRAME_PX} px ({H.CHANNEL}) made and ingested in "
             f"{time.perf_counter() - t0:.1f} s: {counts}; logs in {work}")
        if args.frame_delay:
            env["LSTDP_FAULTS_FRAME_DELAY_S"] = str(args.frame_delay)
        workers = [H.Worker(f"w{i + 1}@bench", env, work, concurrency=args.concurrency, rng=rng)
                   for i in range(args.workers)]
        try:
            for w in workers:  # started together, then waited for: each start is seconds of imports
                w.start(wait_ready=False)
            for w in workers:
                w.wait_ready()
            _say(f"{len(workers)} workers of {args.concurrency} processes ready; reconcile command "
                 f"{'present' if H.has_reconcile_command() else 'absent'}, fsck "
                 f"{'present' if H.has_fsck_command() else 'absent'}")
            gaps = [rng.uniform(args.min_gap, args.max_gap) for _ in range(args.kills)]
            if args.frame_delay:
                _say(f"the job lasts at least {job_floor_s(args):.1f} s after its first wave by its frame delay; "
                     f"the kill schedule at most {sum(gaps) + args.kills:.1f} s")
            job = H.submit(args.frames)
            t_job = time.monotonic()
            H.wait_progress(job, 0.03, timeout_s=120)
            kills: list[str] = []
            last = time.monotonic()
            while len(kills) < args.kills:
                time.sleep(gaps[len(kills)])
                view = H.job_view(job)
                if view.terminal:
                    _say(f"the job ended after {len(kills)} kills")
                    break
                ready = [w for w in workers if w.pool_children()]
                if not ready:
                    continue
                w = rng.choice(ready)
                if rng.random() < args.main_share:
                    pid = w.kill_main()
                    last = time.monotonic()
                    kills.append(f"main {pid} of {w.name} at {view.finished}/{view.total}")
                    time.sleep(1.0)
                    w.restart(wait_ready=False)
                else:
                    pid = w.kill_child()
                    last = time.monotonic()
                    kills.append(f"child {pid} of {w.name} at {view.finished}/{view.total}")
                _say(f"kill {len(kills)}: {kills[-1]}")
            restarted = sum(w.supervised_restarts for w in workers)
            if restarted:
                _say(f"the supervisor started {restarted} worker(s) again that exited by themselves "
                     "(Celery ends a worker whose pool child is killed while it starts)")
            bound = args.timeout or H.settle_bound(env, 60.0)
            view, _ = H.settle(job, max(1.0, bound - (time.monotonic() - last)))
            settle_s = time.monotonic() - last if view is not None and view.terminal else float("inf")
            _say(f"job {view} {time.monotonic() - t_job:.1f} s after submission; settle {settle_s:.1f} s "
                 f"after the last kill (bound {bound:.0f} s)")
            if view is not None and view.terminal:  # the reconciler's sweep, and the follow-ups queued at the close
                time.sleep(max(3.0, SWEEP_PERIODS * float(env["RECONCILE_INTERVAL_S"])))
            out = measure(job, work / "journal.jsonl")
            out.update(settle_s=settle_s, kills=kills, job=view)
            rc, lines = fsck(env)
            problems = [ln for ln in lines if not ln.startswith(("checked ", "clean:", "in_progress:"))
                        and "problem(s)" not in ln]
            out["fsck"] = "clean" if rc == 0 else str(len(problems) or rc)
            _say(f"lstdp fsck: exit {rc}")
            for line in lines[-12:]:
                _say(f"  {line[:300]}")
            for v in H.check_invariants(job, env=env):
                _say(f"invariant: {v}")
            rep = out["report"]
            _say(f"calibrate starts per product: max {rep.max_starts}, {sum(rep.starts.values())} in all; "
                 f"follow-ups {[(k, len(v)) for k, v in rep.follow_ups.items()]}")
            for line in out["details"][:40]:
                _say(line)
            for w in workers:
                lines = [ln for ln in H.grep(w.log, "reaped", "reconcil", "refus", "deliver", "lost", limit=1000)
                         if not ln.startswith((" ", "Traceback", "billiard."))]
                for line in list(dict.fromkeys(lines))[:5]:
                    _say(f"{w.log.name}: {line[:300]}")
        finally:  # stopped together (each waits up to 10 s for its warm shutdown)
            import threading

            stops = [threading.Thread(target=w.stop, kwargs={"timeout_s": 10}) for w in workers]
            for t in stops:
                t.start()
            for t in stops:
                t.join()
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--main-share", type=float, default=0.3, help="share of kills that hit a main process")
    ap.add_argument("--min-gap", type=float, default=0.5, help="shortest time between kills [s]")
    ap.add_argument("--max-gap", type=float, default=3.0, help="longest time between kills [s]")
    ap.add_argument("--timeout", type=float, default=None, help="settle bound after the last kill [s]")
    ap.add_argument("--frame-delay", type=float, default=0.0,
                    help="every calibration sleeps this long first [s], so the job outlasts its kills (docstring)")
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, journal, store)")
    args = ap.parse_args(argv)
    if args.frame_delay and job_floor_s(args) <= args.kills * (args.max_gap + 1.0):
        ap.error(f"--frame-delay {args.frame_delay} does not make the job outlast its kills: the job may end after "
                 f"{job_floor_s(args):.1f} s, the kills take up to {args.kills * (args.max_gap + 1.0):.1f} s")
    out = run(args)
    _say(f"RESULT frames={out['frames']} products={out['products']} lost={out['lost']} "
         f"duplicated={out['duplicated']} orphans={out['orphans']} settle_s={out['settle_s']:.1f} fsck={out['fsck']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
