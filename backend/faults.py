"""Reasons for infrastructure faults that may be shown to a user.

The messages of psycopg, redis-py and kombu name the server they failed to reach
(``connection to server at "10.0.0.5", port 5432 failed``, ``Error 111 connecting to
redis:6379``) and sometimes the user or the database. A response body, and a job's
stored reason (which the API serves), must carry none of that: :func:`public_reason`
keeps only the kind of fault, from a fixed list of phrases, and the exception's type. The
caller logs the full error on the server.
"""

from __future__ import annotations

__all__ = ["public_reason", "FAULT_PHRASES"]

#: Text found in a driver's message (lower case) -> what the user is told. The first match
#: wins, so the more specific come first. Taken from the messages of libpq/psycopg 3,
#: redis-py, kombu and SQLAlchemy's pool.
FAULT_PHRASES: tuple[tuple[str, str], ...] = (
    ("queuepool limit", "every database connection is in use"),
    ("statement timeout", "the statement took longer than its timeout"),
    ("canceling statement", "the statement was cancelled"),
    ("password authentication failed", "authentication failed"),
    ("authentication required", "authentication failed"),
    ("invalid password", "authentication failed"),
    ("wrongpass", "authentication failed"),
    ("username-password", "authentication failed"),
    ("noauth", "authentication failed"),
    ("no password supplied", "authentication failed"),
    ("connection refused", "connection refused"),
    ("timeout", "no answer in time"),
    ("timed out", "no answer in time"),
    ("name or service not known", "host name not resolved"),
    ("failed to resolve host", "host name not resolved"),
    ("could not translate host name", "host name not resolved"),
    ("temporary failure in name resolution", "host name not resolved"),
    ("no route to host", "network unreachable"),
    ("network is unreachable", "network unreachable"),
    ("too many connections", "too many connections"),
    ("too many clients", "too many connections"),
    ("max number of clients", "too many connections"),
    ("starting up", "the server is starting up"),
    ("shutting down", "the server is shutting down"),
    ("administrator command", "the server ended the connection"),
    ("server closed the connection", "the server closed the connection"),
    ("connection reset", "connection lost"),
    ("connection closed", "connection lost"),
    ("connection is lost", "connection lost"),
    ("connection lost", "connection lost"),
    ("broken pipe", "connection lost"),
    ("closed by server", "connection lost"),
    ("does not exist", "the database or role does not exist"),
)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        todo.extend([getattr(e, "orig", None), e.__cause__, e.__context__])
    return out


def public_reason(exc: BaseException) -> str:
    """The kind of an infrastructure fault in a few words, with the exception's type, e.g.
    ``connection refused (OperationalError)``: never a host, port, URL, user or password.

    The messages of ``exc``, its ``orig`` (SQLAlchemy's driver error) and its causes are
    searched for :data:`FAULT_PHRASES`; without a match only the type is given. The type is
    the driver's where SQLAlchemy wraps one (``ConnectionTimeout`` rather than
    ``OperationalError``).

    Parameters
    ----------
    exc : BaseException
        The error, as caught.

    Returns
    -------
    str
        One line, under 100 characters.
    """
    chain = _chain(exc)
    orig = getattr(exc, "orig", None)
    kind = type(orig if isinstance(orig, BaseException) else exc).__name__
    text = " ".join(str(e) for e in chain).lower()
    if type(exc).__name__ == "TimeoutError" and type(exc).__module__.startswith("sqlalchemy"):
        text = "queuepool limit " + text
    for needle, phrase in FAULT_PHRASES:
        if needle in text:
            return f"{phrase} ({kind})"
    return kind
