"""A multi-host rig on one machine: network namespaces joined by veth pairs and a bridge (issue 28, item 5).

:class:`Rig` makes one network namespace per "host" (``lstrig-<name>``), each with a veth
``eth0`` whose peer hangs on the bridge ``br0`` of a namespace of its own (``lstrig-br``),
addresses from :data:`NET`. Nothing is addressed in the root namespace: the only change
there is a blackhole route for :data:`NET`, added before anything else and removed last,
so no packet for the rig's range can leave the machine even if a namespace leaks.

Servers and hosts run inside their namespaces (``ip netns exec``); a worker host also gets
its own UTS and PID namespaces (``unshare --uts --pid --fork --kill-child``), so it has its
own hostname and pids, and killing its PID namespace's init kills the whole host.

Faults are nftables tables of the rig's own (``table inet lstrig``) inside a namespace:
:meth:`Rig.partition` drops everything on ``eth0`` (loopback stays), :meth:`Rig.cut_to`
drops traffic to and from one address and port only (a database-only cut); :meth:`Rig.heal`
deletes the table.

Teardown (:meth:`Rig.down`, run by ``__exit__`` also on failure and on Ctrl-C): every
process started here killed by its process group (SIGTERM, then SIGKILL), every namespace
deleted (which removes its veths, bridge and nft tables), then the blackhole route.

Needs root, ``ip`` (iproute2), ``nft`` (nftables), ``unshare`` (util-linux):
``scripts/ensure-rig.sh`` installs them from Debian.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NET", "PREFIX", "Rig", "RigError", "Proc", "missing_tools"]

#: The rig's private range (RFC 1918, a choice unlikely to be routed here); blackholed in the root namespace
NET = "10.213.0.0/24"
#: Prefix of every namespace the rig makes (and refuses to start if one exists already)
PREFIX = "lstrig"
#: Host part of each namespace's address in :data:`NET` (a choice)
ADDRESSES = {"ctl": 2, "pg": 3, "redis": 4, "s3": 5, "api1": 6, "api2": 7, "w1": 11, "w2": 12, "w3": 13}
#: Seconds between SIGTERM and SIGKILL when a process group is stopped (a choice)
STOP_GRACE_S = 5.0
CLONE_NEWNET = 0x40000000  # <sched.h>
TOOLS = ("ip", "nft", "unshare", "runuser")


class RigError(RuntimeError):
    """The rig cannot start here (not root, a tool missing, its range or names in use)."""


def missing_tools() -> list[str]:
    """The rig's tools not on ``PATH`` (install them with ``scripts/ensure-rig.sh``)."""
    return [t for t in TOOLS if shutil.which(t) is None]


def _run(*argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, input=input, timeout=60)
    if check and r.returncode:
        raise RigError(f"{' '.join(argv)} exited with {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r


def _state(pid: int) -> str | None:
    """The process's state letter (``/proc/PID/stat``), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@dataclass
class Proc:
    """A process group started in a namespace; ``pid`` is its leader (also its group id)."""

    name: str
    popen: subprocess.Popen
    log: Path
    pidns: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def init_pid(self) -> int | None:
        """The PID namespace's init (``unshare --fork``'s child), as seen from here."""
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.pid}/task").iterdir():
                kids = (task / "children").read_text().split()
                if kids:
                    return int(kids[0])
        return None

    def kill(self) -> None:
        """SIGKILL its group at once (a crash, no shutdown)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM its group, SIGKILL after ``grace_s``. A group whose leader is gone is not
        signalled (its id may name another group by now): :meth:`Rig.down` kills what is
        left by the namespace's pids."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)


