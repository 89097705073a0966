"""The embedded broker's message files (backend/broker_fs.py; celery/kombu#1551).

kombu's own filesystem transport creates a message file, then locks and writes it; a consumer
that lists the folder in between takes an empty file and its worker stops ("Unrecoverable
error: JSONDecodeError"). Here the consumer is made to come at exactly that moment: inside the
producer's write step (kombu's ``lock`` call, or this transport's ``os.replace``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from queue import Empty

import pytest
from kombu import Connection
from kombu.transport import filesystem as kombu_fs

import backend.broker  # noqa: F401 - registers backend.broker_fs as the filesystem:// transport
from backend import broker_fs

#: The time part of a message name that sorts before any real one (time 0, 15 digits).
BAD = "0" * 15


def _channel(folder, transport=None):
    opts = {"data_folder_in": str(folder), "data_folder_out": str(folder), "store_processed": False}
    conn = Connection("filesystem://", transport=transport, transport_options=opts)
    return conn, conn.default_channel


def test_the_embedded_broker_uses_this_transport(tmp_path, monkeypatch):
    from backend.settings import get_settings

    for k in ("CELERY_BROKER_URL", "LSTDP_CELERY_BROKER_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("CELERY_BROKER_URL", "filesystem://")
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "var"))
    get_settings.cache_clear()
    try:
        backend.broker.configure()
        with backend.broker.app.connection_for_write() as conn:
            assert isinstance(conn.transport, broker_fs.Transport)
            assert isinstance(conn.default_channel, broker_fs.Channel)
        # the blocking loop's timer ticks often enough that a warm shutdown does not wait for it
        assert backend.broker.app.conf.worker_timer_precision <= 0.1
    finally:  # the process's settings and app as they were (the environment first)
        monkeypatch.undo()
        get_settings.cache_clear()
        backend.broker.configure()


def test_kombus_own_transport_hands_a_consumer_an_empty_file(tmp_path, monkeypatch):
    """The defect this module exists for, shown on kombu's own channel: a consumer between the
    file's creation and its write gets an empty file and json raises. (This pins kombu 5.7's
    behaviour: once kombu fixes celery/kombu#1551 it fails, and backend/broker_fs.py can go.)"""
    conn, ch = _channel(tmp_path, transport=kombu_fs.Transport)
    seen = []
    real_lock = kombu_fs.lock

    def consumer_comes_now(f, flags):
        try:
            seen.append(ch._get("cpu"))
        except ValueError as exc:
            seen.append(exc)
        return real_lock(f, flags)

    monkeypatch.setattr(kombu_fs, "lock", consumer_comes_now)
    with conn:
        ch._put("cpu", {"body": "frame 1"})
    assert len(seen) == 1 and isinstance(seen[0], json.JSONDecodeError), seen


def test_a_consumer_never_sees_a_message_file_before_it_is_whole(tmp_path, monkeypatch):
    conn, ch = _channel(tmp_path)
    assert isinstance(ch, broker_fs.Channel)
    seen = []
    real_replace = broker_fs._replace

    def consumer_comes_now(src, dst):
        assert os.path.basename(src).startswith(".") and src.endswith(".part")
        assert json.loads(open(src, "rb").read()) == {"body": "frame 1"}  # already whole, not yet visible
        try:
            seen.append(ch._get("cpu"))
        except Empty:
            seen.append("empty")
        return real_replace(src, dst)

    monkeypatch.setattr(broker_fs, "_replace", consumer_comes_now)
    with conn:
        ch._put("cpu", {"body": "frame 1"})
        assert seen == ["empty"]  # the partial file is skipped
        assert ch._get("cpu") == {"body": "frame 1"}  # then the whole message, once
        with pytest.raises(Empty):
            ch._get("cpu")
    assert os.listdir(tmp_path) == []


