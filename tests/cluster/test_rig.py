"""The rig's network: hosts reach each other through the bridge, faults cut what they say and
heal, the root namespace cannot reach the range (blackhole), and teardown leaves nothing."""

import subprocess
import sys
import time

import pytest

from tests.cluster.rig import NET, PREFIX, Rig

pytestmark = pytest.mark.cluster


def _netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(PREFIX)]


def _route() -> str:
    return subprocess.run(["ip", "route", "show", NET], capture_output=True, text=True).stdout.strip()


def test_rig_network_faults_and_teardown(tmp_path):
    rig = Rig(tmp_path / "rig", hosts=("ctl", "pg", "w1", "w2"))
    with rig:
        assert _route().startswith("blackhole")
        rig.start("pg", [sys.executable, "-m", "http.server", "--bind", rig.addr("pg"), "5432"])
        h = rig.start("w1", ["sleep", "600"], hostname="host1")
        for _ in range(50):
            if rig.reaches("w1", "pg", 5432):
                break
            time.sleep(0.1)
        assert rig.reaches("w1", "pg", 5432) and rig.reaches("w2", "pg", 5432)
        # the root namespace has no way into the range
        probe = ("import socket,sys; s=socket.socket(); s.settimeout(1); "
                 f"sys.exit(0 if s.connect_ex(('{rig.addr('pg')}',5432))==0 else 1)")
        assert subprocess.run([sys.executable, "-c", probe]).returncode == 1
        # own hostname and pid namespace
        init = h.init_pid()
        assert init is not None
        assert open(f"/proc/{init}/status").read().count("NSpid") == 1
        assert "\t1\n" in [ln for ln in open(f"/proc/{init}/status") if ln.startswith("NSpid")][0]
        rig.cut_to("w1", "pg", 5432)
        assert not rig.reaches("w1", "pg", 5432) and rig.reaches("w2", "pg", 5432)
        rig.heal("w1")
        assert rig.reaches("w1", "pg", 5432)
        rig.partition("w2")
        assert not rig.reaches("w2", "pg", 5432) and rig.reaches("w1", "pg", 5432)
        rig.heal("w2")
        assert rig.reaches("w2", "pg", 5432)
        def state(pid):
            return [ln for ln in open(f"/proc/{pid}/status") if ln.startswith("State")][0].split()[1]

        assert init in rig.freeze("w1") and state(init) == "T"
        rig.thaw("w1")
        assert state(init) != "T"
        rig.kill_host(h)
        assert not h.alive()
        pids = [p.pid for p in rig.procs]
    assert _netns() == [] and _route() == ""
    for pid in pids:
        assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0


def test_rig_torn_down_on_failure(tmp_path):
    """An error inside the rig still removes its namespaces, processes and route."""
    rig = Rig(tmp_path / "rig", hosts=("ctl", "w1"))
    with pytest.raises(RuntimeError, match="boom"):
        with rig:
            p = rig.start("w1", ["sleep", "600"], hostname="host1")
            rig.partition("w1")
            raise RuntimeError("boom")
    assert _netns() == [] and _route() == ""
    assert p.popen.poll() is not None
