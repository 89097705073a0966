"""The ``lstdp`` command: demo, serve, worker, simulate, ingest, import-events, import-xray, calibrate,
detect, rerun, fsck, token create/list/revoke, db upgrade/downgrade.

Run ``lstdp COMMAND --help`` for each command's options. Settings come from the
environment (see :mod:`backend.settings`).
"""

from __future__ import annotations

import argparse
import json
import datetime as dt
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipelines.utc import parse_utc_text

__all__ = ["main", "build_parser"]

DEMO_SIZES = {"SDI": 1152, "WST": 1152, "SCI-UV": 1024, "SCI-WL": 1024}
FULL_SIZES = {"SDI": 4608, "WST": 4608, "SCI-UV": 2048, "SCI-WL": 2048}


def _settings():
    from backend.settings import get_settings

    s = get_settings()
    s.ensure_dirs()
    return s


def _say(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------- commands
def cmd_db(args) -> int:
    from backend.migrate import downgrade, upgrade

    s = _settings()
    if args.action == "upgrade":
        upgrade(s.sqlalchemy_url, args.revision or "head")
        _say(f"database at {s.sqlalchemy_url.split('@')[-1]} is at {args.revision or 'head'}")
    else:
        downgrade(s.sqlalchemy_url, args.revision or "base")
        _say(f"database downgraded to {args.revision or 'base'}")
    return 0


def cmd_simulate(args) -> int:
    from pipelines.simulation import simulate

    sizes = FULL_SIZES if args.full_size else (args.size or DEMO_SIZES)
    if isinstance(sizes, int):
        sizes = {c: sizes for c in FULL_SIZES}
    t0 = time.perf_counter()
    res = simulate(Path(args.out), channels=tuple(args.channels), naxis=sizes, noise=not args.no_noise,
                   seed=args.seed, sdi_sequence=not args.no_sequence, xrs_day=args.xrs_day,
                   wst_helioviewer=args.wst_helioviewer)
    _say(f"simulated {len(res.raw_files)} raw frames, {len(res.calibration_files)} calibration masters "
         f"in {args.out} ({time.perf_counter() - t0:.1f} s)")
    return 0


def _expand(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.is_file() and not q.name.endswith(".reason")))
        else:
            out.append(p)
    return out


def ingest_files(files: list[Path], *, move: bool, progress: bool = True) -> dict[str, int]:
    """Ingest files in this process with a progress bar; one line per rejection."""
    from tqdm import tqdm

    from backend.db import session_scope
    from backend.services.ingest import ingest_path

    s = _settings()
    counts: dict[str, int] = {}
    # calibration masters first, so frames never wait for their masters
    files = sorted(files, key=lambda p: (0 if "calibration" in p.parts else 1, str(p)))
    with tqdm(files, desc="ingest", unit="file", disable=not progress, file=sys.stderr) as bar:
        for f in bar:
            with session_scope() as session:
                out = ingest_path(session, f, s, move=move)
            counts[out.status] = counts.get(out.status, 0) + 1
            if out.status == "rejected":
                bar.write(f"rejected {f}: {out.reason}", file=sys.stdout)
    return counts