def test_a_message_file_that_is_not_json_is_dropped_with_a_log_not_a_dead_worker(tmp_path, caplog):
    conn, ch = _channel(tmp_path)
    with conn:
        # consumers take files in the sorted order of their names (broker_fs.message_name): a
        # time of 0 in the same form sorts first whatever the clock says ('1_bad' sorted after
        # kombu's unpadded '15..._' once the uptime passed 1e6 ms, and was never read here)
        (tmp_path / f"{BAD}_bad.cpu.msg").write_bytes(b"")
        ch._put("cpu", {"body": "frame 2"})
        assert sorted(os.listdir(tmp_path))[0] == f"{BAD}_bad.cpu.msg"  # consumed first
        with caplog.at_level(logging.ERROR, logger="backend.broker_fs"):
            assert ch._get("cpu") == {"body": "frame 2"}
        assert "not JSON and was dropped" in caplog.text
        with pytest.raises(Empty):
            ch._get("cpu")


def test_a_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    from kombu.exceptions import ChannelError

    conn, ch = _channel(tmp_path)

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(broker_fs, "_replace", full_disk)
    with conn, pytest.raises(ChannelError, match="Cannot add file"):
        ch._put("cpu", {"body": "frame 3"})
    assert os.listdir(tmp_path) == []

    def time_limit(src, dst):  # an exception raised into the sender (a task's soft time limit)
        raise KeyboardInterrupt

    monkeypatch.setattr(broker_fs, "_replace", time_limit)
    with conn, pytest.raises(KeyboardInterrupt):
        ch._put("cpu", {"body": "frame 4"})
    assert os.listdir(tmp_path) == []


def test_a_json_value_that_is_not_a_message_is_dropped_too(tmp_path, caplog):
    conn, ch = _channel(tmp_path)
    with conn:
        (tmp_path / f"{BAD}_a.cpu.msg").write_bytes(b"null")
        (tmp_path / f"{BAD}_b.cpu.msg").write_bytes(b"[]")
        ch._put("cpu", {"body": "frame 5"})
        assert sorted(os.listdir(tmp_path))[:2] == [f"{BAD}_a.cpu.msg", f"{BAD}_b.cpu.msg"]  # consumed first
        with caplog.at_level(logging.ERROR, logger="backend.broker_fs"):
            assert ch._get("cpu") == {"body": "frame 5"}
        assert "JSON NoneType" in caplog.text and "JSON list" in caplog.text


def test_a_part_file_its_sender_never_finished_is_removed_later(tmp_path):
    old = tmp_path / ".1_dead.cpu.msg.part"
    new = tmp_path / ".2_writing.cpu.msg.part"
    old.write_bytes(b"{")
    new.write_bytes(b"{")
    past = os.stat(old).st_mtime - broker_fs.STALE_PART_S - 60
    os.utime(old, (past, past))
    conn, ch = _channel(tmp_path)
    with conn:
        assert sorted(os.listdir(tmp_path)) == [new.name]  # the stale one gone, a current one kept


def test_a_queue_is_taken_in_the_order_it_was_sent_when_the_clock_gains_a_digit(tmp_path, monkeypatch):
    """Names sort as strings: kombu's unpadded monotonic milliseconds put '10000000_' before
    '9999999_', so at each new digit of the uptime (and after a reboot) new messages overtook
    every older one. The padded wall-clock time keeps the order."""
    conn, ch = _channel(tmp_path)
    monkeypatch.setattr(broker_fs, "_last_ms", 0)  # this process's last name: none yet (restored after)
    sent_ms = [9_999, 10_000, 999_999_999, 1_000_000_000, 1_796_000_000_000]  # each step adds a digit
    with conn:
        for i, ms in enumerate(sent_ms):
            monkeypatch.setattr(broker_fs, "_time_ns", lambda ms=ms: ms * 1_000_000 + 999_999)
            ch._put("cpu", {"body": f"message {i}"})
        assert [ch._get("cpu")["body"] for _ in sent_ms] == [f"message {i}" for i in range(len(sent_ms))]
        with pytest.raises(Empty):
            ch._get("cpu")
    # the wall clock's milliseconds (a padded uptime would put a reboot's new messages first)
    monkeypatch.undo()
    name = broker_fs.message_name("cpu")
    assert name.endswith(".cpu.msg") and abs(int(name[:15]) - time.time() * 1000) < 60_000, name


