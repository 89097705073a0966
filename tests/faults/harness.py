"""Reusable pieces of the fault-injection tests and of ``benchmarks/faults.py``.

* :class:`PostgresServer`, :class:`RedisServer`: private servers on ports of their own
  (never the shared ones on 5432/6379), as context managers, with ``stop``/``start``/
  ``restart``/``kill9``/``freeze`` (SIGSTOP)/``thaw`` (SIGCONT); Redis also ``flushall``.
* :class:`Worker`: an ``lstdp worker`` process (started through
  :mod:`tests.faults.worker_main`, which only adds test hooks) with its log in a folder;
  ``kill_child`` kills one pool process with SIGKILL, ``kill_main`` the main process (what
  is left of it is killed when it is restarted, as systemd or Docker do), ``restart``
  starts it again under the same name.
* :func:`make_raw_frames` / :func:`prepare_frames`: N small raw WST frames with distinct
  DATE-OBS, from one short simulation, ingested with their calibration masters.
* :func:`settle`, :func:`settle_bound`, :func:`check_invariants`, :func:`read_journal`,
  :func:`delivery_report`: waiting for a job and judging how it ended.

Every process is stopped by its own PID; nothing here touches a server it did not start.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path(sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]) if Path("/usr/lib/postgresql").is_dir() else None
REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"

#: The channel, frame size [px] and cadence [s] of the frames the fault tests calibrate:
#: a 64 px WST frame calibrates in a fraction of a second, so a job of 60 takes seconds.
CHANNEL = "WST"
FRAME_PX = 64
CADENCE_S = 120.0


# --------------------------------------------------------------------------------- helpers
def free_port() -> int:
    """A TCP port nothing listens on now (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s:.0f} s")


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _children(pid: int) -> list[int]:
    """Live direct children of ``pid`` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if rest[0] != "Z" and int(rest[1]) == pid:
            out.append(int(d))
    return sorted(out)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


# --------------------------------------------------------------------------------- PostgreSQL
class PostgresServer:
    """A private PostgreSQL cluster in a temporary folder, run as the ``postgres`` user.

    ``fsync`` and ``full_page_writes`` are off: the tests restart it (fast or immediate)
    but never crash the operating system, so what reached the kernel survives.
    ``synchronous_commit`` stays on: with it off, an immediate shutdown loses the commits
    of its last fraction of a second, which a worker was told had succeeded (a product
    ``written`` by the task, ``writing`` after the restart).
    """

    def __init__(self, port: int | None = None, *, base: Path | None = None):
        """``base``: where its folder is made (default the system's temporary folder); the
        ``postgres`` user must be able to traverse it."""
        self.port = port or free_port()
        self.base = Path(tempfile.mkdtemp(prefix="lstdp-faults-pg-", dir=base))
        self.data = self.base / "data"
        self.sock = self.base / "sock"
        self.log = self.base / "postgres.log"
        self.frozen: list[int] = []

    # -- life cycle
    def _as_postgres(self, *argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        r = subprocess.run(["runuser", "-u", "postgres", "--", *argv], capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"{Path(argv[0]).name} exited with {r.returncode}: {(r.stderr or r.stdout).strip()}")
        return r

    def init(self) -> PostgresServer:
        self.sock.mkdir()
        shutil.chown(self.base, "postgres", "postgres")
        shutil.chown(self.sock, "postgres", "postgres")
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                          "-E", "UTF8", "--locale=C", "--no-sync")
        return self

    def _options(self) -> str:
        return " ".join([f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-k {self.sock}",
                         "-c fsync=off", "-c full_page_writes=off",
                         "-c max_connections=200", "-c shared_buffers=64MB"])

    def start(self) -> None:
        """Start the server and wait until it takes connections."""
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o",
                          self._options(), "-w", "-t", "60", "start")
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self.thaw()
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop",
                          check=False)

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m fast|immediate``: every connection is cut; the server comes back."""
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-m", mode,
                          "-o", self._options(), "-w", "-t", "60", "restart")
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 60) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            r = self._as_postgres(str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), check=False)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError(f"PostgreSQL on port {self.port} not ready after {timeout_s:.0f} s")

    @property
    def pid(self) -> int | None:
        """The postmaster's PID (``postmaster.pid``), or None when it is not running."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def processes(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, ...)."""
        pid = self.pid
        return [pid, *_children(pid)] if pid else []

    def running(self) -> bool:
        return self.pid is not None

    def kill9(self) -> None:
        """SIGKILL the postmaster and all its processes (a crashed host, as far as PostgreSQL knows).

        Returns once they are gone from /proc, zombies reaped included: a new postmaster
        takes a PID that still answers ``kill(pid, 0)`` in its lock files for a live one.
        """
        procs = self.processes()
        for p in procs:
            _signal(p, signal.SIGKILL)
        t0 = time.monotonic()
        while any(Path(f"/proc/{p}").exists() for p in procs) and time.monotonic() - t0 < 20:
            time.sleep(0.05)

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every backend: connections stay open, nothing answers."""
        self.frozen = self.processes()
        for p in self.frozen:
            _signal(p, signal.SIGSTOP)

    def thaw(self) -> None:
        for p in self.frozen:
            _signal(p, signal.SIGCONT)
        self.frozen = []

    def ensure_running(self) -> None:
        """Start it again if a test left it stopped or killed (or frozen)."""
        self.thaw()
        if not self.running():
            for lock in [self.data / "postmaster.pid", *self.sock.glob(".s.PGSQL.*.lock")]:
                try:
                    pid = int(lock.read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    pid = 0
                if not pid or not Path(f"/proc/{pid}").exists():
                    lock.unlink(missing_ok=True)
            self.start()

    # -- databases
    def url(self, db: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def sql(self, statement: str, db: str = "postgres") -> None:
        """Run one statement in autocommit (CREATE/DROP DATABASE)."""
        from sqlalchemy import create_engine, text

        engine = create_engine(self.url(db), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as c:
                c.execute(text(statement))
        finally:
            engine.dispose()

    def create_database(self, name: str, template: str | None = None) -> str:
        self.sql(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def __enter__(self) -> PostgresServer:
        try:
            self.init()
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.thaw()
        if self.running():
            self.stop("immediate")
        for p in self.processes():
            _signal(p, signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)


# --------------------------------------------------------------------------------- Redis
class RedisServer:
    """A private Redis server without persistence (``--save '' --appendonly no``): a restart
    or a kill loses every queued message, as a broker without persistence does."""

    def __init__(self, port: int | None = None, *, base: Path | None = None):
        self.port = port or free_port()
        self.base = Path(tempfile.mkdtemp(prefix="lstdp-faults-redis-", dir=base))
        self.log = self.base / "redis.log"
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.base), "--logfile", str(self.log), "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _wait_port(self.port, 20)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def running(self) -> bool:
        return self.pid is not None

    def stop(self) -> None:
        if self.proc is None:
            return
        _signal(self.proc.pid, signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self, *, kill: bool = False) -> None:
        """Stop (or SIGKILL) and start again on the same port: every key is gone."""
        self.kill9() if kill else self.stop()
        self.start()

    def freeze(self) -> None:
        if self.pid:
            _signal(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.pid:
            _signal(self.pid, signal.SIGCONT)

    def client(self, db: int = 0):
        import redis

        return redis.Redis.from_url(self.url(db), socket_timeout=5)

    def flushall(self) -> None:
        """FLUSHALL: every queued and unacknowledged message, binding and result is gone."""
        self.client().flushall()

    def ensure_running(self) -> None:
        self.thaw()
        if not self.running():
            self.start()

    def __enter__(self) -> RedisServer:
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.thaw()
        self.kill9()
        shutil.rmtree(self.base, ignore_errors=True)


# --------------------------------------------------------------------------------- workers
def worker_env(*, database_url: str, redis: RedisServer, data_dir: Path, raw_dir: Path, calibration_dir: Path,
               journal: Path | None = None, **extra: str | float | int) -> dict[str, str]:
    """The environment of a worker (and of the test process) for one scenario."""
    from backend.settings import ENV_NAMES

    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES and not k.startswith("LSTDP_FAULTS_")}
    env.update(DATABASE_URL=database_url, CELERY_BROKER_URL=redis.url(0), CELERY_RESULT_BACKEND=redis.url(1),
               DATA_DIR=str(data_dir), RAW_DIR=str(raw_dir), CALIBRATION_DIR=str(calibration_dir),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               PYTHONUNBUFFERED="1")
    if journal is not None:
        env["LSTDP_FAULTS_JOURNAL"] = str(journal)
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Worker:
    """One ``lstdp worker`` (queue ``cpu``) in its own process group, log in ``log_dir``.

    Started through :mod:`tests.faults.worker_main` (``lstdp`` plus the test hooks, which do
    nothing unless their variables are set). ``kill_main`` leaves the pool children as
    orphans; ``restart`` kills what is left of the old process group first, as a supervisor
    (systemd's control-group kill, ``docker restart``) does, then starts a new worker under
    the same name.

    Supervised, as compose's ``restart: unless-stopped`` does in production: a worker that
    exits by itself (Celery ends with "Unrecoverable error" when a pool child is killed
    while it starts, or after a lost broker connection) is started again within about a
    second; ``supervised_restarts`` counts those. A main process killed by the harness is
    left for the test to restart.
    """

    def __init__(self, name: str, env: dict[str, str], log_dir: Path, *, concurrency: int = 2,
                 rng: random.Random | None = None):
        self._lock = threading.RLock()
        self._stopping = False
        self._expected_exit = False
        self._watcher: threading.Thread | None = None
        self.supervised_restarts = 0
        self.name = name
        self.env = env
        self.log_dir = Path(log_dir)
        self.concurrency = concurrency
        self.rng = rng or random.Random()
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None
        self.starts = 0
        self.kills: list[tuple[float, str, int]] = []  # (time, "child"|"main", pid)

    @property
    def log(self) -> Path:
        return self.log_dir / f"worker-{self.name.split('@')[0]}.log"

    def _watch(self) -> None:
        """The supervisor: start the worker again when it exited without being asked to."""
        while not self._stopping:
            time.sleep(0.5)
            with self._lock:
                if (self._stopping or self._expected_exit or self.proc is None
                        or self.proc.poll() is None):
                    continue
                rc = self.proc.returncode
                self.supervised_restarts += 1
                with open(self.log, "ab") as log:
                    log.write(f"\n===== supervisor: {self.name} exited with {rc}; starting it again =====\n"
                              .encode())
                self._kill_group()
                self.start(wait_ready=False)

    def start(self, *, wait_ready: bool = True, timeout_s: float = 90) -> Worker:
        with self._lock:
            self._stopping = False
            self._expected_exit = False
            self._start_process()
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch, name=f"supervise-{self.name}", daemon=True)
                self._watcher.start()
        if wait_ready:
            self.wait_ready(timeout_s)
        return self

    def _start_process(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log, "ab") as log:
            log.write(f"\n===== start {self.starts} of {self.name} at {time.strftime('%H:%M:%S')} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.worker_main", "worker", "--queues", "cpu", "--concurrency",
                 str(self.concurrency), "--name", self.name, "--loglevel", "info"],
                cwd=str(ROOT), env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pgid = self.proc.pid

    def wait_ready(self, timeout_s: float = 90) -> None:
        """Until this start's pool children are up and the log says ``ready``."""
        t0 = time.monotonic()
        marker = f"===== start {self.starts} of {self.name}"
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None and self._expected_exit:
                raise RuntimeError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            text = self.log.read_text(errors="replace")
            marker = f"===== start {self.starts} of {self.name}"  # the supervisor may have started it again
            tail = text[text.rfind(marker):]
            if " ready." in tail and len(self.pool_children()) >= self.concurrency:
                return
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name} not ready after {timeout_s:.0f} s:\n{self.tail()}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def alive(self) -> bool:
        return self.pid is not None

    def pool_children(self) -> list[int]:
        """The prefork pool processes: children of the main process running the same
        command line (a reconciler started as a separate command is not one of them)."""
        pid = self.pid
        if pid is None:
            return []
        me = _cmdline(pid)
        return [c for c in _children(pid) if _cmdline(c) == me]

    def kill_child(self, pid: int | None = None) -> int | None:
        """SIGKILL one pool process (a random one unless ``pid``); returns its PID."""
        kids = self.pool_children()
        if not kids:
            return None
        pid = pid or self.rng.choice(kids)
        _signal(pid, signal.SIGKILL)
        self.kills.append((time.time(), "child", pid))
        return pid

    def kill_main(self) -> int | None:
        """SIGKILL the main process only (its pool children live on as orphans until restart)."""
        with self._lock:
            pid = self.pid
            if pid is None:
                return None
            self._expected_exit = True  # the test restarts it
            _signal(pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.kills.append((time.time(), "main", pid))
            return pid

    def _kill_group(self) -> None:
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10 and any(_alive(p) for p in _group_members(self.pgid)):
                time.sleep(0.05)

    def restart(self, *, wait_ready: bool = True) -> Worker:
        """What a supervisor does after the worker died: kill what is left, start again."""
        with self._lock:
            self._expected_exit = True
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self._kill_group()
        return self.start(wait_ready=wait_ready)

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM (warm shutdown), then SIGKILL of the whole group; the supervisor stops."""
        with self._lock:
            self._stopping = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group()

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"


def _group_members(pgid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(rest[2]) == pgid and rest[0] != "Z":
                out.append(int(d))
    return out


@functools.lru_cache
def has_reconcile_command() -> bool:
    """Whether ``lstdp reconcile`` exists in this checkout (issue #10; started by the worker)."""
    return _has_command("reconcile")


def _has_command(name: str) -> bool:
    """Whether ``lstdp`` of this checkout has the subcommand ``name``: read from its argument
    parser in this process (``lstdp NAME --help`` in a subprocess said the same in ~3 s)."""
    import argparse

    from backend.cli import build_parser

    return any(isinstance(a, argparse._SubParsersAction) and name in a.choices for a in build_parser()._actions)


# --------------------------------------------------------------------------------- frames
def simulate_templates(out: Path, n: int = 4, *, seed: int = 11) -> Path:
    """Simulate ``n`` raw WST frames and their masters (a few seconds); returns ``out``."""
    from pipelines.simulation import simulate

    if not (out / "manifest.json").exists():
        simulate(out, channels=(CHANNEL,), naxis=FRAME_PX, noise=True, seed=seed, sdi_sequence=False,
                 frames_per_channel=n)
    return out


def compile_kernels(templates: Path) -> float:
    """Calibrate one simulated frame of ``templates`` in this process, once, before any worker
    starts; returns the seconds it took.

    The calibration's Numba kernels (:mod:`pipelines.calibration.l2._fused_numba`,
    ``cache=True``) are compiled on their first use and kept in the checkout's
    ``__pycache__``. In a fresh clone (CI) no cache is there yet: the pool processes of the
    first scenario compiled them in their first calibrations, two at once on two cores, each
    past the fault settings' 8 s soft time limit, so the compilation was cut off and started
    again by the next frame (measured: 30 s lost, six frames failed on the soft time limit
    instead of being calibrated). Compiled here once, every worker loads them from the cache.
    """
    import numpy as np

    from pipelines.calibration.l2.flow import calibrate_frame, load_calibration_master
    from pipelines.fitsio import read_image

    t0 = time.perf_counter()
    raw = read_image(sorted((templates / "raw").glob("*.fits"))[0], dtype=np.float32)
    cals = {}
    for p in sorted((templates / "calibration").glob("*.fits")):
        cal = load_calibration_master(p)
        cals[cal.kind] = cal
    calibrate_frame(raw.data, raw.header, cals)
    return time.perf_counter() - t0


def frame_name(i: int) -> str:
    """The raw file name (and header ``FILENAME``) of frame ``i`` of :func:`make_raw_frames`."""
    return f"lst_{CHANNEL.lower()}_fault{i:04d}_raw.fits"


def make_raw_frames(templates: Path, dest: Path, n: int, *, t0: dt.datetime | None = None) -> list[Path]:
    """``n`` raw frames in ``dest``: the simulated ones in turn, each with its own DATE-OBS
    (``CADENCE_S`` apart from the first template's), ``FILENAME`` and checksums.

    The pixels are those of the simulation (the masters match them); only the time and the
    name change, so each file has its own SHA-256 and the ingest takes every one.
    """
    from astropy.io import fits

    from pipelines.fitsio import parse_date_obs

    raws = sorted((templates / "raw").glob("*.fits"))
    if not raws:
        raise FileNotFoundError(f"no simulated raw frames in {templates / 'raw'}")
    dest.mkdir(parents=True, exist_ok=True)
    if t0 is None:
        first = fits.getheader(raws[0])
        t0 = parse_date_obs(str(first["DATE-OBS"])).to_datetime()
    out = []
    for i in range(n):
        with fits.open(raws[i % len(raws)], do_not_scale_image_data=True) as hdul:
            h = hdul[0].header
            when = (t0 + dt.timedelta(seconds=CADENCE_S * i)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
            for key in ("DATE-OBS", "DATE_OBS"):
                if key in h:
                    h[key] = when
            h["FILENAME"] = frame_name(i)
            path = dest / frame_name(i)
            hdul.writeto(path, checksum=True, overwrite=True)
        out.append(path)
    return out


def ingest(paths: list[Path]) -> dict[str, int]:
    """Ingest ``paths`` into the database of the current settings (masters first)."""
    from backend.db import session_scope
    from backend.services.ingest import ingest_path
    from backend.settings import get_settings

    s = get_settings()
    s.ensure_dirs()
    counts: Counter[str] = Counter()
    for p in sorted(paths, key=lambda p: (0 if "calibration" in p.parts else 1, str(p))):
        with session_scope() as session:
            out = ingest_path(session, p, s, move=False)
        counts[out.status] += 1
        if out.status == "rejected":
            raise RuntimeError(f"ingest rejected {p}: {out.reason}")
    return dict(counts)


def prepare_frames(templates: Path, work: Path, n: int) -> dict[str, int]:
    """Make ``n`` raw frames in ``work/incoming`` and ingest them and the masters."""
    files = make_raw_frames(templates, work / "incoming", n)
    return ingest(sorted((templates / "calibration").glob("*.fits")) + files)


def use_settings(env: dict[str, str]) -> None:
    """Point this process's settings, engine and Celery app at ``env`` (a :func:`worker_env`)."""
    from backend import db as dbmod
    from backend.broker import ensure_configured
    from backend.settings import ENV_NAMES, get_settings

    for k in list(os.environ):
        if (k in ENV_NAMES or k.startswith("LSTDP_FAULTS_")) and k not in env:
            del os.environ[k]
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
    get_settings.cache_clear()
    dbmod.reset_caches()
    app = ensure_configured()
    # the result backend is cached per thread and not rebuilt by a new configuration: the
    # next send would subscribe to the previous scenario's (stopped) Redis and block
    vars(app._local).pop("backend", None)
    app._backend_cache = None


# --------------------------------------------------------------------------------- jobs
def frame_span(n: int | None = None) -> tuple[dt.datetime, dt.datetime, list[int]]:
    """DATE-OBS of the first and the ``n``-th frame (all when None), and their ids."""
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Frame

    with session_scope() as s:
        rows = s.execute(select(Frame.id, Frame.date_obs).order_by(Frame.date_obs, Frame.id)).all()
    rows = rows[:n] if n else rows
    return rows[0][1], rows[-1][1], [r[0] for r in rows]


def submit(n: int | None = None) -> str:
    """Submit a WST recalibration job over the first ``n`` frames; returns its id."""
    from backend.db import session_scope
    from backend.services.jobs import JobRequest, submit_job

    start, end, _ = frame_span(n)
    with session_scope() as s:
        job = submit_job(s, JobRequest(channels=[CHANNEL], start=start, end=end), owner="faults")
        return job.id


@dataclass
class JobView:
    state: str | None
    total: int
    done: int
    failed: int
    skipped: int
    error: str | None
    finished: int  # products written or failed among the job's

    @property
    def terminal(self) -> bool:
        return self.state in ("succeeded", "failed")


def job_view(job_id: str) -> JobView:
    from sqlalchemy import func, select

    from backend.db import session_scope
    from backend.models import Job, Product, ProductState

    with session_scope() as s:
        j = s.get(Job, job_id)
        finished = s.scalar(select(func.count()).select_from(Product).where(
            Product.job_id == job_id, Product.state.in_([ProductState.written, ProductState.failed])))
        return JobView(j.state.value, j.total, j.done, j.failed, j.skipped, j.error, finished or 0)


def wait_progress(job_id: str, fraction: float, timeout_s: float = 120) -> JobView:
    """Until at least ``fraction`` of the job's frames are finished (or it ended)."""
    t0 = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            v = job_view(job_id)
            if v.terminal or (v.total and v.finished >= fraction * v.total):
                return v
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"job {job_id} made no progress to {fraction:.0%} in {timeout_s:.0f} s")
        time.sleep(0.1)


def settle_bound(env: dict[str, str], work_s: float = 20.0) -> float:
    """How long a job may take to end after the last fault [s]: a product whose worker
    died is taken back after the lease (``TASK_TIME_LIMIT_S`` + 60 s, ``Settings.lease_s``)
    by the reconciler, which runs every ``RECONCILE_INTERVAL_S``; three periods for it to
    see, take back and close, plus ``work_s`` for the work still to do (and a restart)."""
    hard = float(env.get("TASK_TIME_LIMIT_S", 900))
    interval = float(env.get("RECONCILE_INTERVAL_S", 30))
    return hard + 60.0 + 3 * interval + work_s


def settle(job_id: str, bound_s: float, *, poll_s: float = 0.25) -> tuple[JobView | None, float]:
    """Wait until the job is terminal or ``bound_s`` passed; returns (last view, seconds).

    Database errors while polling (a server restarting or frozen) are waited out.
    """
    t0 = time.monotonic()
    view = None
    while time.monotonic() - t0 < bound_s:
        try:
            view = job_view(job_id)
        except Exception:  # noqa: BLE001 - the server may be restarting
            time.sleep(poll_s)
            continue
        if view.terminal:
            return view, time.monotonic() - t0
        time.sleep(poll_s)
    return view, time.monotonic() - t0


# --------------------------------------------------------------------------------- journal
def read_journal(path: Path) -> list[dict]:
    """The journal's events (a line cut short by a kill is skipped)."""
    out = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


@dataclass
class DeliveryReport:
    """What the journal says about the job's tasks."""

    starts: dict[int, int] = field(default_factory=dict)          # product id -> calibrate_product starts
    writes: dict[str, int] = field(default_factory=dict)          # product path -> completed writes
    rewrites: dict[str, int] = field(default_factory=dict)        # path -> writes after one that committed
    counts: dict[int, int] = field(default_factory=dict)          # product id -> record_progress runs
    follow_ups: dict[tuple, set] = field(default_factory=dict)    # (detector, channel) -> detect_events ids

    @property
    def max_starts(self) -> int:
        return max(self.starts.values(), default=0)


def delivery_report(events: list[dict]) -> DeliveryReport:
    """Starts, writes and follow-ups per product from the journal.

    A *rewrite* is a completed write of a product path after an earlier calibration of that
    product returned ``written`` (its row committed): the file under a ``written`` row was
    replaced. A write again after a calibration that was killed or failed before it
    returned is a redo, not a rewrite.
    """
    rep = DeliveryReport()
    starts: Counter[int] = Counter()
    writes: Counter[str] = Counter()
    counts: Counter[int] = Counter()
    committed: set[int] = set()          # products whose calibrate_product returned written
    pid_product: dict[int, int] = {}     # process -> product it is calibrating
    rewrites: Counter[str] = Counter()
    for e in sorted(events, key=lambda e: e["t"]):
        ev, task = e["ev"], e.get("task", "")
        if ev == "prerun" and task.endswith(".calibrate_product") and e.get("args"):
            pid_product[e["pid"]] = int(e["args"][0])
            starts[int(e["args"][0])] += 1
        elif ev == "prerun" and task.endswith(".record_progress") and len(e.get("args") or ()) > 1:
            counts[int(e["args"][1])] += 1  # a settling link of an earlier version's chain
        elif ev == "prerun" and task.endswith(".detect_events"):
            kw = e.get("kwargs") or {}
            rep.follow_ups.setdefault((kw.get("detector"), kw.get("channel")), set()).add(e["id"])
        elif ev == "write":
            writes[e["path"]] += 1
            prod = pid_product.get(e["pid"])
            if prod is not None and prod in committed:
                rewrites[e["path"]] += 1
        elif ev == "postrun" and task.endswith(".calibrate_product") and e.get("args"):
            rv = e.get("retval")
            if len(e["args"]) > 1 and e["args"][1] and isinstance(rv, dict) and "job_state" in rv:
                counts[int(e["args"][0])] += 1  # the task settled its job's item itself
            if isinstance(rv, dict) and rv.get("state") == "written":
                committed.add(int(e["args"][0]))
            pid_product.pop(e["pid"], None)
    rep.starts, rep.writes, rep.rewrites, rep.counts = dict(starts), dict(writes), dict(rewrites), dict(counts)
    return rep


def in_flight(events: list[dict]) -> list[dict]:
    """Task starts with no end yet in a process that is still alive (a killed process's
    unfinished start is not in flight)."""
    open_: dict[tuple[int, str], dict] = {}
    for e in events:
        if e["ev"] == "prerun":
            open_[(e["pid"], e["id"])] = e
        elif e["ev"] == "postrun":
            open_.pop((e["pid"], e["id"]), None)
    return [e for (pid, _), e in open_.items() if _alive(pid)]


def quiesce(journal: Path, timeout_s: float) -> list[dict]:
    """Wait until no task runs in any worker (after a job ended, a slow first delivery may
    still be writing); returns those still running after ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        running = in_flight(read_journal(journal))
        if not running or time.monotonic() - t0 > timeout_s:
            return running
        time.sleep(0.2)


# --------------------------------------------------------------------------------- invariants
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache
def has_fsck_command() -> bool:
    """Whether ``lstdp fsck`` exists in this checkout (the store check of issue #10)."""
    return _has_command("fsck")


def run_cli(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """``lstdp ARGV`` (:func:`backend.cli.main`, its parsing and exit status) in this process
    under the settings of ``env`` (a :func:`worker_env`); returns (exit status, what it printed).

    In this process, not a subprocess: a Python start with the CLI's imports took ~3 s of
    every scenario on a 2-core machine. The settings, engine and Celery app are those of
    :func:`use_settings`, the same ``env`` a subprocess would get.
    """
    import io

    from backend import cli
    from backend.settings import ENV_NAMES

    if any(os.environ.get(k) != v for k, v in env.items() if k in ENV_NAMES):
        use_settings(env)  # the settings a subprocess with ``env`` would read
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = cli.main(argv)
    return rc, buf.getvalue()


def store_check(env: dict[str, str]) -> list[str]:
    """The product store's own check: ``lstdp fsck --json`` where it exists (exit 0 when
    clean), else no temporary files under the store and every FITS file there with exactly
    one ``written`` row of that path (and every ``written`` row with its file)."""
    if has_fsck_command():
        rc, out = run_cli(["fsck", "--json"], env)
        return [] if rc == 0 else [f"lstdp fsck exit {rc}: {out[-1500:]}"]
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Product, ProductState
    from backend.settings import get_settings

    store = get_settings().products
    problems = []
    if not store.exists():
        return problems
    for p in store.rglob("*"):
        if p.is_file() and (p.name.endswith((".part", ".part.png")) or p.name.startswith(".")):
            problems.append(f"partial or temporary file in the store: {p.relative_to(store)}")
    with session_scope() as s:
        rows = s.execute(select(Product.path, Product.state)).all()
    written = Counter(path for path, state in rows if state == ProductState.written and path)
    for p in store.rglob("*.fits"):
        if p.name.startswith("."):
            continue
        n = written.get(str(p), 0)
        if n != 1:
            problems.append(f"{p.relative_to(store)}: {n} written rows (expected 1)" + (" (orphan file)" if not n else ""))
    for path in written:
        if not Path(path).exists():
            problems.append(f"written row's file is missing: {path}")
    return problems


def check_invariants(job_id: str, *, env: dict[str, str] | None = None, frame_ids: list[int] | None = None) -> list[str]:
    """The violations of the issue's end state for job ``job_id`` (empty when it holds).

    * the job is terminal, and ``done + failed + skipped == total == frames``;
    * every frame of the job has exactly one product row: ``written`` with its file
      present and of the row's SHA-256, or ``failed`` with a non-empty reason;
    * the job's counts agree with its products (``done`` = written, ``failed`` = failed);
    * the store holds no partial or orphan file (:func:`store_check`).
    """
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Job, Product, ProductState

    out: list[str] = []
    with session_scope() as s:
        job = s.get(Job, job_id)
        if job is None:
            return [f"job {job_id} does not exist"]
        if frame_ids is None:
            from backend.worker.processing import frames_for_job

            frame_ids = [f.id for f in frames_for_job(s, job)]
        state = job.state.value
        if state not in ("succeeded", "failed"):
            out.append(f"job is {state}, not terminal (done {job.done} failed {job.failed} skipped {job.skipped} "
                       f"of {job.total})")
        if job.done + job.failed + job.skipped != job.total:
            out.append(f"done {job.done} + failed {job.failed} + skipped {job.skipped} != total {job.total}")
        if job.total != len(frame_ids):
            out.append(f"total {job.total} != {len(frame_ids)} frames")
        rows = s.execute(select(Product.id, Product.frame_id, Product.state, Product.error, Product.path,
                                Product.sha256).where(Product.frame_id.in_(frame_ids))).all()
        by_frame: dict[int, list] = defaultdict(list)
        for r in rows:
            by_frame[r.frame_id].append(r)
        n_written = n_failed = 0
        unfinished: list[str] = []
        for fid in frame_ids:
            prods = by_frame.get(fid, [])
            if len(prods) != 1:
                out.append(f"frame {fid}: {len(prods)} product rows (expected 1)")
            for p in prods:
                if p.state == ProductState.written:
                    n_written += 1
                    if not p.path or not Path(p.path).exists():
                        out.append(f"frame {fid}: product {p.id} written but its file is missing")
                    elif p.sha256 and _sha256(Path(p.path)) != p.sha256:
                        out.append(f"frame {fid}: product {p.id} file does not match the row's SHA-256")
                elif p.state == ProductState.failed:
                    n_failed += 1
                    if not (p.error or "").strip():
                        out.append(f"frame {fid}: product {p.id} failed without a reason")
                else:
                    unfinished.append(f"{p.id}:{p.state.value}")
        if unfinished:
            out.append(f"{len(unfinished)} product(s) neither written nor failed: {', '.join(unfinished[:12])}"
                       + (" ..." if len(unfinished) > 12 else ""))
        if job.done != n_written:
            out.append(f"job done {job.done} != {n_written} written products")
        if job.failed != n_failed:
            out.append(f"job failed {job.failed} != {n_failed} failed products")
    out.extend(store_check(env or dict(os.environ)))
    return out


def explain_unfinished(job_id: str, events: list[dict], redis: RedisServer | None = None) -> list[str]:
    """Why the job's unfinished products are unfinished, from the journal and the broker:
    never delivered to a worker, started and never returned (killed), or returned but never
    counted; and what Redis still holds (queued, unacknowledged messages)."""
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import ItemOutcome, JobItem, Product, ProductState

    with session_scope() as s:
        rows = s.execute(select(Product.id, Product.state, JobItem.outcome)
                         .join(JobItem, JobItem.product_id == Product.id)
                         .where(JobItem.job_id == job_id)).all()
    started: Counter[int] = Counter()
    returned: Counter[int] = Counter()
    counted: Counter[int] = Counter()
    for e in events:
        task, args = e.get("task", ""), e.get("args") or []
        if task.endswith(".calibrate_product") and args:
            (started if e["ev"] == "prerun" else returned if e["ev"] == "postrun" else Counter())[int(args[0])] += 1
            if e["ev"] == "postrun" and len(args) > 1 and args[1] and "job_state" in (e.get("retval") or {}):
                counted[int(args[0])] += 1  # settled by the task itself
        elif task.endswith(".record_progress") and len(args) > 1 and e["ev"] == "postrun":
            counted[int(args[1])] += 1
    never, killed, uncounted = [], [], []
    for r in rows:
        if r.state in (ProductState.planned, ProductState.writing):
            (never if not started[r.id] else killed if started[r.id] > returned[r.id] else uncounted).append(
                f"{r.id}:{r.state.value}")
        elif r.outcome == ItemOutcome.pending:
            uncounted.append(f"{r.id}:{r.state.value}")
    out = []
    if never:
        out.append(f"{len(never)} unfinished product(s) never delivered to a worker (no task start in the journal): "
                   f"{', '.join(never[:10])}")
    if killed:
        out.append(f"{len(killed)} unfinished product(s) whose calibration started and never returned (killed): "
                   f"{', '.join(killed[:10])}")
    if uncounted:
        out.append(f"{len(uncounted)} product(s) not counted towards the job (no settling ran for them): "
                   f"{', '.join(uncounted[:10])}")
    if redis is not None and redis.running():
        try:
            c = redis.client()
            out.append(f"Redis now: {c.llen('cpu')} message(s) queued on 'cpu', {c.hlen('unacked')} delivered and "
                       f"unacknowledged, bindings of 'cpu' {sorted(x.decode() for x in c.smembers('_kombu.binding.cpu'))}")
        except Exception as exc:  # noqa: BLE001 - a diagnosis only
            out.append(f"Redis not readable: {exc}")
    return out


def grep(path: Path, *needles: str, limit: int = 20) -> list[str]:
    """Lines of ``path`` that contain any of ``needles`` (the first ``limit``)."""
    if not path.exists():
        return []
    hits = [ln for ln in path.read_text(errors="replace").splitlines() if any(n in ln for n in needles)]
    return hits[:limit]
