"""Where the test suite's CPU goes: a summary of a py-spy recording of the whole suite.

The suite is CPU-bound on the 2-core CI machine (``make test``: four xdist workers, their
servers in threads, Celery workers, reconcilers, demo runs, benchmark smoke runs and Chromium).
Per-test wall times do not say where the CPU goes (a test that waits on a server shows its
wall, a reconciler it starts shows nowhere), so this reads a sampled profile of every Python
process of the run instead.

Record (py-spy is not a dependency: ``pip install --target /tmp/pyspy py-spy``)::

    OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 /tmp/pyspy/bin/py-spy record --subprocesses \\
        --nonblocking -r 20 -f raw -o /tmp/suite.spy -- .venv/bin/python -m pytest -p no:cacheprovider \\
        -n 4 --dist loadfile -q

then summarise::

    .venv/bin/python scripts/suite_profile.py /tmp/suite.spy [--top 40]

It prints the active samples per kind of process (xdist worker, Celery worker, reconciler,
demo, benchmark, server, other), the share spent importing modules per kind, the outermost
modules being imported (what a process's imports cost, by the import that started them), and the project's functions with the most samples (inclusive) inside the
xdist workers. Samples whose innermost frame is a wait (a lock, ``select``, ``sleep``, a
socket read) are left out: py-spy's idle detection does not see every wait. A sample is a
thread seen running *or runnable*, so on a loaded machine the shares are of the time threads
wanted the CPU, not of CPU-seconds; they rank, they do not time.

The raw format is py-spy's ``-f raw`` (collapsed stacks: frames joined by ``;``, then a space
and the count). With ``--subprocesses`` each stack starts with ``process PID:"command line"``
frames, outermost first; a command line may itself hold ``;`` (the xdist workers' ``-c``).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

#: An innermost frame calling one of these functions is a thread waiting, not working (the
#: function's name without its class, as py-spy writes it: ``Condition.wait`` is ``wait``).
WAITS = frozenset({"wait", "select", "poll", "sleep", "_wait_for_tstate_lock", "accept", "recv", "recv_into",
                   "_recv", "acquire", "epoll", "wait_for"})
#: ... and these qualified names (``get`` alone is too common a name).
WAITS_QUALIFIED = frozenset({"Queue.get", "SimpleQueue.get"})


def is_wait(frame: str) -> bool:
    """True when ``frame`` (``name (file:line)``) is a call that waits."""
    name = frame.rsplit(" (", 1)[0]
    return name in WAITS_QUALIFIED or name.rpartition(".")[2] in WAITS
#: The project's own code (the function lines counted in the last table).
PROJECT = re.compile(r"\((backend|pipelines|tests|validation|benchmarks|scripts|clients)/")
_LINE = re.compile(r":\d+\)$")


def kind_of(command: str) -> str:
    """The kind of process from its command line."""
    if "exec(eval(sys.stdin" in command:
        return "xdist worker"
    if "cli reconcile" in command:
        return "reconciler"
    if " worker" in command:
        return "celery worker"
    if "benchmarks/" in command:
        return "benchmark"
    if " demo" in command:
        return "demo"
    if " serve" in command or "uvicorn" in command:
        return "server"
    return "other"


def split_stack(stack: str) -> tuple[str, list[str]]:
    """(the innermost process's command line, its frames outermost first, line numbers dropped)."""
    parts = stack.split(";process ")
    last = parts[-1] if len(parts) > 1 or stack.startswith("process ") else ""
    if not last:
        return "", [_LINE.sub(")", f) for f in stack.split(";")]
    # the process frame runs to the closing quote of its command line, which may hold ';'
    m = re.match(r'(?:process )?\d+:"(.*?)";(.*)$', last, re.S)
    if not m:
        return last, []
    return m.group(1), [_LINE.sub(")", f) for f in m.group(2).split(";")]


def summarise(path: str, top: int) -> str:
    per_kind: collections.Counter = collections.Counter()
    importing: collections.Counter = collections.Counter()
    import_roots: collections.Counter = collections.Counter()
    project: collections.Counter = collections.Counter()
    waits = total = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            try:
                count = int(n)
            except ValueError:
                continue
            command, frames = split_stack(stack)
            if not frames or is_wait(frames[-1]):
                waits += count
                continue
            total += count
            kind = kind_of(command)
            per_kind[kind] += count
            first = next((i for i, fr in enumerate(frames) if fr.startswith("_find_and_load ")), None)
            if first is not None:
                importing[kind] += count
                # the outermost module being imported: the first module body below the first import
                root = next((fr for fr in frames[first:] if fr.startswith("<module> (")), "(importlib or an extension)")
                import_roots[(kind, root)] += count
            if kind == "xdist worker":
                for fr in set(frames):
                    if PROJECT.search(fr):
                        project[fr] += count
    out = [f"active samples {total} (left out as waits: {waits})", "",
           "| process kind | samples | share | of it importing |", "|---|---|---|---|"]
    for kind, v in per_kind.most_common():
        out.append(f"| {kind} | {v} | {100 * v / total:.1f} % | {100 * importing[kind] / v:.1f} % |")
    imp = sum(importing.values())
    out += ["", f"importing modules, all processes: {imp} samples, {100 * imp / max(total, 1):.1f} %", "",
            "| samples | process kind | outermost module being imported |", "|---|---|---|"]
    out += [f"| {v} | {k} | {m} |" for (k, m), v in import_roots.most_common(top // 2)]
    xd = per_kind["xdist worker"] or 1
    out += ["", "| samples | share of the xdist workers | project function (inclusive) |", "|---|---|---|"]
    out += [f"| {v} | {100 * v / xd:.1f} % | {fr[:140]} |" for fr, v in project.most_common(top)]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", help="a py-spy raw recording (record -f raw --subprocesses)")
    ap.add_argument("--top", type=int, default=40, help="rows of the project-function table [40]")
    args = ap.parse_args(argv)
    print(summarise(args.raw, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
