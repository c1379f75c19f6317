"""Build the API's ASGI application: ``/v1`` routes, ``/metrics``, the dashboard.

:func:`create_app` is called by whoever knows both the manager and this package (the ``dnslb``
command): ``manager.api = create_app(Control(manager), auth=...)``. The manager's own HTTP
front (``manager.http.ManagerApp``) answers agent reports, ``/healthz`` and ``/readyz`` and hands
every other request to this application.

Layers, outermost first: CORS (only when origins are configured), bearer authentication
(:mod:`api.auth`), the body cap (:class:`BodyLimit`), FastAPI's routing with one exception
handler (:mod:`api.errors`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response

from api import errors
from api.auth import ApiAuth, BearerAuth
from api.dashboard import CHART_JS, dashboard_router
from api.metrics import metrics_registry, render
from api.models import ErrorBody
from api.routes import GENERIC_OBJECT, MAX_BODY, SpecSchemas, check_query, v1_router
from dnslb import __version__
from dnslb.asgi import ASGIApp, Message, Receive, Scope, Send, declared_length
from dnslb.control import ManagerControl

DESCRIPTION = """\
The dnslb manager's REST API. Every request needs `Authorization: Bearer TOKEN`: `GET` needs the
`read` role, every other method `admin`. Errors are `{"error": ..., "problems": [{field,
message}]}`. Pool and member bodies have the configuration file's shape (docs/manager.md).
"""

METRICS_CONTENT = "text/plain; version=0.0.4; charset=utf-8"


class BodyLimit:
    """ASGI middleware capping every request body at ``limit`` bytes (413), whatever route reads
    it and however: a declared ``Content-Length`` over the cap is refused before anything is
    read; a body sent in chunks is cut at the cap (the route sees the client gone) and its
    answer replaced with the 413. Either way the connection is closed."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(send)
            return
        received = 0
        over = False

        async def capped_receive() -> Message:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                over = True
                return {"type": "http.disconnect"}
            return message

        answered = False

        async def capped_send(message: Message) -> None:
            nonlocal answered
            if not over:
                await send(message)
            elif not answered:
                answered = True
                await self._refuse(send)

        await self.app(scope, capped_receive, capped_send)
        if over and not answered:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        payload = json.dumps(
            {"error": f"body larger than {self.limit} bytes", "problems": []}
        ).encode("utf-8")
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode("ascii")),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


class ApiApp(FastAPI):
    """FastAPI with the bearer scheme stated on every operation that needs a token."""

    auth: ApiAuth

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema:
            return self.openapi_schema
        schema = get_openapi(
            title=self.title,
            version=self.version,
            openapi_version=self.openapi_version,
            description=self.description,
            routes=self.routes,
        )
        schema.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "an API token"}
        }
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                if self.auth.needed(method.upper(), path) is not None:
                    operation["security"] = [{"bearer": []}]
        self.openapi_schema = schema
        return schema


def create_app(
    control: ManagerControl,
    *,
    auth: ApiAuth,
    pool_schema: Mapping[str, Any] | None = None,
    member_schema: Mapping[str, Any] | None = None,
    cors_origins: Sequence[str] = (),
    chart_library: Path | None = CHART_JS,
) -> FastAPI:
    """The API over ``control``.

    ``pool_schema`` and ``member_schema`` are JSON Schemas of the pool and member documents (the
    ``dnslb`` command generates them from the configuration classes); without them the OpenAPI
    document says only "an object". ``cors_origins`` empty: no CORS headers at all.
    """
    app = ApiApp(
        title="dnslb",
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,  # Swagger UI and ReDoc load their code from a CDN; labs run offline
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.auth = auth
    errors.install(app)
    schemas = SpecSchemas(
        pool=pool_schema or GENERIC_OBJECT, member=member_schema or GENERIC_OBJECT
    )
    v1 = v1_router(control, schemas)
    dashboard = dashboard_router(chart_library)
    extra = APIRouter(dependencies=[Depends(check_query)])
    registry = metrics_registry(control)

    @extra.get(
        "/metrics",
        tags=["manager"],
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
            401: {"model": ErrorBody, "description": "missing or unknown token"},
        },
    )
    async def metrics() -> Response:
        """Prometheus text format; needs the read role unless auth.metrics_public."""
        return Response(render(registry), media_type=METRICS_CONTENT)

    for router in (v1, extra, dashboard):
        app.include_router(router)
    errors.allow_methods(app, [*v1.routes, *extra.routes, *dashboard.routes])
    app.add_middleware(BodyLimit)
    app.add_middleware(BearerAuth, auth=auth)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )
    return app
