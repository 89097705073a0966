"""uvicorn's HTTP protocols with a bound on the time to send a request's headers.

uvicorn (h11 and httptools alike) closes an idle kept-alive connection after
``timeout_keep_alive`` but has no limit on a connection that has begun, or not begun, a
request and never finishes its headers: such connections (slowloris, a client that
died half-way) stay open for ever, each a socket and a protocol object. Here a timer is
armed when the connection opens and again when an answer is complete (a kept-alive
connection waits for its next request); it is cancelled when a request's headers are
complete (uvicorn has made its request cycle). When it fires, the connection is answered
``408 Request Timeout`` and closed. The bound is ``HEADER_TIMEOUT_S`` (default 10 s); a
request's body, and the answer, are not limited by it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["protocol_class", "HeaderTimeoutMixin"]

_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class HeaderTimeoutMixin:
    """Arms the header timer (module docstring); ``header_timeout_s`` is set by
    :func:`protocol_class` [s]."""

    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None
    _armed_cycle: Any = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        if self._header_timer is not None and self.cycle is not self._armed_cycle:  # type: ignore[attr-defined]
            self._cancel_header_timer()  # a request's headers are complete

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        cycle = self.cycle  # type: ignore[attr-defined]
        # kept alive: the next request's headers are bounded too, unless that request (sent
        # pipelined behind the one just answered) already has its headers: its body is not
        # bounded here
        if not self.transport.is_closing() and (cycle is None or cycle.response_complete):  # type: ignore[attr-defined]
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._armed_cycle = self.cycle  # type: ignore[attr-defined]
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)  # type: ignore[attr-defined]

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        transport = self.transport  # type: ignore[attr-defined]
        if transport.is_closing() or self.cycle is not self._armed_cycle:  # type: ignore[attr-defined]
            return
        try:
            transport.write(_408)
        finally:
            transport.close()


def protocol_class(header_timeout_s: float) -> type:
    """uvicorn's httptools protocol (h11 where httptools is not installed) with the header
    bound ``header_timeout_s`` [s]: pass it as ``uvicorn.run(..., http=...)``."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # pragma: no cover - httptools is a dependency of uvicorn[standard]
        base = H11Protocol
    return type(f"HeaderTimeout{base.__name__}", (HeaderTimeoutMixin, base), {"header_timeout_s": header_timeout_s})
