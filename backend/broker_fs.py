"""kombu's filesystem transport (the embedded mode's broker) with whole message files.

kombu 5.x's ``filesystem`` transport (``kombu.transport.filesystem.Channel._put``) creates a
message file in the queue's folder, then locks it (an advisory ``flock``) and writes it. A
consumer (``Channel._get``) lists the folder, moves the file away and reads it, without looking
at the lock. A consumer that comes between the two reads an empty file: ``json.loads`` raises,
Celery's consumer calls it an "Unrecoverable error" and the worker exits, and the message is
lost (the producer writes on into the moved, then deleted, file). It is kombu's open issue
celery/kombu#1551. It happened here in a CI run (2026-12-07): the embedded worker of
``tests/client`` died so while a follow-up detection was sent, and the next job waited forever.

:class:`Channel` writes each message under a name that consumers skip (a leading dot and a
``.part`` suffix: kombu takes the queue from the text after the *first* dot, and
:func:`backend.broker.in_flight` reads only names ending ``.msg``) and renames it into place
(``os.replace``: one ``rename(2)`` within the folder, atomic on POSIX), so a consumer sees the
whole file or none; a ``.part`` file left by a sender that died is removed by a later channel. A
message file that is still not a JSON object (written by another program, a disk fault) is
logged and skipped: it no longer stops the worker. Names carry the sending time zero-padded
(:func:`message_name`), so the consumers' string order is the order of sending (to the
millisecond across processes); kombu's unpadded uptime milliseconds let new messages overtake
all older ones at each new digit of the uptime and after a reboot, and such names left by an
older version are padded when a channel opens.

:mod:`backend.broker` makes this the ``filesystem://`` transport of every process that imports
it (``kombu.transport.TRANSPORT_ALIASES``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

__all__ = ["Channel", "Transport", "message_name"]

log = logging.getLogger(__name__)

#: A ``.part`` file older than this [s] was left by a sender that died between its write and its
#: rename (SIGKILL, a time limit's exception); a new channel removes it.
STALE_PART_S = 3600.0

# the calls the tests intercept (here, not process-wide in ``os`` and ``time``)
_replace = os.replace
_unlink = os.unlink
_time_ns = time.time_ns

# the last message time [ms] this process gave (:func:`message_name`)
_last_ms = 0
_last_lock = threading.Lock()


def message_name(queue: str) -> str:
    """The file name of a new message of ``queue``: ``<ms>_<uuid4>.<queue>.msg``.

    Consumers take files in the sorted order of their names (kombu's ``_get`` sorts the
    listing as strings), so the time in front is what orders a queue. kombu writes
    ``round(time.monotonic() * 1000)`` without padding, which string order gets wrong twice:
    when the uptime gains a digit (1e6, 1e7, 1e8, 1e9 ms: about 17 min, 2.8 h, 28 h and 11.6
    days) every new message sorts before every older one (``'10000000_' < '9999999_'``), and
    after a reboot the clock starts again near 0; in both cases the older messages wait until
    the queue has drained of newer ones. Here the time is the wall clock's milliseconds since
    1970 (``time.time_ns()``), zero-padded to 15 digits (enough until the year 33658), and one
    process never gives two messages the same or a smaller number (the next is at least the last
    plus one), so the string order is the order of sending within a process, and across
    processes and reboots to the millisecond (messages of two processes within one millisecond
    are in their uuids' order, as in kombu); a step of the clock back (NTP) only reorders the
    messages sent within that step.
    """
    global _last_ms
    with _last_lock:
        _last_ms = max(_time_ns() // 1_000_000, _last_ms + 1)
        ms = _last_ms
    return f"{ms:015d}_{uuid.uuid4()}.{queue}.msg"


#: A message name of kombu's own form (unpadded uptime milliseconds), left by a process that ran
#: before this module named the messages: renamed to the padded form when a channel opens.
_KOMBU_NAME = re.compile(r"^(\d{1,14})_([^.]+\..+\.msg)$")


class Channel(filesystem.Channel):
    """kombu's filesystem channel whose message files appear whole (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tidy_folder()

    def _tidy_folder(self) -> None:
        """One pass over the queue folder when a channel opens:

        * ``.part`` files older than :data:`STALE_PART_S` are removed (their senders died; no
          consumer ever saw them);
        * messages named by kombu's own transport (``<uptime ms>_...``, a process of an older
          version) are renamed to the padded form, same time: unpadded, they would sort after
          every new message and wait until the queue drained. (A process of the older version
          that is still running goes on writing such names: stop them all when upgrading.)
        """
        folder = self.data_folder_out
        try:
            names = os.listdir(folder)
        except OSError:
            return
        now = time.time()
        for name in names:
            path = os.path.join(folder, name)
            if name.startswith(".") and name.endswith(".part"):
                with contextlib.suppress(OSError):
                    if now - os.stat(path).st_mtime > STALE_PART_S:
                        _unlink(path)
                        log.warning("embedded broker: removed %s, a message its sender never finished", name)
            elif m := _KOMBU_NAME.match(name):
                with contextlib.suppress(OSError):  # a consumer took it meanwhile
                    _replace(path, os.path.join(folder, f"{int(m.group(1)):015d}_{m.group(2)}"))

    def _put(self, queue: str, payload: dict, **kwargs) -> None:
        """Put ``payload`` on ``queue``: written to a hidden ``.part`` file, then renamed.

        The final name is ``<UTC ms, 15 digits>_<uuid>.<queue>.msg`` (:func:`message_name`).
        The rename makes the file appear whole; it is not fsynced (kombu's is not either: a
        power loss can lose a message, which the reconciler sends again,
        :mod:`backend.worker.reconcile`).

        Raises
        ------
        kombu.exceptions.ChannelError
            If the file cannot be written or renamed. On any error (an exception raised into the
            sender too) the partial file is removed.
        """
        name = message_name(queue)
        final = os.path.join(self.data_folder_out, name)
        part = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(part, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            _replace(part, final)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                _unlink(part)
            if isinstance(exc, OSError):
                raise ChannelError(f"Cannot add file {final!r} to directory") from exc
            raise

    def _get(self, queue: str) -> dict:
        """The next message of ``queue``; a message file that is not JSON is logged and skipped.

        Raises
        ------
        queue.Empty
            If the queue has no message (kombu's contract).
        """
        while True:
            try:
                payload = super()._get(queue)
            except ValueError as exc:  # json.JSONDecodeError; kombu has already taken the file away
                log.error("embedded broker: a message file of queue %r is not JSON and was dropped (%s)", queue, exc)
                continue
            if isinstance(payload, dict):
                return payload
            log.error("embedded broker: a message file of queue %r holds a JSON %s, not a message, and was "
                      "dropped", queue, type(payload).__name__)


def _worker_stopping() -> bool:
    """Whether the Celery worker of this process was asked to stop: its signal handlers set
    ``celery.worker.state.should_stop`` or ``should_terminate`` to an exit code (0 for a warm
    shutdown) or True, and this is the test of ``celery.worker.state.maybe_shutdown``. A process
    that never loaded that module runs no worker (and is not made to load it here)."""
    state = sys.modules.get("celery.worker.state")
    if state is None:
        return False
    return any(flag is not None and flag is not False for flag in (state.should_stop, state.should_terminate))


class Transport(filesystem.Transport):
    """kombu's filesystem transport with :class:`Channel`, whose wait for a message ends as soon
    as the worker is asked to stop.

    A worker on this transport runs Celery's blocking loop (``celery.worker.loops.synloop``: the
    transport has no file descriptor to poll), which asks for messages 2 s at a time, looks at
    the stop flags between two asks, then asks once more in a ``finally`` before it stops: a warm
    shutdown began 2-4 s after the signal (measured: 4.0 s). Here each poll of a channel (every
    ``polling_interval``: 0.2 s as :mod:`backend.broker` configures it, kombu's default 1 s)
    first looks at the flags and, when one is set, ends the wait (``socket.timeout``, which
    kombu's polling loop passes on and Celery's loop expects) with no message taken: a message
    still in the folder waits for the next worker. The flags are the process's own and are never
    cleared, so once set every wait on this transport in the process ends at once; only the
    worker's consumer waits on it (producers and the API only publish, results are not kept
    here)."""

    Channel = Channel

    def _drain_channel(self, channel, callback, timeout=None):
        if _worker_stopping():
            raise socket.timeout()
        return super()._drain_channel(channel, callback, timeout=timeout)
