"""The web page and the API docs, all served from files in the package (nothing from a CDN):
``GET /`` (``static/index.html``), ``/static/*`` (its script, style sheet and icon),
``/favicon.ico``, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with assets bundled by the
``fastapi-offline`` package. No page runs inline script (the CSP forbids it)."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, Response

router = APIRouter()

STATIC = resources.files("hubless.service") / "static"
PAGE = (STATIC / "index.html").read_text(encoding="utf-8")
#: Files the page may load: name -> content type.
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
    "docs.js": "text/javascript; charset=utf-8",
}
#: Bundled documentation assets (fastapi-offline): name -> content type.
DOCS_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
}


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def page() -> HTMLResponse:
    return HTMLResponse(PAGE, headers={"cache-control": "no-cache"})


@router.get("/static/{name}", include_in_schema=False)
def asset(name: str) -> Response:
    if name in ASSETS:
        return FileResponse(str(STATIC / name), media_type=ASSETS[name], headers={"cache-control": "no-cache"})
    if name in DOCS_ASSETS:
        folder = _docs_assets()
        if folder is not None and name == "redoc.standalone.js":
            return Response(_redoc_bundle(), media_type=DOCS_ASSETS[name], headers={"cache-control": "max-age=86400"})
        if folder is not None:
            return FileResponse(str(folder / name), media_type=DOCS_ASSETS[name], headers={"cache-control": "max-age=86400"})
    raise HTTPException(404, "no such file")


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> FileResponse:
    return FileResponse(str(STATIC / "favicon.svg"), media_type="image/svg+xml")


#: ReDoc's bundle shows a logo from its CDN beside "API docs by Redocly", which the CSP blocks
#: (a console error, and a request off this machine): it is replaced by an empty inline image.
REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
EMPTY_IMAGE = b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' width='1' height='1'/%3E"


@cache
def _redoc_bundle() -> bytes:
    folder = _docs_assets()
    assert folder is not None  # checked by the caller
    return (folder / "redoc.standalone.js").read_bytes().replace(REDOC_CDN_LOGO, EMPTY_IMAGE)


def _docs_assets():
    try:
        import fastapi_offline
    except ImportError:
        return None
    return resources.files(fastapi_offline) / "static"


DOCS_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>hubless API</title>
<link rel="icon" href="/static/favicon.svg"><link rel="stylesheet" href="/static/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/static/swagger-ui-bundle.js"></script><script src="/static/docs.js"></script></body></html>"""
REDOC_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>hubless API</title><link rel="icon" href="/static/favicon.svg"></head>
<body><redoc spec-url="/openapi.json"></redoc><script src="/static/redoc.standalone.js"></script></body></html>"""
MISSING_DOCS = "<!DOCTYPE html><title>hubless API</title><p>The API description is at <a href='/openapi.json'>/openapi.json</a>; install fastapi-offline (the serve extra) for this page.</p>"


@router.get("/docs", response_class=HTMLResponse, include_in_schema=False)
def docs() -> str:
    return DOCS_PAGE if _docs_assets() is not None else MISSING_DOCS


@router.get("/redoc", response_class=HTMLResponse, include_in_schema=False)
def redoc() -> str:
    return REDOC_PAGE if _docs_assets() is not None else MISSING_DOCS
