"""Read timeouts for ``hubless serve`` (uvicorn's h11 protocol, plus two timers): a client has
``header_timeout`` seconds from its first byte (or from connecting) to send a request's
headers, and ``body_timeout`` seconds to send its body; otherwise the connection is closed. So
idle or trickling connections (slow-loris) are dropped instead of held; uvicorn's own
keep-alive timeout closes idle connections between requests.

    uvicorn.run(app, http=hubless.service.protocol.protocol_class(10.0, 30.0))
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["GuardedH11Protocol", "ServeProtocol", "protocol_class"]


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header and a body read timeout (see the module docstring)."""

    header_timeout = 10.0
    body_timeout = 30.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._read_timer = None
        self._arm(self.header_timeout)  # the first request's headers must come in time

    def data_received(self, data: bytes) -> None:
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

    _reading = None

    def _arm(self, seconds: float, what: str = "headers") -> None:
        self._disarm()
        self._reading = what
        self._read_timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        timer = getattr(self, "_read_timer", None)
        if timer is not None:
            timer.cancel()
        self._read_timer, self._reading = None, None

    def _timed_out(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_class(header_timeout: float, body_timeout: float) -> type[GuardedH11Protocol]:
    """The protocol class with these timeouts (for ``uvicorn.run(..., http=...)``)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout": float(header_timeout), "body_timeout": float(body_timeout)})


class ServeProtocol(GuardedH11Protocol):
    """The protocol of ``hubless serve`` (``http="hubless.service.protocol:ServeProtocol"``):
    its timeouts come from the serve configuration each worker process reads."""

    def connection_made(self, transport) -> None:
        if ServeProtocol._configured is None:
            import json
            import os

            config = json.loads(os.environ.get("HUBLESS_SERVE_CONFIG", "{}"))
            ServeProtocol.header_timeout = float(config.get("header_timeout", GuardedH11Protocol.header_timeout))
            ServeProtocol.body_timeout = float(config.get("body_timeout", GuardedH11Protocol.body_timeout))
            ServeProtocol._configured = True
        super().connection_made(transport)

    _configured = None
