"""The dashboard: a static page that polls the JSON API and draws charts with Chart.js.

The page and its script are public (they hold no data); the data comes from the ``/v1`` API with
the read token the operator pastes once, kept in the tab's ``sessionStorage``, never in a URL.
Chart.js ships in the package (``api/static/vendor/``, its version and licence in the README
there) and is served by the manager: no CDN, so the page works offline. The responses carry a
strict Content Security Policy: scripts only from this origin, no inline script, no other host
contacted.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response

log = logging.getLogger("dnslb.api")

STATIC = Path(__file__).resolve().parent / "static"
CHART_JS = STATIC / "vendor" / "chart.umd.min.js"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def dashboard_router(chart_library: Path | None = CHART_JS) -> APIRouter:
    """Routes serving the page, its files and the chart library (none in the OpenAPI schema)."""
    router = APIRouter(include_in_schema=False)
    if chart_library is None or not chart_library.is_file():
        log.warning(
            "the dashboard's chart library is missing (%s): the charts stay empty (the tables "
            "and the API work); reinstall dnslb, which ships it",
            chart_library,
        )

    @router.get("/")
    async def root() -> Response:
        return RedirectResponse("/dashboard/", status_code=307)

    @router.get("/dashboard")
    async def bare() -> Response:
        return RedirectResponse("/dashboard/", status_code=307)

    @router.get("/dashboard/")
    async def index() -> Response:
        return _file("index.html")

    @router.get("/dashboard/vendor/chart.umd.js")
    async def chart() -> Response:
        if chart_library is None or not chart_library.is_file():
            return JSONResponse(
                {
                    "error": "the chart library is missing from this install: reinstall dnslb",
                    "problems": [],
                },
                status_code=404,
            )
        return FileResponse(chart_library, media_type=FILES["dashboard.js"], headers=HEADERS)

    @router.get("/dashboard/{name}")
    async def static(name: str) -> Response:
        if name not in FILES:
            return JSONResponse({"error": "not found", "problems": []}, status_code=404)
        return _file(name)

    return router


def _file(name: str) -> Response:
    return FileResponse(STATIC / name, media_type=FILES[name], headers=HEADERS)