def cmd_ingest(args) -> int:
    files = _expand(args.paths)
    if not files:
        _say("nothing to ingest")
        return 1
    if args.via_worker:
        from backend.broker import TaskName, send

        for f in files:
            send(TaskName.ingest_file, args=[str(f.resolve()), not args.copy], queue="cpu")
        _say(f"queued {len(files)} files for the ingest task")
        return 0
    counts = ingest_files(files, move=not args.copy)
    _say("ingest: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 1 if (args.strict and counts.get("rejected")) else 0


def cmd_import_events(args) -> int:
    from backend.db import session_scope
    from backend.services.events import associate_events, import_all, refresh_statistics

    s = _settings()
    folder = Path(args.folder) if args.folder else s.sample_data_dir / "events"
    with session_scope() as session:
        run = import_all(session, folder)
        # links join stored events: a re-import that stores nothing has nothing new to link
        # (re-proposing the ~80 000 sample events' links takes 5-9 s)
        stored = sum(r.stored for r in run)
        linked = associate_events(session) if stored else None
        refresh_statistics(session)
    for line in run.lines():
        _say(line)
    _say(f"associations: {linked} new link(s) across sources and types" if linked is not None
         else "associations: no new event stored, links unchanged")
    return 1 if run.failed else 0


def cmd_import_xray(args) -> int:
    """Ingest the GOES XRS files of a folder (default: the sample data's ``xray-timeseries``)."""
    from backend.db import session_scope
    from backend.services.xray import import_xray_dir

    s = _settings()
    folder = Path(args.folder) if args.folder else s.sample_data_dir / "xray-timeseries"
    with session_scope() as session:
        outcomes = import_xray_dir(session, folder, s)
    for o in outcomes:
        _say(o.line())
    return 1 if any(o.status == "rejected" for o in outcomes) else 0


def _parse_time(s: str) -> dt.datetime:
    """A time typed on the command line: :func:`pipelines.utc.parse_utc_text` (ISO 8601, UTC)."""
    return parse_utc_text(s)


def wait_for_job(job_id: str, *, timeout: float = 1800, progress: bool = True):
    from tqdm import tqdm

    from backend.db import session_scope
    from backend.models import Job, JobState

    t0 = time.monotonic()
    bar = tqdm(total=1, desc=f"job {job_id[:8]}", unit="frame", disable=not progress, file=sys.stderr)
    try:
        while True:
            with session_scope() as s:
                job = s.get(Job, job_id)
                state, total, n = job.state, job.total, job.done + job.failed + job.skipped
                error = job.error
            if total and bar.total != total:
                bar.total = total
            bar.n = n
            bar.refresh()
            if state in (JobState.succeeded, JobState.failed, JobState.cancelled):
                return state, error
            if time.monotonic() - t0 > timeout:
                return None, f"timed out after {timeout:.0f} s"
            time.sleep(0.5)
    finally:
        bar.close()


def cmd_calibrate(args) -> int:
    from backend.db import session_scope
    from backend.services.jobs import JobRequest, submit_job

    pinned = {}
    for p in args.pin or []:
        k, _, v = p.partition("=")
        pinned[k] = int(v)
    req = JobRequest(channels=args.channels, start=_parse_time(args.start), end=_parse_time(args.end),
                     pinned_calibrations=pinned)
    with session_scope() as s:
        job = submit_job(s, req)
    _say(f"job {job.id} queued")
    if args.wait:
        state, error = wait_for_job(job.id)
        _say(f"job {job.id} {state.value if state else 'unknown'}{': ' + error if error else ''}")
        return 0 if state and state.value == "succeeded" else 1
    return 0


def cmd_rerun(args) -> int:
    """``lstdp rerun MANIFEST``: re-run a product manifest file, a job manifest file or a job
    id with exactly its calibration files and options (as the platform, user ``system``),
    wait, and print per frame whether the data are identical or how far they differ. Exit
    status 0 when every frame is identical or within tolerance, 1 otherwise, 2 on bad input."""
    from backend.db import session_scope
    from backend.models import Job
    from backend.services import reruns

    say = _say if not args.json else (lambda m: print(m, file=sys.stderr, flush=True))  # stdout: the JSON only
    src = Path(args.manifest)
    try:
        with session_scope() as s:
            if src.is_file():
                try:
                    doc = json.loads(src.read_text())
                except (OSError, ValueError) as exc:
                    say(f"{src}: not a JSON manifest ({exc})")
                    return 2
                specs, rerun_of, source = reruns.specs_from_document(s, doc)
            else:
                job = s.get(Job, args.manifest) if len(args.manifest) <= 36 else None
                if job is None:
                    say(f"{args.manifest}: neither a manifest file nor a job id")
                    return 2
                specs, rerun_of, source = reruns.specs_from_job(s, job), job.id, "job"
            job = reruns.submit_rerun(s, specs, owner="system", rerun_of=rerun_of, source=source)
            job_id = job.id
    except reruns.RerunError as exc:
        say(f"cannot re-run {args.manifest}: {exc}")
        return 2
    say(f"re-run job {job_id} queued ({len(specs)} frame(s), from {source})")
    if args.no_wait:
        return 0
    state, error = wait_for_job(job_id, timeout=args.timeout, progress=not args.json)
    with session_scope() as s:
        results = [{"frame_id": r.frame_id, "product_id": r.product_id, "verdict": r.verdict, "backend": r.backend,
                    "max_abs_diff": (r.comparison or {}).get("max_abs_diff"),
                    "max_rel_diff": (r.comparison or {}).get("max_rel_diff"), "reason": r.reason}
                   for r in s.get(Job, job_id).rerun_items]
    if args.json:
        print(json.dumps({"job_id": job_id, "state": state.value if state else None, "frames": results}, indent=2))
    else:
        for r in results:
            how = r["reason"] if r["verdict"] is None else (
                r["verdict"] + ("" if r["verdict"] == "identical" else
                                f" (max abs {r['max_abs_diff']:.3g}, max rel {r['max_rel_diff']:.3g})"
                                if r["max_abs_diff"] is not None else ""))
            print(f"frame {r['frame_id']} (product {r['product_id']}, {r['backend'] or '-'}): {how}")
        say(f"re-run job {job_id} {state.value if state else 'unknown'}{': ' + error if error else ''}")
    ok = state is not None and state.value == "succeeded" and all(
        r["verdict"] in ("identical", "within_tolerance") for r in results)
    return 0 if ok else 1


def cmd_detect(args) -> int:
    from backend.db import session_scope
    from backend.services.detection import run_detector
    from backend.services.events import associate_around

    t0 = _parse_time(args.start) if args.start else None
    t1 = _parse_time(args.end) if args.end else None
    with session_scope() as s:
        # the detector's default channel when none is given (pipelines.detect.registry)
        events = run_detector(s, args.kind, channel=args.channel or None, start=t0, end=t1)
        for e in events:
            _say(_event_line(e))
        _say(f"{len(events)} event(s) found by the {args.kind} detector (re-running stores nothing twice)")
        _say(f"associations: {associate_around(s, events)} new link(s)")
    return 0


def _event_line(e) -> str:
    """One detected event as ``lstdp detect`` and the demo print it."""
    parts = [e.event_type, f"{e.start_time:%Y-%m-%d %H:%M}", e.channels or ""]
    if e.position_angle is not None:  # off the limb (CMEs, prominence eruptions): position angle [deg]
        speed = f", {e.speed_km_s:.0f} km/s" if e.speed_km_s is not None else ""
        parts.append(f"PA {e.position_angle:.0f} deg{speed}")
    elif e.hpc_x is not None and e.hpc_y is not None:  # on the disk: helioprojective [arcsec]
        parts.append(f"at ({e.hpc_x:.0f}\", {e.hpc_y:.0f}\")")
    return " ".join(parts) + f" [{e.frm_name} {e.frm_version}]"


def cmd_fsck(args) -> int:
    """Compare the database and the stores (``backend.services.fsck``); exit 0 when clean,
    1 when problems remain (after ``--repair``: those it could not repair)."""
    import json

    from backend.db import session_scope
    from backend.services.fsck import run_fsck

    s = _settings()
    with session_scope() as session:
        report = run_fsck(session, s, repair=args.repair, checksums=not args.no_checksums)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2), flush=True)
    else:
        for line in report.lines():
            _say(f"fsck: {line}")
    return 0 if report.clean else 1


