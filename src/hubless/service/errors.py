"""Errors as HTTP answers: a :class:`hubless.errors.HublessError` maps to its status
(:func:`error_status`), a request that fails validation to 422, anything else to a 500 that
says nothing about the server's internals; the server keeps serving."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hubless.errors import Busy, Conflict, HublessError, InvalidInput, NotFound, message

__all__ = ["error_status", "install_error_handlers"]


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
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"detail": f"invalid request: {problems}"}, status_code=422)

    @app.exception_handler(HublessError)
    async def hubless_error(request: Request, exc: HublessError):
        status = error_status(exc)
        if status >= 500:  # damaged data or a missing package is the server's business: no detail leaks
            return JSONResponse({"detail": f"internal error ({type(exc).__name__}); the server keeps running"}, status_code=status)
        headers = {"Retry-After": "1"} if status == 503 else None
        return JSONResponse({"detail": message(exc)}, status_code=status, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):  # one request fails, the server goes on, no traceback leaks
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); the server keeps running"}, status_code=500)
