"""Read timeouts for ``hubless serve``: uvicorn's HTTP protocol (httptools, the C parser, when
installed, else h11) plus two timers. A client has ``header_timeout`` seconds from connecting,
or from a request's first byte, to send that request's headers, and ``body_timeout`` seconds
to send its body; otherwise the connection is closed. So idle or trickling connections
(slow-loris) are dropped instead of held; uvicorn's own keep-alive timeout closes idle
connections between requests.

    uvicorn.run(app, http=hubless.service.protocol.protocol_class(10.0, 30.0))
"""

from __future__ import annotations

import json
import os
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["GuardedH11Protocol", "ServeProtocol", "protocol_class"]


class _ReadTimers:
    """The two timers; the parser-specific subclasses say when a request starts, when its
    headers and its body are complete."""

    header_timeout = 10.0
    body_timeout = 30.0
    _read_timer: Any = None
    _reading: str | None = None
    loop: Any  # set by uvicorn's protocol classes
    transport: Any

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._reading = what
        self._read_timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer, self._reading = None, None

    def _timed_out(self) -> None:
        self._read_timer, self._reading = None, None
        if not self.transport.is_closing():
            self.transport.close()


class GuardedH11Protocol(_ReadTimers, H11Protocol):
    """uvicorn's h11 protocol with the read timeouts (see the module docstring)."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm(self.header_timeout, "headers")  # the first request's headers must come in time

    def data_received(self, data: bytes) -> None:
        import h11

        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._reading != "body":
                self._arm(self.body_timeout, "body")
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            if self._reading != "headers":
                self._arm(self.header_timeout, "headers")
        else:  # the request is read (or the connection is done): the app answers in its own time
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # between requests: uvicorn's keep-alive timeout applies

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


HttpToolsProtocol: Any
try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is missing: h11 only
    HttpToolsProtocol = None

if HttpToolsProtocol is not None:

    class GuardedHttpToolsProtocol(_ReadTimers, HttpToolsProtocol):
        """uvicorn's httptools protocol with the read timeouts (see the module docstring)."""

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm(self.header_timeout, "headers")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm(self.header_timeout, "headers")

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm(self.body_timeout, "body")

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    BASE: type = GuardedHttpToolsProtocol
else:  # pragma: no cover
    BASE = GuardedH11Protocol


def protocol_class(header_timeout: float, body_timeout: float) -> type:
    """The protocol class with these timeouts (for ``uvicorn.run(..., http=...)``)."""
    return type("GuardedProtocol", (BASE,), {"header_timeout": float(header_timeout), "body_timeout": float(body_timeout)})


class ServeProtocol(BASE):
    """The protocol of ``hubless serve`` (``http="hubless.service.protocol:ServeProtocol"``):
    its timeouts come from the serve configuration each worker process reads."""

    _configured = False

    def connection_made(self, transport) -> None:
        if not ServeProtocol._configured:
            config = json.loads(os.environ.get("HUBLESS_SERVE_CONFIG", "{}"))
            ServeProtocol.header_timeout = float(config.get("header_timeout", _ReadTimers.header_timeout))
            ServeProtocol.body_timeout = float(config.get("body_timeout", _ReadTimers.body_timeout))
            ServeProtocol._configured = True
        super().connection_made(transport)
