"""``lstdp demo`` stops its Celery worker and the worker's reconciler when it is stopped with
SIGTERM or SIGINT (issue 24), also while it serves (uvicorn re-raises the signal after its
graceful shutdown).

The demo runs for real in a subprocess (embedded mode: SQLite, the filesystem broker, a real
``lstdp worker`` with its reconciler, uvicorn on a free port); only its data steps (simulate,
ingest, import, detect) are replaced by no-ops, so it reaches "serving" in seconds. The test
records every process below the demo (server, worker, its pool, the reconciler) by PID, signals the
demo, and checks that none of them is left. Waits are generous bounds, never asserted speeds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = pytest.mark.slow

_CHILD = textwrap.dedent("""
    import sys
    import time
    import backend.cli as cli
    cli._demo_simulation_current = lambda d: True
    cli._expand = lambda paths: []
    cli.ingest_files = lambda files, **kw: {}
    cli.cmd_import_events = cli.cmd_import_xray = cli.cmd_detect = lambda args: 0
    if sys.argv[1] == "preparing":  # stopped while it prepares the data (a long step: here, forever)
        def _long_step(args):
            print("preparing", flush=True)
            while True:
                time.sleep(1)
        cli.cmd_import_events = _long_step
    sys.exit(cli.main(["demo", "--concurrency", "1"]))
""")


def _children() -> dict[int, list[int]]:
    """Parent PID -> child PIDs of every live process (from /proc)."""
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                out.setdefault(int(fields[1]), []).append(int(d.name))
    return out


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for c in tree.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
@pytest.mark.parametrize(("signum", "phase", "via"), [
    (signal.SIGTERM, "preparing", "direct"), (signal.SIGTERM, "serving", "direct"),
    (signal.SIGINT, "preparing", "direct"), (signal.SIGINT, "serving", "direct"),
    # `make demo`, make's own PID signalled (a supervisor or `kill`): make ends alone, its child
    # lstdp demo must notice and stop what it started
    (signal.SIGTERM, "serving", "make"),
], ids=["SIGTERM-preparing", "SIGTERM-serving", "SIGINT-preparing", "SIGINT-serving", "SIGTERM-make-serving"])
def test_demo_stops_its_worker_and_reconciler_on_a_signal(tmp_path, signum, phase, via):
    import shutil

    import httpx

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "LSTDP_", "DATA_DIR"))}
    port = _free_port()
    env.update(DATA_DIR=str(tmp_path / "var"), HOST="127.0.0.1", PORT=str(port))
    log = open(tmp_path / "demo.log", "wb")
    cmd = [sys.executable, "-c", _CHILD, phase]
    if via == "make":
        if shutil.which("make") is None:
            require(False, "GNU make (the README's `make demo`)")
        (tmp_path / "child.py").write_text(_CHILD)
        (tmp_path / "Makefile").write_text(f"demo:\n\t{sys.executable} {tmp_path / 'child.py'} {phase}\n")
        cmd = ["make", "-s", "-f", str(tmp_path / "Makefile"), "demo"]
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                             *filter(None, [env.get("PYTHONPATH")])])
    # SIGINT as a terminal gives it (default action): a suite started in the background by a shell
    # without job control inherits SIGINT ignored, and Python then leaves it ignored
    demo = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    recorded: set[int] = set()
    try:
        deadline = time.monotonic() + 240  # a bound for a loaded machine, not a speed
        serving = reconciler = False
        while time.monotonic() < deadline and not (serving and reconciler):
            assert demo.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
            time.sleep(0.5)
            recorded |= _descendants(demo.pid)
            reconciler = any(" reconcile " in _cmdline(p) + " " for p in recorded)
            if phase == "preparing":
                # the browser is served from the demo's first step (issue 25): while the data are
                # still being prepared the landing page answers and shows which step runs
                serving = False
                if b"preparing" in (tmp_path / "demo.log").read_bytes():
                    try:
                        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                        serving = page.status_code == 200 and "step 5 of 7" in page.text
                    except httpx.HTTPError:
                        pass
                continue
            try:
                serving = httpx.get(f"http://127.0.0.1:{port}/api/v1/session", timeout=5).status_code == 200
            except httpx.HTTPError:
                serving = False
        assert serving and reconciler, (tmp_path / "demo.log").read_text()[-3000:]
        recorded |= _descendants(demo.pid)
        names = {p: _cmdline(p) for p in recorded}
        assert any(" worker " in n for n in names.values()), names
        demo.send_signal(signum)
        demo.wait(timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(_alive(p) for p in recorded):
            time.sleep(0.5)
        left = {p: names[p] for p in recorded if _alive(p)}
        assert left == {}, f"left running after {signum.name}: {left}"
    finally:
        for p in [demo.pid, *recorded]:  # only the processes this test started
            if _alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        demo.wait(timeout=30)
        log.close()
