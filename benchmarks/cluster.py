"""Benchmark: an N-frame job across a multi-host rig under network faults and host kills (issue 28, item 6).

The rig (:mod:`tests.cluster.rig`; needs root, ``scripts/ensure-rig.sh`` installs its tools):
network namespaces on a bridge in ``10.213.0.0/24`` (blackholed in the root namespace for the
run), one each for a private PostgreSQL, Redis (no persistence), SeaweedFS (``--store s3``,
the default; ``--store fs`` keeps products on the shared local disk), two API replicas
(``lstdp serve``) and ``--hosts`` worker hosts (``lstdp worker``, each with its own hostname
and PID namespace; no ``--name``, so a worker is named after its host). This process runs
in a ``ctl`` namespace of the rig for the run. ``--frames`` simulated 64 px WST frames are
ingested with their masters (as ``benchmarks/faults.py`` does) and one recalibration job is
submitted over them.

Faults, on a schedule from when 5 % of the job is done (``--faults`` picks; offsets [s]):

* ``host_kill`` (0): worker host 1 killed whole (SIGKILL to its PID namespace's init);
* ``same_name_restart`` (5): host 1 started again with the same hostname;
* ``api_kill`` (6): API replica 1 killed while a client reads (reads go to both replicas in
  turn, a failed read is retried on the other), started again 4 s later;
* ``partition`` (10): worker host 2 cut from the network (nft drop on its ``eth0``) for
  ``--partition-s`` (default 60), then healed;
* ``store_partition`` (12, s3 only): the object store's namespace cut for ``--store-cut-s``;
* ``db_cut`` (15): worker host 3 cut from PostgreSQL only for ``--db-cut-s``;
* ``broker_loss`` (20): 30 % of the broker's packets dropped at random (nft ``numgen``) for
  ``--loss-s``;
* ``freeze`` (25): every process of worker host 1 stopped (SIGSTOP) for ``--freeze-s``
  (default the broker's visibility timeout + 10 s), then thawed.

A fault whose time comes after the job ended is not injected (and not named in ``faults``).
``--frame-delay S`` makes each calibration sleep ``S`` s first (``LSTDP_FAULTS_FRAME_DELAY_S``)
so the job outlasts its faults.

Counted (per frame of the job): ``products`` exactly one product row, ``written``, its
object present in the store; ``lost`` neither a written product nor a failed row with a
reason; ``duplicated`` more than one product row; ``orphans`` ``lstdp fsck`` findings of an
object or file without its row (``orphan_file``, ``orphan_object``, ``attempt_object``,
``partial_file``, ``unwritten_file``, ``incomplete_upload``); ``double_runs`` products whose
calibration started more than once (the workers' journal); ``settle_s`` from the end of the
last fault (its heal) to the job's end; ``api_max_s`` the slowest client read of the API
during the run, a retry on the other replica included. The last line::

    RESULT hosts=<n> store=<s3|fs> faults=<kinds> frames=<n> products=<p> lost=<l> duplicated=<d>
    orphans=<o> double_runs=<r> settle_s=<t> api_max_s=<m>

``orphans`` is what the run left; when ``lstdp fsck`` is not clean the run then repairs
(``lstdp fsck --repair``) and says whether ``lstdp fsck`` is clean after it. The exit
status is 0 only when ``lstdp fsck`` was clean without a repair.

Usage (as root)::

    .venv/bin/python benchmarks/cluster.py                 # 300 frames, every fault
    .venv/bin/python benchmarks/cluster.py --frames 30 --partition-s 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster import services as S  # noqa: E402
from tests.cluster.rig import Rig  # noqa: E402
from tests.faults import harness as H  # noqa: E402

#: Worker settings, as benchmarks/faults.py (lease = TASK_TIME_LIMIT_S + 60 s)
SETTINGS = {"TASK_SOFT_TIME_LIMIT_S": 8, "TASK_TIME_LIMIT_S": 10, "BROKER_VISIBILITY_TIMEOUT_S": 15,
            "RECONCILE_INTERVAL_S": 1, "MAX_DELIVERIES": 3}
FAULTS = ("host_kill", "same_name_restart", "api_kill", "partition", "store_partition", "db_cut", "broker_loss",
          "freeze")
ORPHAN_KINDS = {"orphan_file", "orphan_object", "attempt_object", "partial_file", "unwritten_file",
                "incomplete_upload"}


def _say(msg: str) -> None:
    print(msg, flush=True)


class Reader(threading.Thread):
    """A client reading ``path`` from the API replicas in turn; a failed read is retried on
    the next replica within the same timed read. ``max_s``: the slowest read; ``failed``:
    reads no replica answered."""

    def __init__(self, bases: list[str], path: str, timeout_s: float = 10.0):
        super().__init__(daemon=True, name="api-reader")
        self.bases, self.path, self.timeout_s = bases, path, timeout_s
        self.stop = threading.Event()
        self.max_s = 0.0
        self.reads = self.failed = self.retried = 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            t0 = time.monotonic()
            ok = False
            for k in range(len(self.bases)):
                base = self.bases[(i + k) % len(self.bases)]
                try:
                    with urllib.request.urlopen(base + self.path, timeout=self.timeout_s) as r:
                        r.read()
                    ok = True
                    self.retried += k > 0
                    break
                except Exception:  # noqa: BLE001 - a replica down: the next one
                    continue
            dt_s = time.monotonic() - t0
            self.reads += 1
            if ok:
                self.max_s = max(self.max_s, dt_s)
            else:
                self.failed += 1
            i += 1
            time.sleep(0.1)


def measure(job_id: str, journal: Path) -> dict:
    from sqlalchemy import select

    from backend.db import session_scope
    from backend.models import Job, Product, ProductState
    from backend.store import product_store
    from backend.worker.processing import frames_for_job

    store = product_store()
    with session_scope() as s:
        frames = [f.id for f in frames_for_job(s, s.get(Job, job_id))]
        rows = s.execute(select(Product.id, Product.frame_id, Product.state, Product.error, Product.path)).all()
    by_frame = defaultdict(list)
    for r in rows:
        by_frame[r.frame_id].append(r)
    products = lost = duplicated = 0
    details = []
    for fid in frames:
        prods = by_frame.get(fid, [])
        written = [p for p in prods if p.state == ProductState.written and p.path
                   and store.head(store.key_of(p.path)) is not None]
        failed = [p for p in prods if p.state == ProductState.failed and (p.error or "").strip()]
        products += int(len(prods) == 1 and bool(written))
        if not written and not failed:
            lost += 1
            details.append(f"lost: frame {fid}: {[(p.id, p.state.value) for p in prods] or 'no product row'}")
        if len(prods) > 1:
            duplicated += 1
            details.append(f"duplicated: frame {fid}: {len(prods)} product rows")
        for p in failed:
            details.append(f"failed: frame {fid}: {p.error[:200]}")
    rep = H.delivery_report(H.read_journal(journal))
    double_runs = sum(1 for n in rep.starts.values() if n > 1)
    return {"frames": len(frames), "products": products, "lost": lost, "duplicated": duplicated,
            "double_runs": double_runs, "details": details}


def fsck(env: dict[str, str], *, repair: bool = False) -> tuple[int, int, list[str]]:
    """``lstdp fsck --json`` (``--repair`` too with ``repair``; run from this namespace);
    (exit code, orphans, problem lines)."""
    import json

    r = subprocess.run([sys.executable, "-m", "backend.cli", "fsck", "--json", *(["--repair"] if repair else [])],
                       env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    try:
        rep = json.loads(r.stdout)
    except ValueError:
        return r.returncode, -1, [f"fsck printed no JSON: {(r.stderr or r.stdout)[-1000:]}"]
    probs = [f for f in rep["findings"] if f["problem"]]
    orphans = sum(1 for f in probs if f["kind"] in ORPHAN_KINDS)
    return r.returncode, orphans, [f"{f['kind']}: {f.get('detail', '')} {f.get('path') or ''}" for f in probs]


def run(args) -> dict:
    from sqlalchemy import create_engine, text

    from backend.migrate import upgrade

    work = Path(tempfile.mkdtemp(prefix="lstdp-cluster-"))
    os.chmod(work, 0o755)  # the postgres user traverses it
    workers_ns = [f"w{i + 1}" for i in range(args.hosts)]
    rig = Rig(work / "rig", hosts=("ctl", "pg", "redis", "s3", "api1", "api2", *workers_ns))
    out: dict = {"faults": []}
    reader = None
    try:
        with rig:
            rig.enter("ctl")
            t0 = time.perf_counter()
            _pg, base_url = S.start_postgres(rig)
            eng = create_engine(base_url + "/postgres", isolation_level="AUTOCOMMIT")
            with eng.connect() as c:
                c.execute(text("CREATE DATABASE lstdp"))
            eng.dispose()
            url = base_url + "/lstdp"
            upgrade(url)
            S.start_redis(rig)
            store_env = {}
            if args.store == "s3":
                _s3, store_env = S.start_seaweedfs(rig)
            broker = f"redis://{rig.addr('redis')}:{S.REDIS_PORT}"
            from backend.settings import ENV_NAMES

            env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES and not k.startswith("LSTDP_FAULTS_")}
            env.update(DATABASE_URL=url, CELERY_BROKER_URL=broker + "/0", CELERY_RESULT_BACKEND=broker + "/1",
                       DATA_DIR=str(work / "var"), RAW_DIR=str(work / "raw"),
                       CALIBRATION_DIR=str(work / "calibration"), LSTDP_FAULTS_JOURNAL=str(work / "journal.jsonl"),
                       PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                       PYTHONUNBUFFERED="1", **store_env, **{k: str(v) for k, v in SETTINGS.items()})
            if args.frame_delay:
                env["LSTDP_FAULTS_FRAME_DELAY_S"] = str(args.frame_delay)
                env["TASK_SOFT_TIME_LIMIT_S"] = str(SETTINGS["TASK_SOFT_TIME_LIMIT_S"] + args.frame_delay)
                env["TASK_TIME_LIMIT_S"] = str(SETTINGS["TASK_TIME_LIMIT_S"] + args.frame_delay)
            H.use_settings(env)
            _say(f"rig up in {time.perf_counter() - t0:.1f} s: postgres, redis"
                 f"{', seaweedfs' if args.store == 's3' else ''}; logs in {rig.work}")
            templates = H.simulate_templates(work / "templates", 4)
            counts = H.prepare_frames(templates, work, args.frames)
            _say(f"{args.frames} frames made and ingested: {counts}")
            apis = {h: S.start_api(rig, h, env) for h in ("api1", "api2")}
            hosts = {h: S.start_worker(rig, h, f"host{i + 1}", env, concurrency=args.concurrency)
                     for i, h in enumerate(workers_ns)}
            for p in hosts.values():
                S.wait_ready(p)
            _say(f"{len(apis)} API replicas and {len(hosts)} worker hosts ready")
            job = H.submit(args.frames)
            bases = [f"http://{rig.addr(h)}:{S.API_PORT}" for h in apis]
            path = f"/api/v1/jobs/{job}"
            try:
                urllib.request.urlopen(bases[0] + path, timeout=10).read()
            except Exception as e:  # noqa: BLE001 - a read every replica serves instead
                _say(f"GET {path}: {e}; the client reads /api/v1/health instead")
                path = "/api/v1/health"
            reader = Reader(bases, path)
            reader.start()
            t_job = time.monotonic()
            H.wait_progress(job, 0.05, timeout_s=300)
            wanted = set(args.faults.split(","))
            schedule = [(0, "host_kill"), (5, "same_name_restart"), (6, "api_kill"), (10, "api_restart"),
                        (10, "partition"), (12, "store_partition"), (15, "db_cut"),
                        (20, "broker_loss"), (25, "freeze")]
            heals: list[tuple[float, str]] = []
            start = time.monotonic()
            last_fault = start
            events = sorted([(start + off, kind) for off, kind in schedule if kind in wanted or
                             (kind == "api_restart" and "api_kill" in wanted)])
            w1, w2, w3 = (workers_ns + [None, None, None])[:3]
            while events or heals:
                now = time.monotonic()
                due = sorted(events + heals)[0]
                if due[0] > now:
                    time.sleep(min(0.5, due[0] - now))
                    continue
                if due in heals:
                    heals.remove(due)
                else:
                    events.remove(due)
                kind = due[1]
                if kind.startswith("thaw:"):
                    rig.thaw(kind.split(":", 1)[1])
                    last_fault = time.monotonic()
                    _say(f"{time.monotonic() - start:6.1f} s: thawed {kind[5:]}")
                    continue
                if kind.startswith("heal:"):
                    rig.heal(kind.split(":", 1)[1])
                    last_fault = time.monotonic()
                    _say(f"{time.monotonic() - start:6.1f} s: healed {kind[5:]}")
                    continue
                view = H.job_view(job)
                if view.terminal and kind not in ("same_name_restart", "api_restart"):
                    _say(f"{time.monotonic() - start:6.1f} s: job ended ({view.state}); {kind} not injected")
                    continue
                msg = kind
                if kind == "host_kill" and w1:
                    init = rig.kill_host(hosts[w1])
                    msg = f"host_kill: host1 (pid namespace init {init}) at {view.finished}/{view.total}"
                elif kind == "same_name_restart" and w1:
                    if "host_kill" not in wanted:
                        rig.kill_host(hosts[w1])
                    hosts[w1] = S.start_worker(rig, w1, "host1", env, concurrency=args.concurrency)
                    msg = "same_name_restart: host1 started again"
                elif kind == "api_kill":
                    apis["api1"].kill()
                    msg = "api_kill: api1 killed (SIGKILL) while the client reads"
                elif kind == "api_restart":
                    apis["api1"] = S.start_api(rig, "api1", env)
                    msg = "api1 started again"
                elif kind == "partition" and w2:
                    rig.partition(w2)
                    heals.append((time.monotonic() + args.partition_s, f"heal:{w2}"))
                    msg = f"partition: host2 cut from the network for {args.partition_s:.0f} s"
                elif kind == "store_partition" and args.store == "s3":
                    rig.partition("s3")
                    heals.append((time.monotonic() + args.store_cut_s, "heal:s3"))
                    msg = f"store_partition: the object store cut for {args.store_cut_s:.0f} s"
                elif kind == "db_cut" and w3:
                    rig.cut_to(w3, "pg", S.PG_PORT)
                    heals.append((time.monotonic() + args.db_cut_s, f"heal:{w3}"))
                    msg = f"db_cut: host3 cut from PostgreSQL only for {args.db_cut_s:.0f} s"
                elif kind == "broker_loss":
                    rig.lose("redis", S.REDIS_PORT, 30)
                    heals.append((time.monotonic() + args.loss_s, "heal:redis"))
                    msg = f"broker_loss: 30 % of the broker's packets dropped for {args.loss_s:.0f} s"
                elif kind == "freeze" and w1:
                    frozen = rig.freeze(w1)
                    heals.append((time.monotonic() + args.freeze_s, f"thaw:{w1}"))
                    msg = f"freeze: host1's {len(frozen)} processes stopped for {args.freeze_s:.0f} s"
                else:
                    continue
                if kind in FAULTS:
                    out["faults"].append(kind)
                last_fault = time.monotonic()
                _say(f"{time.monotonic() - start:6.1f} s: {msg}")
            bound = args.timeout or H.settle_bound(env, 120.0)
            view, _ = H.settle(job, max(1.0, bound - (time.monotonic() - last_fault)))
            settle_s = time.monotonic() - last_fault if view is not None and view.terminal else float("inf")
            _say(f"job {view} {time.monotonic() - t_job:.1f} s after submission; settle {settle_s:.1f} s "
                 f"after the last fault (bound {bound:.0f} s)")
            if view is not None and view.terminal:
                time.sleep(3.0)
            reader.stop.set()
            reader.join(15)
            _say(f"API reads: {reader.reads}, retried on the other replica {reader.retried}, "
                 f"unanswered {reader.failed}, slowest {reader.max_s:.2f} s ({path})")
            out.update(measure(job, work / "journal.jsonl"), settle_s=settle_s, api_max_s=reader.max_s)
            for line in out["details"][:30]:
                _say(line)
            for h, p in hosts.items():
                lines = [ln for ln in H.grep(p.log, "reaped", "reconcil", "lease", "lost", limit=1000)
                         if not ln.startswith((" ", "Traceback"))]
                for line in list(dict.fromkeys(lines))[:4]:
                    _say(f"{h}: {line[:300]}")
            for p in hosts.values():  # stop the workers before fsck: nothing writes while it looks
                p.stop()
            rc, orphans, problems = fsck(env)
            out.update(orphans=orphans, fsck_rc=rc)
            _say(f"lstdp fsck exit {rc}" + ("" if rc == 0 else f": {len(problems)} problems"))
            for line in problems[:20]:
                _say(f"fsck: {line[:300]}")
            if rc != 0:  # what the operator's repair leaves (RESULT counts what the run left)
                fsck(env, repair=True)
                rc2, _, left = fsck(env)
                _say(f"after lstdp fsck --repair: fsck exit {rc2}" + "".join(f"; {ln[:200]}" for ln in left[:5]))
            if args.keep:  # the rig's logs outlive it; its namespaces and servers do not
                _say(f"kept {work}")
    finally:
        if reader is not None:
            reader.stop.set()
        left = rig.down()
        S.remove_weed_sockets(rig)
        if left:
            _say(f"TEARDOWN INCOMPLETE: {left}")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return out


def parser() -> argparse.ArgumentParser:
    """The command line (also for tests/cluster)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--hosts", type=int, default=3, help="worker hosts (3 for every fault)")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--store", choices=("s3", "fs"), default="s3")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {','.join(FAULTS)}")
    ap.add_argument("--partition-s", type=float, default=60.0)
    ap.add_argument("--store-cut-s", type=float, default=20.0)
    ap.add_argument("--db-cut-s", type=float, default=30.0)
    ap.add_argument("--loss-s", type=float, default=30.0)
    ap.add_argument("--freeze-s", type=float, default=SETTINGS["BROKER_VISIBILITY_TIMEOUT_S"] + 10.0)
    ap.add_argument("--frame-delay", type=float, default=2.0, help="each calibration sleeps this long first [s]")
    ap.add_argument("--timeout", type=float, default=None, help="settle bound after the last fault [s]")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, journal, stores)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if bad := set(args.faults.split(",")) - set(FAULTS):
        ap.error(f"unknown faults {sorted(bad)}")
    import signal

    def _term(signum, frame):  # a SIGTERM tears the rig down as Ctrl-C does
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    out = run(args)
    _say(f"RESULT hosts={args.hosts} store={args.store} faults={','.join(out['faults']) or 'none'} "
         f"frames={out.get('frames', 0)} products={out.get('products', 0)} lost={out.get('lost', 0)} "
         f"duplicated={out.get('duplicated', 0)} orphans={out.get('orphans', -1)} "
         f"double_runs={out.get('double_runs', 0)} settle_s={out.get('settle_s', float('inf')):.1f} "
         f"api_max_s={out.get('api_max_s', 0.0):.2f}")
    return 0 if out.get("fsck_rc") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
