"""The temporary files of the stores' atomic writes, and the sweeps that remove those of killed
writers.

A write into a store (:func:`pipelines.fitsio.write_atomic` with ``tmp_dir=store_tmp_dir(root)``)
goes to a temporary file in the store's :data:`STORE_TMP_DIR`, named with the writer's host
and pid (:func:`writer_prefix`), and is renamed into place once complete. A writer killed
mid-write leaves its file there: :func:`sweep_dead_writers` removes those of dead writers on
this host at once (the reconciler, every pass), :func:`sweep_partial_files` those older than
:data:`PARTIAL_MAX_AGE_S` (``lstdp fsck --repair``, the workers' start).

Standard library only: the reconciler and :mod:`backend.state` import it without loading
astropy (``tests/test_architecture.py``). :mod:`pipelines.fitsio` re-exports every name.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from pathlib import Path

__all__ = [
    "STORE_TMP_DIR",
    "PARTIAL_MAX_AGE_S",
    "PARTIAL_PATTERNS",
    "store_tmp_dir",
    "writer_prefix",
    "partial_files",
    "process_alive",
    "sweep_dead_writers",
    "sweep_partial_files",
    "sha256_file",
]


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


#: Folder of a store, directly under its root, that holds the temporary files of the writes
#: in progress (:func:`pipelines.fitsio.write_atomic` with ``tmp_dir=store_tmp_dir(root)``). Inside the store,
#: so on its file system: the final rename is atomic (``rename(2)`` is atomic only within one
#: file system). Hidden (leading dot), so that walks of the store for products skip it.
STORE_TMP_DIR = ".tmp"

#: Age [s] after which a temporary file of an atomic write is taken as left by a killed
#: write and removed (:func:`sweep_partial_files`, ``lstdp fsck --repair``). One hour: a
#: choice, far above the time a write takes (seconds for a full-size product) and above the
#: default hard task time limit (``TASK_TIME_LIMIT_S``, 900 s; after it no worker still
#: writes), so a live write is never removed.
PARTIAL_MAX_AGE_S = 3600.0

#: Name patterns of the temporary files that earlier versions of the atomic writers left
#: *beside* the target when killed mid-write (:func:`pipelines.fitsio.write_fits_atomic` and
#: ``pipelines.products.write_quicklook_png`` without ``tmp_dir``).
PARTIAL_PATTERNS = (".*.part", ".*.part.png")


def store_tmp_dir(root: str | os.PathLike) -> Path:
    """The temporary folder of the store at ``root``: ``<root>/``:data:`STORE_TMP_DIR`."""
    return Path(root) / STORE_TMP_DIR


def partial_files(root: str | os.PathLike) -> list[Path]:
    """The temporary files of atomic writes under the store ``root``, in progress or left by
    killed writes: every file in its :func:`store_tmp_dir`, and the writers' older hidden names
    beside the products (:data:`PARTIAL_PATTERNS`). Sorted; a missing ``root`` has none."""
    base = Path(root)
    if not base.is_dir():
        return []
    tmp = store_tmp_dir(base)
    found = {f for f in tmp.rglob("*") if f.is_file()} if tmp.is_dir() else set()
    for pattern in PARTIAL_PATTERNS:
        found.update(f for f in base.rglob(pattern) if f.is_file())
    return sorted(found)


_WRITER = re.compile(r"\.~(?P<host>[^~/]+)~(?P<pid>\d+)~\.")


def writer_prefix(name: str) -> str:
    """The start of the temporary file's name of a write of ``name`` by this process into a
    store's :func:`store_tmp_dir` (``pipelines.fitsio.write_atomic``): the name, this host
    and this pid, so that a killed writer's file is known at once (:func:`sweep_dead_writers`)."""
    return f"{name}.~{socket.gethostname()}~{os.getpid()}~."


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (``kill(pid, 0)``; another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_dead_writers(root: str | os.PathLike) -> list[Path]:
    """Remove the temporary files in the store ``root``'s :func:`store_tmp_dir` whose writer
    (host and pid in the name, :func:`writer_prefix`) ran on this host and is gone: a worker
    killed mid-write. Files of live writers, of other hosts, or without a writer in the name
    are left to :func:`sweep_partial_files`'s age rule. Cheap (one folder listing): the
    reconciler calls it every pass.

    Returns
    -------
    list of pathlib.Path
        The files removed, sorted.
    """
    tmp = store_tmp_dir(root)
    try:
        names = os.listdir(tmp)
    except OSError:
        return []
    host, me, removed = socket.gethostname(), os.getpid(), []
    for name in names:
        m = _WRITER.search(name)
        if not m or m["host"] != host or int(m["pid"]) == me or process_alive(int(m["pid"])):
            continue
        try:
            (tmp / name).unlink()
            removed.append(tmp / name)
        except OSError:  # gone meanwhile
            continue
    return sorted(removed)


def sweep_partial_files(root: str | os.PathLike, *, older_than_s: float = PARTIAL_MAX_AGE_S,
                        now: float | None = None) -> list[Path]:
    """Remove the temporary files of atomic writes killed mid-way under the store ``root``.

    The files of :func:`partial_files` (the store's temporary folder :data:`STORE_TMP_DIR`,
    and the hidden ``.part`` names that earlier versions left beside the products) last
    modified more than ``older_than_s`` seconds ago (default :data:`PARTIAL_MAX_AGE_S`, one
    hour) are removed: a write in progress (a full-size product takes seconds) is left alone.
    A missing ``root`` is nothing to sweep.

    Returns
    -------
    list of pathlib.Path
        The files removed, sorted.
    """
    cutoff = (time.time() if now is None else now) - older_than_s
    removed = []
    for f in partial_files(root):
        try:
            if f.stat().st_mtime < cutoff:
                f.unlink()
                removed.append(f)
        except FileNotFoundError:  # renamed by its writer or removed by another sweeper meanwhile
            continue
    return removed
