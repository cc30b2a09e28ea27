"""``GET /``: the web page (``static/index.html``: search, compare, weight slider, hubness)."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()

PAGE = (resources.files("hubless.service") / "static" / "index.html").read_text(encoding="utf-8")


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def page() -> str:
    return PAGE