def cmd_worker(args) -> int:
    """Run a Celery worker with the workers' timeouts; refuse time limits that contradict
    each other first (:func:`backend.broker.check_time_limits`: one line, exit status 1)."""
    from backend.broker import check_time_limits, configure

    s = _settings()
    check_time_limits(s)
    app = configure(s, role="worker")
    argv = ["worker", "-Q", args.queues or _settings().worker_queues, "-l", args.loglevel,
            "--without-mingle", "--without-gossip", "-n", args.name]
    if args.concurrency:
        argv += ["-c", str(args.concurrency)]
    from backend.worker.pool import POOL

    # prefork (Celery's default) through backend.worker.pool: a child that dies while the
    # worker starts is replaced instead of stopping the worker
    if args.pool in (None, "prefork"):
        app.conf.worker_pool = POOL  # a pool class by name (the -P option takes aliases only)
    else:
        argv += ["-P", args.pool]
    supervisor = None if args.no_reconciler else ReconcilerSupervisor(s.reconcile_interval_s)
    if supervisor is not None:
        from celery.signals import worker_shutting_down

        # a warm or cold shutdown (SIGTERM to the process group reaches the reconciler too):
        # the reconciler is not started again
        worker_shutting_down.connect(lambda **_kw: supervisor.stop_watching(), weak=False)
        supervisor.start()
    try:
        app.worker_main(argv)
    finally:
        if supervisor is not None:
            supervisor.stop()
    return 0


