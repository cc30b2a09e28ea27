"""Errors as HTTP answers: a :class:`hubless.errors.HublessError` maps to its status
(:func:`error_status`), a request that fails validation to 422, anything else to a 500 that
says nothing about the server's internals; the server keeps serving. No answer names a path on
the server's disk: absolute paths in a message are replaced by ``<path>`` (:func:`scrub`)."""

from __future__ import annotations

import re

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hubless.errors import Busy, Conflict, HublessError, InvalidInput, NotFound, message

__all__ = ["ECHO_CHARS", "MAX_DETAIL_CHARS", "clip", "error_status", "install_error_handlers", "scrub"]

INTERNAL = "internal error; the server keeps running"
BUSY = "the index is busy (another write holds its lock): retry after the Retry-After seconds"
#: Absolute POSIX or Windows paths (and file: URLs) inside a message.
_PATH = re.compile(r"(?:file://)?(?<![\w.:/-])(?:/|[A-Za-z]:[\\/])(?:[^\s'\"(),;:]+[\\/]?)+")


#: How much of a request's own input an error message repeats (a field name, an index name).
ECHO_CHARS = 200
#: The longest error message sent (a backstop: messages repeat input cut to ECHO_CHARS).
MAX_DETAIL_CHARS = 2000


def clip(text, limit: int = ECHO_CHARS) -> str:
    """``text`` (input echoed in an error) cut to ``limit`` characters, saying how long it was."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def scrub(text: str) -> str:
    """``text`` with every absolute path replaced by ``<path>``, cut to :data:`MAX_DETAIL_CHARS`."""
    return clip(_PATH.sub("<path>", text), MAX_DETAIL_CHARS)


def error_status(exc: HublessError) -> int:
    """The HTTP status of a hubless error: 404 not found, 409 conflict, 503 busy, 422 other bad
    input; 500 for damaged data, a missing package or an unfinished job (the server's problem)."""
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Conflict):
        return 409
    if isinstance(exc, Busy):
        return 503
    if isinstance(exc, InvalidInput):
        return 422
    return 500


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{clip('.'.join(str(p) for p in e['loc'][1:])) or 'body'}: {clip(e['msg'])}" for e in exc.errors()[:10])
        return JSONResponse({"detail": scrub(f"invalid request: {problems}")}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return JSONResponse({"detail": scrub(str(exc.detail))}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(HublessError)
    async def hubless_error(request: Request, exc: HublessError):
        status = error_status(exc)
        if status == 503:  # a held lock: say so, not where
            return JSONResponse({"detail": BUSY}, status_code=503, headers={"Retry-After": "1"})
        if status >= 500:  # damaged data or a missing package is the server's business: no detail leaks
            return JSONResponse({"detail": INTERNAL}, status_code=status)
        return JSONResponse({"detail": scrub(message(exc))}, status_code=status)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):  # one request fails, the server goes on, no traceback leaks
        return JSONResponse({"detail": INTERNAL}, status_code=500)