def test_messages_sent_within_one_millisecond_keep_their_order(tmp_path, monkeypatch):
    conn, ch = _channel(tmp_path)
    monkeypatch.setattr(broker_fs, "_last_ms", 0)
    monkeypatch.setattr(broker_fs, "_time_ns", lambda: 1_796_000_000_000_000_000)  # a clock that stands still
    with conn:
        for i in range(50):
            ch._put("cpu", {"body": f"message {i}"})
        assert [ch._get("cpu")["body"] for _ in range(50)] == [f"message {i}" for i in range(50)]


def test_messages_named_by_an_older_version_are_padded_and_taken_first(tmp_path):
    """kombu's own names (unpadded uptime ms), left by a process of an older version, sorted after
    every new message; a channel that opens pads them (same time): they were sent earlier."""
    old = tmp_path / "1552651_6a0b1c2d-1111-2222-3333-444455556666.cpu.msg"
    old.write_text(json.dumps({"body": "sent before the upgrade"}))
    conn, ch = _channel(tmp_path)
    with conn:
        assert sorted(os.listdir(tmp_path))[0] == "000000001552651_6a0b1c2d-1111-2222-3333-444455556666.cpu.msg"
        ch._put("cpu", {"body": "sent after"})
        assert [ch._get("cpu")["body"] for _ in range(2)] == ["sent before the upgrade", "sent after"]


@pytest.mark.parametrize("flag", ["should_stop", "should_terminate"])
def test_a_worker_asked_to_stop_takes_no_more_messages_and_its_wait_ends(tmp_path, monkeypatch, flag):
    """Celery's blocking loop (the embedded broker's) waits for messages 2 s at a time and looks
    at its stop flags between waits, and once more after: a warm shutdown began 2-4 s after the
    signal. Here the wait ends at once when the worker is stopping, taking nothing: the message
    stays in the folder for the next worker. Celery sets the flag to an exit code, 0 for a warm
    shutdown (so a truth test of the flag would miss it)."""
    import socket

    from celery.worker import state as worker_state
    from kombu import Queue

    conn, _ch = _channel(tmp_path)
    queue = Queue("cpu", routing_key="cpu")
    conn.Producer().publish({"n": 1}, routing_key="cpu", declare=[queue])
    got = []
    with conn.Consumer(queue, callbacks=[lambda body, message: (got.append(body), message.ack())]):
        monkeypatch.setattr(worker_state, flag, 0)
        with pytest.raises(socket.timeout):
            conn.drain_events(timeout=30)
        assert got == []
        assert len(list(tmp_path.glob("*.msg"))) == 1, "the message must stay for the next worker"
        monkeypatch.setattr(worker_state, flag, None)
        conn.drain_events(timeout=30)
    assert got == [{"n": 1}]
    assert list(tmp_path.glob("*.msg")) == []
    conn.release()


def test_a_stop_asked_for_during_a_wait_ends_it(tmp_path, monkeypatch):
    """The case of a real SIGTERM: the worker is already waiting on an empty queue when the flag
    is set (here from another thread, 0.3 s in): the wait ends then, not at its timeout."""
    import socket
    import threading

    from celery.worker import state as worker_state
    from kombu import Queue

    conn, _ch = _channel(tmp_path)
    queue = Queue("cpu", routing_key="cpu")
    conn.Producer().publish({"n": 1}, routing_key="cpu", declare=[queue])
    got = []
    monkeypatch.setattr(worker_state, "should_stop", None)
    with conn.Consumer(queue, callbacks=[lambda body, message: (got.append(body), message.ack())]):
        conn.drain_events(timeout=30)  # the one message: the queue is empty now
        assert got == [{"n": 1}]
        timer = threading.Timer(0.3, lambda: setattr(worker_state, "should_stop", 0))
        timer.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(socket.timeout):
                conn.drain_events(timeout=60)
        finally:
            timer.cancel()
        assert time.monotonic() - t0 < 30, "the wait ran to its timeout: the flag was not seen during it"
    conn.release()