@dataclass
class Rig:
    """The namespaces, their addresses, the processes started in them; a context manager."""

    work: Path
    hosts: tuple[str, ...] = tuple(ADDRESSES)
    procs: list[Proc] = field(default_factory=list)
    made: list[str] = field(default_factory=list)
    blackhole: bool = False
    _root_fd: int | None = None

    # ---------------------------------------------------------------- names
    @staticmethod
    def ns(host: str) -> str:
        return f"{PREFIX}-{host}"

    @staticmethod
    def addr(host: str) -> str:
        return f"10.213.0.{ADDRESSES[host]}"

    # ---------------------------------------------------------------- life cycle
    def __enter__(self) -> Rig:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        """Check, blackhole the range, make the bridge and one namespace per host.

        Raises
        ------
        RigError
            Not root, a tool missing, a route for :data:`NET` or a ``lstrig-`` namespace
            already present (another rig, or a leftover: remove it by hand after checking).
        """
        if os.geteuid() != 0:
            raise RigError("the rig needs root (network namespaces, nftables)")
        if missing := missing_tools():
            raise RigError(f"missing tools {missing}: run scripts/ensure-rig.sh")
        if _run("ip", "route", "show", NET).stdout.strip():
            raise RigError(f"a route for {NET} exists already: {_run('ip', 'route', 'show', NET).stdout.strip()}")
        existing = [n.split()[0] for n in _run("ip", "netns", "list").stdout.splitlines() if n.startswith(PREFIX)]
        if existing:
            raise RigError(f"rig namespaces exist already: {existing}")
        _run("ip", "route", "add", "blackhole", NET)  # first: nothing for the range leaves this machine
        self.blackhole = True
        br = self.ns("br")
        self._add_ns(br)
        _run("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", br, "link", "set", "br0", "up")
        for h in self.hosts:
            n = self.ns(h)
            self._add_ns(n)
            # both ends made inside rig namespaces: no interface ever appears in the root one
            _run("ip", "-n", br, "link", "add", f"v-{h}", "type", "veth", "peer", "name", "eth0", "netns", n)
            _run("ip", "-n", br, "link", "set", f"v-{h}", "master", "br0", "up")
            _run("ip", "-n", n, "addr", "add", f"{self.addr(h)}/24", "dev", "eth0")
            _run("ip", "-n", n, "link", "set", "eth0", "up")
        self.work.mkdir(parents=True, exist_ok=True)

    def _add_ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.made.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def down(self) -> list[str]:
        """Stop every process, delete every namespace, remove the blackhole route (last).

        Returns what could not be cleaned (empty when all went)."""
        left: list[str] = []
        self.leave()
        procs, self.procs = self.procs, []
        for n in self.made:  # a frozen host handles its SIGTERM once thawed
            for pid in _run("ip", "netns", "pids", n, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGCONT)
        for p in reversed(procs):
            try:
                p.stop()
            except Exception as e:  # noqa: BLE001 - go on with the rest
                left.append(f"process {p.name} {p.pid}: {e}")
        for n in reversed(self.made):
            r = _run("ip", "netns", "pids", n, check=False)
            for pid in r.stdout.split():  # anything still in a rig namespace was started by the rig
                if pid == str(os.getpid()):
                    continue
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            if _run("ip", "netns", "del", n, check=False).returncode:
                left.append(f"namespace {n}")
        self.made.clear()
        if self.blackhole and not left:
            if _run("ip", "route", "del", "blackhole", NET, check=False).returncode == 0:
                self.blackhole = False
            else:
                left.append(f"blackhole route {NET}")
        elif self.blackhole:
            left.append(f"blackhole route {NET} kept: namespaces remain")
        return left

    # ---------------------------------------------------------------- this process's namespace
    def enter(self, host: str = "ctl") -> None:
        """Move this thread (call it from the main thread before starting others: threads
        made later inherit it) into ``host``'s network namespace; :meth:`leave` goes back."""
        libc = ctypes.CDLL(None, use_errno=True)
        if self._root_fd is None:
            self._root_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        fd = os.open(f"/run/netns/{self.ns(host)}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise RigError(f"setns into {self.ns(host)}: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)

    def leave(self) -> None:
        if self._root_fd is None:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(self._root_fd, CLONE_NEWNET) != 0:
            raise RigError(f"setns back to the root namespace: {os.strerror(ctypes.get_errno())}")
        os.close(self._root_fd)
        self._root_fd = None

    # ---------------------------------------------------------------- processes
    def start(self, host: str, argv: list[str], *, env: dict[str, str] | None = None, name: str | None = None,
              hostname: str | None = None, cwd: Path | None = None) -> Proc:
        """Start ``argv`` in ``host``'s network namespace, in a new session (its group is
        what :meth:`Proc.stop` signals). With ``hostname``, also in new UTS and PID
        namespaces whose hostname is set first (a worker "host")."""
        name = name or host
        log = self.work / f"{name}.log"
        cmd = ["ip", "netns", "exec", self.ns(host)]
        if hostname:
            cmd += ["unshare", "--uts", "--pid", "--fork", "--kill-child", "--",
                    "sh", "-c", f'hostname "$0" && exec "$@"', hostname]
        with open(log, "ab") as out:
            out.write(f"\n===== {name} start {time.strftime('%H:%M:%S')} =====\n".encode())
            out.flush()
            popen = subprocess.Popen(cmd + argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        p = Proc(name, popen, log, pidns=bool(hostname))
        self.procs.append(p)
        return p

    def kill_host(self, p: Proc) -> int | None:
        """SIGKILL the init of ``p``'s PID namespace: the kernel kills every process in it."""
        init = p.init_pid()
        if init is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(10)
        return init

    # ---------------------------------------------------------------- faults
    def _nft(self, host: str, script: str) -> None:
        _run("ip", "netns", "exec", self.ns(host), "nft", "-f", "-", input=script)

    def partition(self, host: str) -> None:
        """Drop every packet in or out of ``host``'s ``eth0`` (its loopback still works)."""
        self._nft(host, "table inet lstrig {\n"
                  " chain in { type filter hook input priority 0; policy accept; iifname \"eth0\" drop; }\n"
                  " chain out { type filter hook output priority 0; policy accept; oifname \"eth0\" drop; }\n}\n")

    def cut_to(self, host: str, peer: str, port: int) -> None:
        """Drop ``host``'s traffic to and from ``peer``'s TCP ``port`` only (e.g. the database)."""
        a = self.addr(peer)
        self._nft(host, "table inet lstrig {\n"
                  f" chain in {{ type filter hook input priority 0; policy accept; ip saddr {a} tcp sport {port} drop; }}\n"
                  f" chain out {{ type filter hook output priority 0; policy accept; ip daddr {a} tcp dport {port} drop; }}\n"
                  "}\n")

    def lose(self, host: str, port: int, percent: int) -> None:
        """Drop ``percent`` % of ``host``'s TCP packets to and from its ``port``, at random
        (nft ``numgen random``: this kernel has no netem), e.g. 30 % loss to the broker."""
        if not 0 < percent < 100:
            raise ValueError(f"percent must be in (0, 100), not {percent}")
        self._nft(host, "table inet lstrig {\n"
                  f" chain in {{ type filter hook input priority 0; policy accept; tcp dport {port} "
                  f"numgen random mod 100 < {percent} drop; }}\n"
                  f" chain out {{ type filter hook output priority 0; policy accept; tcp sport {port} "
                  f"numgen random mod 100 < {percent} drop; }}\n}}\n")

    def pids(self, host: str) -> list[int]:
        """Every process in ``host``'s network namespace (all of a worker host's)."""
        return [int(p) for p in _run("ip", "netns", "pids", self.ns(host), check=False).stdout.split()]

    def freeze(self, host: str) -> list[int]:
        """SIGSTOP every process of ``host`` (a host frozen, e.g. a VM paused); :meth:`thaw` resumes."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5.0  # SIGSTOP lands asynchronously: until each is stopped
        for pid in pids:
            while time.monotonic() < deadline and _state(pid) not in ("T", None):
                time.sleep(0.01)
        return pids

    def thaw(self, host: str) -> None:
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def heal(self, host: str) -> None:
        _run("ip", "netns", "exec", self.ns(host), "nft", "delete", "table", "inet", "lstrig", check=False)

    def reaches(self, src: str, dst: str, port: int, timeout_s: float = 1.0) -> bool:
        """Whether a TCP connection from ``src``'s namespace to ``dst``:``port`` is accepted."""
        code = (f"import socket,sys; s=socket.socket(); s.settimeout({timeout_s}); "
                f"sys.exit(0 if s.connect_ex(('{self.addr(dst)}',{port}))==0 else 1)")
        return _run("ip", "netns", "exec", self.ns(src), "python3", "-c", code, check=False).returncode == 0