class ReconcilerSupervisor:
    """The reconciler of ``lstdp worker``: a process of its own (``lstdp reconcile --parent``,
    no reconcile threads in the forking worker), started with the worker, **started again**
    when it dies, and stopped with the worker.

    A daemon thread of the worker's main process looks at it every :attr:`check_s` (a
    quarter of ``RECONCILE_INTERVAL_S``, at most 1 s) and starts a new one when it has
    exited, however (``kill -9``, a crash at start-up): a killed reconciler runs again within
    one reconcile interval (one ended by SIGTERM or SIGINT a check later: that is also how the
    worker's own shutdown reaches it, which ``worker_shutting_down`` then says). The thread only
    waits and spawns (``fork``/``exec`` at once); the pool's children are forked without it. The reconciler stops by itself when the
    worker is gone (it checks its parent each pass, and gets SIGTERM when its parent dies).
    """

    def __init__(self, interval_s: float, argv: list[str] | None = None):
        import threading

        self.interval_s = float(interval_s)
        self.check_s = min(1.0, self.interval_s / 4)
        self.argv = argv or [sys.executable, "-m", "backend.cli", "reconcile", "--parent", str(os.getpid())]
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="lstdp-reconciler-supervisor", daemon=True)

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=os.environ.copy(), preexec_fn=_die_with_parent)
        self.starts += 1

    def start(self) -> None:
        """Start the reconciler and the thread that restarts it."""
        with self._lock:
            self._spawn()
        self._thread.start()

    def stop_watching(self) -> None:
        """Start it again no more (the worker is shutting down)."""
        self._stop.set()

    def _watch(self) -> None:
        termed_at = None
        while not self._stop.wait(self.check_s):
            with self._lock:
                if self._stop.is_set() or self.proc is None or self.proc.poll() is None:
                    continue
                old, code = self.proc.pid, self.proc.returncode
                if code in (-signal.SIGTERM, -signal.SIGINT) and termed_at is None:
                    # perhaps the worker's own shutdown (its whole group signalled): give
                    # worker_shutting_down one more check to say so
                    termed_at = old
                    continue
                termed_at = None
                try:
                    self._spawn()
                    logging.getLogger("backend.worker.reconcile").warning(
                        "reconciler (pid %s) exited with %s; started again (pid %s)", old, code, self.proc.pid)
                except OSError:
                    logging.getLogger("backend.worker.reconcile").exception("could not start the reconciler again")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop watching, then stop the reconciler (SIGTERM, SIGKILL after ``timeout_s``)."""
        self._stop.set()
        with self._lock:
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()


def cmd_reconcile(args) -> int:
    """Run the reconciler (:mod:`backend.worker.reconcile`): one pass with ``--once`` (its
    report as JSON), else every RECONCILE_INTERVAL_S until stopped."""
    from backend.worker.reconcile import reconcile_once, run_forever

    logging.getLogger("backend").setLevel(logging.INFO)
    if args.once:
        from backend.broker import ensure_configured
        from backend.db import session_scope

        ensure_configured()
        with session_scope() as s:
            report = reconcile_once(s)
        print(json.dumps(report.as_dict()))
        return 0
    from backend.broker import ensure_configured

    ensure_configured()
    run_forever(parent_pid=args.parent)
    return 0


def serve_options(s) -> dict:
    """uvicorn's options of ``lstdp serve`` from settings ``s``, less host and port: its HTTP
    protocol closes a connection that has not sent a complete request header within
    ``HEADER_TIMEOUT_S`` (:mod:`backend.api.http_protocol`), and it trusts the
    ``X-Forwarded-Proto``/``X-Forwarded-For`` headers of the proxies in ``FORWARDED_ALLOW_IPS``
    only (uvicorn's ``proxy_headers`` and ``forwarded_allow_ips``)."""
    from backend.api.http_protocol import protocol_class

    return {"http": protocol_class(s.header_timeout_s), "log_level": "info", "proxy_headers": True,
            "forwarded_allow_ips": s.forwarded_allow_ips}


def cmd_serve(args) -> int:
    """Run the API with uvicorn on ``HOST``:``PORT``, trusting the ``X-Forwarded-Proto`` and
    ``X-Forwarded-For`` headers of the proxies in ``FORWARDED_ALLOW_IPS`` only (uvicorn's
    ``proxy_headers`` and ``forwarded_allow_ips``): behind a TLS-terminating proxy the
    request's scheme is then https, so redirects say ``https://`` and the session cookie is
    ``Secure``."""
    import uvicorn

    s = _settings()
    uvicorn.run("backend.api.app:app", host=args.host or s.host, port=args.port or s.port, **serve_options(s))
    return 0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the demo's worker gets SIGTERM when the demo process dies, however it dies
    (uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, which skips ``finally``)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _end_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies (``PR_SET_PDEATHSIG``).

    ``make demo`` runs ``lstdp demo`` as make's child; SIGTERM sent to make's PID (a
    supervisor, ``kill``, a CI runner's timeout) ends make alone, and the demo, its worker and
    the worker's reconciler ran on. With this the demo is told too, and stops them through its
    ``finally``. Does nothing where ``prctl`` is missing; ends the demo at once if the parent
    is already gone."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # died before prctl took effect
        raise SystemExit(128 + signal.SIGTERM)


def _demo_simulation_current(sim_dir: Path) -> bool:
    """Whether ``sim_dir`` holds a demo simulation; one made by an older version (without the
    XRS day's flare) is kept, with a note: simulating again would change every frame's bytes
    (the radiometric coefficient follows the channel's brightest frame), so its frames would
    be ingested a second time beside the old ones."""
    manifest = sim_dir / "manifest.json"
    if not manifest.exists():
        return False
    try:
        flares = json.loads(manifest.read_text()).get("flares") or []
    except (OSError, ValueError):
        flares = []
    if len(flares) < 2:
        _say(f"      note: {sim_dir} was simulated by an older version (no 2011-06-07 XRS day, no 2023-01-31 "
             "WST frame); remove the data folder (make clean) to get them")
    return True


def cmd_demo(args) -> int:
    """Everything, embedded: simulate, ingest, import catalogues, calibrate, detect, serve.

    The browser is served as soon as the database is migrated (``lstdp serve`` in a process
    of its own, log in ``<DATA_DIR>/server.log``), so a user can look while the data fill in:
    each step is written to ``<DATA_DIR>/demo-progress.json``
    (:mod:`backend.services.demo_progress`), which the landing page shows. ``--no-serve``
    starts no server and returns once the data are ready."""
    from backend.migrate import upgrade
    from backend.services.demo_progress import DemoProgress

    s = _settings()
    if not s.embedded:
        _say("note: CELERY_BROKER_URL is set; the demo uses that broker and its workers")
    t_start = time.perf_counter()
    s.root.mkdir(parents=True, exist_ok=True)
    progress = DemoProgress(s.root, of=7)

    def step(n: int, title: str) -> None:
        _say(f"[{n}/7] {title}")
        progress.step(n, title)

    worker = server = None
    _end_with_parent()
    # SIGTERM ends the demo through its `finally` (which stops the server's and the worker's
    # process groups and waits for them), as Ctrl-C does, rather than killing it on the spot.
    # PR_SET_PDEATHSIG (_die_with_parent) remains the net for SIGKILL.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    host, port = s.host, s.port
    ready = False
    try:
        # the server imports the app while the database is migrated (it touches the database
        # only when asked), so the browser answers as soon as both are done
        if not args.no_serve:
            server = _start_demo_server(s, host, port)
        step(1, f"database {_shown_url(s.sqlalchemy_url)}")
        upgrade(s.sqlalchemy_url)
        if server is not None:
            _wait_listening(server, s, host, port)
            _say(f"      serving on http://{host}:{port} while the data fill in (the landing page shows "
                 f"the progress; event browser /, API /api/v1, docs /docs; server log {s.root / 'server.log'})")
        if s.embedded:
            step(2, "starting a Celery worker (filesystem broker, no server needed)")
            log = open(s.root / "worker.log", "ab")
            worker = subprocess.Popen([sys.executable, "-m", "backend.cli", "worker", "--queues", "cpu",
                                       "--concurrency", str(args.concurrency), "--name", f"demo@{os.getpid()}"],
                                      stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(),
                                      start_new_session=True, preexec_fn=_die_with_parent)
        _demo_data_steps(args, s, step)
        demo_token = _demo_token()
        progress.finish()
        ready = True
        _say(f"demo ready in {time.perf_counter() - t_start:.0f} s")
        _say(f"reads need no token; to submit, follow or cancel your own jobs use the demo token (user 'demo', "
             f"scopes jobs:submit jobs:cancel, valid 30 days):\n      {demo_token}\n"
             "      (paste it once on the job form, or send it as `Authorization: Bearer <token>`)")
        if server is None:
            return 0
        _say(f"serving on http://{host}:{port}  (event browser /, API /api/v1, docs /docs; Ctrl-C stops)")
        return server.wait()
    except BaseException as exc:
        if not ready:
            progress.finish(error=f"stopped at step {progress.steps[-1]['step'] if progress.steps else 0}: "
                                  f"{type(exc).__name__} {exc}".strip())
        raise
    finally:
        for proc in (server, worker):
            if proc is not None:
                stop_process_group(proc, timeout_s=20)


def _demo_data_steps(args, s, step) -> None:
    """Steps 3 to 7 of ``lstdp demo``: simulate (once), ingest (and the real bad files),
    import the catalogues and the X-ray series, recalibrate every frame in the worker, detect
    flares. ``step(n, title)`` announces each (printed and written for the landing page)."""
    from sqlalchemy import func, select

    from backend.db import session_scope
    from backend.models import Frame
    from backend.services.jobs import JobRequest, submit_job

    sim_dir = s.root / "simulated"
    sizes = FULL_SIZES if args.full_size else (
        {c: args.size for c in DEMO_SIZES} if args.size else DEMO_SIZES)
    if not _demo_simulation_current(sim_dir):
        step(3, f"simulating LST frames from real scenes ({', '.join(f'{k} {v}px' for k, v in sizes.items())})")
        from pipelines.simulation import simulate

        t0 = time.perf_counter()
        # the EIT day (2004-03-01), the XRS day (2011-06-07, GOES M2.5) and the HMI JP2 WST frame (2023-01-31)
        simulate(sim_dir, naxis=sizes, noise=True, seed=args.seed, sdi_sequence=True, xrs_day=True,
                 wst_helioviewer=True)
        _say(f"      done in {time.perf_counter() - t0:.1f} s")
    else:
        step(3, f"simulated frames already in {sim_dir}")
    step(4, "ingesting raw frames and calibration masters (and the real bad files, to show quarantine)")
    files = _expand([str(sim_dir / "calibration"), str(sim_dir / "raw")])
    counts = ingest_files(files, move=False)
    inbox = s.root / "inbox"
    inbox.mkdir(exist_ok=True)
    bad = s.sample_data_dir / "bad-input"
    for f in sorted(bad.iterdir()) if bad.is_dir() else []:
        shutil.copy2(f, inbox / f.name)
    bad_counts = ingest_files(sorted(inbox.iterdir()), move=True)
    _say("      frames: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) +
         " | bad-input: " + ", ".join(f"{k} {v}" for k, v in sorted(bad_counts.items())))
    step(5, "importing real event catalogues")
    cmd_import_events(argparse.Namespace(folder=None))
    _say("      GOES XRS time series (X-ray context of the flares)")
    cmd_import_xray(argparse.Namespace(folder=None))
    step(6, "recalibration job over every frame (runs in the worker)")
    with session_scope() as sess:
        t_min, t_max = sess.execute(select(func.min(Frame.date_obs), func.max(Frame.date_obs))).one()
    job_id = None
    if t_min is not None:
        req = JobRequest(channels=["SDI", "WST", "SCI-UV", "SCI-WL"], start=t_min, end=t_max)
        with session_scope() as sess:
            job_id = submit_job(sess, req, owner="system", publishes=True).id
        state, error = wait_for_job(job_id, timeout=1200)
        _say(f"      job {job_id}: {state.value if state else 'unfinished'}{' - ' + error if error else ''}")
    step(7, "event detection on the L2 series (the job's follow-up detections, in the worker)")
    if job_id is None or not _wait_follow_ups(job_id, timeout=600):
        cmd_detect(argparse.Namespace(start=None, end=None, kind="flares", channel=None))


def _wait_follow_ups(job_id: str, *, timeout: float) -> bool:
    """Wait until the follow-up detections of ended job ``job_id`` (``job_follow_ups``: flares
    and prominences on SDI, CMEs on SCI, white-light flares on WST) have run in the worker,
    at most ``timeout`` [s], and say what each found. The demo used to run the flare detector
    itself beside them: the same detection twice, on one SQLite file at once (``database is
    locked`` retries), and a worker still busy with them when the demo stopped it.

    Returns False when the job queued none (the caller detects flares itself)."""
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Event, FollowUpState, JobFollowUp
    from pipelines.catalogues import DETECTED_SOURCE

    deadline = time.monotonic() + timeout
    while True:
        with session_scope() as s:
            rows = [(r.detector, r.channel, r.state, r.events, r.error) for r in s.scalars(
                select(JobFollowUp).where(JobFollowUp.job_id == job_id).order_by(JobFollowUp.detector,
                                                                                 JobFollowUp.channel))]
        if not rows:
            return False
        if all(state != FollowUpState.queued for _d, _c, state, _n, _e in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for detector, channel, state, n, error in rows:
        what = {FollowUpState.done: f"{n or 0} event(s)", FollowUpState.queued: f"not finished within {timeout:.0f} s"}
        _say(f"      {detector} on {channel}: {what.get(state, state.value)}{' - ' + error if error else ''}")
    with session_scope() as s:
        for e in s.scalars(select(Event).where(Event.source == DETECTED_SOURCE, Event.owner.is_(None))
                           .order_by(Event.start_time).limit(20)):
            _say("      " + _event_line(e))
    return True


def _shown_url(url: str) -> str:
    """A database URL as it may be printed or shown on a page: the password hidden."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: show its scheme only
        return url.split(":", 1)[0] + ":..."


def _start_demo_server(s, host: str, port: int) -> subprocess.Popen:
    """Start ``lstdp serve`` on ``host``:``port`` in a process group of its own (stopped with
    :func:`stop_process_group`; ``PR_SET_PDEATHSIG`` ends it if the demo is killed), its
    output in ``<DATA_DIR>/server.log``; :func:`_wait_listening` waits for it."""
    log = open(s.root / "server.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "backend.cli", "serve", "--host", str(host), "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(),
                            start_new_session=True, preexec_fn=_die_with_parent)


def _wait_listening(server: subprocess.Popen, s, host: str, port: int, wait_s: float = 120.0) -> None:
    """Wait until the demo's ``server`` accepts connections, at most ``wait_s`` [s] (a bound
    for a loaded machine, not a speed).

    Raises
    ------
    SystemExit
        The server ended before it listened (the port is taken, say): its log's last lines;
        or it did not listen within ``wait_s``.
    """
    import socket

    log_path = s.root / "server.log"
    probe = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = log_path.read_text(errors="replace")[-1500:]
            raise SystemExit(f"the demo's server on {host}:{port} ended before it listened "
                             f"(exit {server.returncode}); {log_path}:\n{tail}")
        try:
            with socket.create_connection((probe, int(port)), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the demo's server on {host}:{port} did not listen within {wait_s:.0f} s; see {log_path}")


def _exit_on_signal(signum, _frame) -> None:
    """A signal handler that ends the process through ``finally`` blocks (SystemExit 128+n)."""
    raise SystemExit(128 + signum)


def stop_process_group(proc: subprocess.Popen, *, timeout_s: float = 20.0) -> None:
    """Stop ``proc`` and every process of its process group (it was started with
    ``start_new_session``: a Celery worker, its pool and its reconciler): SIGTERM to ``proc``
    (a warm shutdown: the worker stops its pool and its reconciler itself), then SIGKILL to
    what is left of the group after ``timeout_s`` [s] (SIGTERM where ``proc`` has ended).
    Signals are ignored while this runs, so a second Ctrl-C or SIGTERM cannot leave the group
    half-stopped.

    ``proc`` alone first: SIGTERM to the whole group also reaches the idle pool children of a
    worker on the filesystem broker while they wait on the pool's task queue holding its read
    lock; killed so, they never release it, and the worker's exit (billiard's
    ``Pool._help_stuff_finish``, at interpreter exit) waited on that lock until the SIGKILL,
    ``timeout_s`` later (``lstdp demo`` took 20 s to stop, 2026-12-06)."""
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            proc.send_signal(signal.SIGTERM)  # nothing where proc was waited for already
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        try:  # the leader may be gone while its pool or reconciler are not
            os.killpg(proc.pid, signal.SIGKILL if proc.poll() is None else signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout_s)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _demo_token() -> str:
    """A new token for the demo's user (``demo``, scopes ``jobs:submit`` and ``jobs:cancel``,
    30 days): each run of the demo makes one, and revokes the ones earlier runs made."""
    from backend.auth import create_token, list_tokens, revoke_token
    from backend.db import session_scope

    with session_scope() as sess:
        for old in list_tokens(sess, "demo"):
            if old.description == "lstdp demo" and old.revoked_at is None:
                revoke_token(sess, old.id)
        _row, token = create_token(sess, "demo", ["jobs:submit", "jobs:cancel"], expires_in_days=30,
                                   description="lstdp demo")
    return token


def cmd_token(args) -> int:
    """``lstdp token create|list|revoke``: API tokens (whoever runs the CLI has the database
    and so acts as admin)."""
    from backend.auth import create_token, list_tokens, revoke_token, token_state
    from backend.db import session_scope

    with session_scope() as sess:
        if args.action == "create":
            days = None if args.no_expiry else args.expires_days
            row, token = create_token(sess, args.user, args.scope or ["jobs:submit", "jobs:cancel"],
                                      expires_in_days=days, description=args.description or "")
            sess.commit()
            expires = row.expires_at.isoformat().replace("+00:00", "Z") if row.expires_at else "never"
            print(f"token {row.id} for {row.user} (scopes: {' '.join(row.scopes)}; expires {expires}).\n"
                  "It is shown this once only (the platform keeps its SHA-256); store it now:", file=sys.stderr)
            print(token)
            return 0
        if args.action == "list":
            rows = list_tokens(sess, args.user)
            if args.json:
                print(json.dumps([{"id": r.id, "user": r.user, "prefix": r.prefix, "scopes": r.scopes,
                                   "state": token_state(r), "created_at": r.created_at.isoformat(),
                                   "expires_at": r.expires_at.isoformat() if r.expires_at else None,
                                   "last_used_at": r.last_used_at.isoformat() if r.last_used_at else None,
                                   "description": r.description} for r in rows], indent=1))
                return 0
            print(f"{'id':>4}  {'user':<16} {'prefix':<11} {'state':<8} {'expires':<20} scopes")
            for r in rows:
                exp = r.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ") if r.expires_at else "never"
                print(f"{r.id:>4}  {r.user:<16} {r.prefix + '...':<11} {token_state(r):<8} {exp:<20} "
                      f"{' '.join(r.scopes)}")
            return 0
        row = revoke_token(sess, args.id)
        print(f"token {row.id} of {row.user} revoked")
    return 0


def _job_line(job) -> str:
    return (f"job {job.id}: {job.state.value} ({job.done} done, {job.failed} failed, {job.skipped} skipped, "
            f"{job.cancelled or 0} cancelled of {job.total})")


def _reload_line(job_id: str) -> str:
    from backend.db import session_scope
    from backend.models import Job

    with session_scope() as sess:
        return _job_line(sess.get(Job, job_id))


def cmd_cancel(args) -> int:
    """Cancel a job as the platform (admin over every job): queued frames never start, frames
    being calibrated finish whole (``--wait``: until it has ended)."""
    from backend.auth import SYSTEM
    from backend.db import session_scope
    from backend.services.job_control import JobControlError, cancel_job

    try:
        with session_scope() as sess:
            job = cancel_job(sess, args.job, SYSTEM)
            line, ended = _job_line(job), job.state.value == "cancelled"
    except JobControlError as exc:
        print(f"lstdp cancel: {exc}", file=sys.stderr)
        return 1
    print(line if ended else f"{line}: asked to cancel; frames being calibrated finish first")
    if args.wait and not ended:
        wait_for_job(args.job, progress=False)
        print(_reload_line(args.job))
    return 0


def cmd_retry(args) -> int:
    """Run again the failed and cancelled frames of a failed or cancelled job, as the platform."""
    from backend.auth import SYSTEM
    from backend.db import session_scope
    from backend.services.job_control import JobControlError, retry_job, send_retry

    try:
        with session_scope() as sess:
            job, todo = retry_job(sess, args.job, SYSTEM)
            line = f"{_job_line(job)}: retry {job.retries}, {len(todo)} frame(s) sent"
            send_retry(sess, job, todo)
    except JobControlError as exc:
        print(f"lstdp retry: {exc}", file=sys.stderr)
        return 1
    print(line)
    if args.wait:
        state, _error = wait_for_job(args.job, progress=False)
        print(_reload_line(args.job))
        return 0 if state is not None and state.value == "succeeded" else 1
    return 0


def _add_job_control_parsers(sub) -> None:
    """``lstdp cancel JOB`` and ``lstdp retry JOB``."""
    cn = sub.add_parser("cancel", help="cancel a job (as admin): queued frames never start")
    cn.add_argument("job", help="job id")
    cn.add_argument("--wait", action="store_true", help="wait until it has ended")
    cn.set_defaults(func=cmd_cancel)
    rt = sub.add_parser("retry", help="run again the failed and cancelled frames of a job (as admin)")
    rt.add_argument("job", help="job id")
    rt.add_argument("--wait", action="store_true", help="wait until it ends (exit 1 unless it succeeds)")
    rt.set_defaults(func=cmd_retry)


# --------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    # Long: one declaration per command, in the order of `lstdp --help`; split by command it
    # would only scatter the CLI's shape over more functions
    p = argparse.ArgumentParser(prog="lstdp", description="ASO-S/LST data platform")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="simulate, ingest, import, calibrate, detect and serve (embedded mode)")
    d.add_argument("--full-size", action="store_true", help="full frames (4608/2048 px) instead of binned")
    d.add_argument("--size", type=int, help="one frame size for every channel [px] (tests use small ones)")
    d.add_argument("--no-serve", action="store_true", help="stop after preparing the data")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--concurrency", type=int, default=2)
    d.set_defaults(func=cmd_demo)

    sv = sub.add_parser("serve", help="run the API and event browser (uvicorn)")
    sv.add_argument("--host")
    sv.add_argument("--port", type=int)
    sv.set_defaults(func=cmd_serve)

    w = sub.add_parser("worker", help="run a Celery worker")
    w.add_argument("--queues", help="comma-separated: cpu, gpu (default WORKER_QUEUES)")
    w.add_argument("--concurrency", type=int)
    w.add_argument("--pool", choices=["prefork", "solo", "threads"])
    w.add_argument("--loglevel", default="info")
    w.add_argument("--name", default="lstdp@%h")
    w.add_argument("--no-reconciler", action="store_true",
                   help="do not start the reconciler beside the worker (run `lstdp reconcile` elsewhere)")
    w.set_defaults(func=cmd_worker)

    rc = sub.add_parser("reconcile", help="re-send lost work, settle counts, end settled jobs (periodic)")
    rc.add_argument("--once", action="store_true", help="one pass, its report as JSON")
    rc.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    rc.set_defaults(func=cmd_reconcile)

    sm = sub.add_parser("simulate", help="build raw LST frames from the real scenes in the sample data")
    sm.add_argument("--out", default="var/simulated")
    sm.add_argument("--channels", nargs="+", default=["SDI", "WST", "SCI-UV", "SCI-WL"])
    g = sm.add_mutually_exclusive_group()
    g.add_argument("--size", type=int, help="frame size for every channel [px]")
    g.add_argument("--full-size", action="store_true")
    sm.add_argument("--no-noise", action="store_true")
    sm.add_argument("--no-sequence", action="store_true", help="skip the 13-frame SDI flare sequence")
    sm.add_argument("--seed", type=int, default=0)
    sm.add_argument("--xrs-day", action="store_true",
                    help="add the SDI series of 2011-06-07 around the GOES M2.5 flare (scene: SWAP 2012-01-01)")
    sm.add_argument("--wst-helioviewer", action="store_true",
                    help="add a WST frame of 2023-01-31 from the Helioviewer HMI continuum JPEG 2000")
    sm.set_defaults(func=cmd_simulate)

    i = sub.add_parser("ingest", help="register FITS files (frames or calibration masters)")
    i.add_argument("paths", nargs="+")
    i.add_argument("--copy", action="store_true", help="copy into the store instead of moving")
    i.add_argument("--via-worker", action="store_true", help="queue an ingest task per file")
    i.add_argument("--strict", action="store_true", help="exit 1 if any file was rejected")
    i.set_defaults(func=cmd_ingest)

    ie = sub.add_parser("import-events", help="import event catalogues (default: the sample data)")
    ie.add_argument("folder", nargs="?")
    ie.set_defaults(func=cmd_import_events)

    ix = sub.add_parser("import-xray", help="ingest GOES XRS time series (default: the sample data)")
    ix.add_argument("folder", nargs="?")
    ix.set_defaults(func=cmd_import_xray)

    c = sub.add_parser("calibrate", help="submit a recalibration job")
    c.add_argument("--channels", nargs="+", required=True)
    c.add_argument("--start", required=True)
    c.add_argument("--end", required=True)
    c.add_argument("--pin", action="append", help="KIND=VERSION, e.g. flat=2")
    c.add_argument("--wait", action="store_true")
    c.set_defaults(func=cmd_calibrate)

    rr = sub.add_parser("rerun", help="re-run a product or job manifest (or a job id) and compare the data",
                        description="Recalibrate the manifest's frames with exactly its calibration files (by id, "
                                    "checked against their sha256) and options; report per frame whether the "
                                    "data are identical (bit for bit) or how far they differ.")
    rr.add_argument("manifest", help="a product or job manifest file (GET /api/v1/.../manifest), or a job id")
    rr.add_argument("--no-wait", action="store_true", help="queue it and return")
    rr.add_argument("--json", action="store_true", help="print the per-frame results as JSON")
    rr.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait [1800]")
    rr.set_defaults(func=cmd_rerun)

    from pipelines.detect.registry import DETECTORS

    de = sub.add_parser("detect", help="run a detector on the L2 series (default: SDI flares)")
    de.add_argument("--kind", choices=list(DETECTORS), default="flares",
                    help=", ".join(f"{d.name} ({'/'.join(d.channels)})" for d in DETECTORS.values()))
    de.add_argument("--channel", help="; ".join(f"{' or '.join(d.channels)} for {d.name} (default {d.default_channel})"
                                                for d in DETECTORS.values() if len(d.channels) > 1))
    de.add_argument("--start")
    de.add_argument("--end")
    de.set_defaults(func=cmd_detect)

    fk = sub.add_parser("fsck", help="compare the database with the product, raw and calibration stores",
                        description="Find written products whose file is missing or differs from its "
                        "SHA-256, product files no written row names, temporary files of killed writes, "
                        "rows pointing outside the store, and missing or changed frames and masters. "
                        "Exit 0 when clean, 1 when problems remain.")
    fk.add_argument("--repair", action="store_true",
                    help="repair the safe ones: remove old temporary files, quarantine orphan files, "
                    "fail written products whose file is missing or damaged (the next job re-plans them), "
                    "make missing quicklooks again; report the rest")
    fk.add_argument("--json", action="store_true", help="print the report as JSON")
    fk.add_argument("--no-checksums", action="store_true",
                    help="check presence only (the SHA-256 pass reads every byte of every file)")
    fk.set_defaults(func=cmd_fsck)

    from backend.scopes import SCOPES  # not backend.auth: every CLI process builds this parser

    tk = sub.add_parser("token", help="API tokens: create (shown once), list, revoke",
                        description="Reads need no token; writes need one with a scope: "
                        + "; ".join(f"{k}: {v}" for k, v in SCOPES.items()))
    tks = tk.add_subparsers(dest="action", required=True)
    tc = tks.add_parser("create", help="make a token and print it (once)")
    tc.add_argument("--user", required=True)
    tc.add_argument("--scope", action="append", choices=list(SCOPES),
                    help="repeat for several (default: jobs:submit and jobs:cancel)")
    tc.add_argument("--expires-days", type=float, default=90.0, help="lifetime [days] (default 90)")
    tc.add_argument("--no-expiry", action="store_true", help="a token that never expires")
    tc.add_argument("--description", default="")
    tl = tks.add_parser("list", help="tokens (never the tokens themselves: their prefixes)")
    tl.add_argument("--user")
    tl.add_argument("--json", action="store_true")
    tr = tks.add_parser("revoke", help="revoke a token by its id")
    tr.add_argument("id", type=int)
    tk.set_defaults(func=cmd_token)

    _add_job_control_parsers(sub)
    db = sub.add_parser("db", help="database migrations")
    db.add_argument("action", choices=["upgrade", "downgrade"])
    db.add_argument("revision", nargs="?")
    db.set_defaults(func=cmd_db)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one clear line for the user; the traceback with LSTDP_DEBUG=1
        if os.environ.get("LSTDP_DEBUG"):
            raise
        from backend.db import SCHEMA_MISSING, is_schema_missing

        if is_schema_missing(exc):
            print(f"lstdp {args.command}: error: {SCHEMA_MISSING}", file=sys.stderr)
            return 1
        text = str(exc).splitlines()[0] if str(exc) else ""  # not the SQL and the link SQLAlchemy append
        print(f"lstdp {args.command}: error: {type(exc).__name__}: {text}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
