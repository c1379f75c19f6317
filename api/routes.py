"""The ``/v1`` routes: pools, servers and their actions, plan, events, costs, status, explain,
history.

Every handler is ``async``: the manager's state lives in its event loop (and its SQLite
connection in that loop's thread), so views are read there, never from a worker thread.
Authentication happened before a handler runs (:mod:`api.auth`); errors are raised as the
project's exceptions and answered by :mod:`api.errors`.

Pool and member bodies are JSON documents in the configuration file's shape; the manager builds
them with the file's own machinery, so the API and the file accept exactly the same pools. Their
OpenAPI schemas are JSON Schemas generated from the configuration classes (passed in by whoever
builds the app, since this package does not import the manager).
"""

from __future__ import annotations

import copy
import json
import re
import types
import typing
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from annotated_types import Ge, Le
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BeforeValidator, StringConstraints
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from api.models import (
    ActionRequest,
    CostReport,
    ErrorBody,
    EventOut,
    EventPage,
    ExplanationOut,
    HistoryOut,
    LocationLoadOut,
    PlanOut,
    PoolCost,
    PoolOut,
    ServerCost,
    ServerOut,
    StatsOut,
    StatusOut,
    bounded_float,
)
from dnslb.control import ManagerControl, NotFound, location_loads
from dnslb.errors import ConfigError
from dnslb.plan import plan_to_dict

MAX_BODY = 1 << 20
MAX_DEPTH = 32
MAX_ID = 2**63 - 1  # event ids are SQLite integers

GENERIC_OBJECT: dict[str, Any] = {"type": "object"}

_DECIMAL = re.compile(r"-?[0-9]+")
_DIGITS = 40  # more: out of every range here, and int() of thousands of digits is slow


def _decimal(value: object) -> object:
    """A query integer as plain decimal digits. pydantic's lax mode would also take ``86400.0``,
    ``+5``, `` 5`` and ``5_0``: an integer parameter is refused (422) unless it is written as
    one, so what a client sent is what the API understood."""
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise ValueError("must be a whole number in decimal digits")
        if len(value) > _DIGITS:
            raise ValueError("out of range")
        return int(value)
    return value


# The bounds sit inside the type, beside the validator, so that the OpenAPI document still
# states them as JSON Schema (minimum, maximum).
EventId = Annotated[int, Ge(1), Le(MAX_ID), BeforeValidator(_decimal)]
PageSize = Annotated[int, Ge(1), Le(1000), BeforeValidator(_decimal)]


@dataclass(frozen=True, slots=True)
class SpecSchemas:
    """JSON Schemas of a pool and of a static member, for the OpenAPI document."""

    pool: Mapping[str, Any] = field(default_factory=lambda: GENERIC_OBJECT)
    member: Mapping[str, Any] = field(default_factory=lambda: GENERIC_OBJECT)


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


READ_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _error("missing or unknown token"),
    422: _error("invalid or unknown parameters; each problem names its field"),
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: _error("no such pool or server")}
CHANGE_ERRORS: dict[int | str, dict[str, Any]] = {
    **READ_ERRORS,
    400: _error("the body could not be decoded"),
    403: _error("the token's role is read; changes need admin"),
    404: _error("no such pool or server"),
    409: _error("contradicts the current state (e.g. a pool from the configuration file)"),
    413: _error("body too large"),
    502: _error("the manager could not carry it out (a cloud provider failed)"),
}


def _body(schema: Mapping[str, Any], example: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": dict(schema), "example": dict(example)}},
        }
    }


POOL_EXAMPLE = {
    "name": "api",
    "zone": "example.com",
    "policy": {"k": 4, "ttl_max": 60, "th_over": 0.8},
    "members": [{"id": "api-1", "address": "192.0.2.21", "max_concurrency": 200}],
}
MEMBER_EXAMPLE = {"id": "api-2", "address": "192.0.2.22", "max_concurrency": 200}


async def json_object(request: Request, what: str) -> dict[str, Any]:
    """The request's body as a JSON object; 413 above :data:`MAX_BODY`, 422 when not one."""
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                raise HTTPException(413, f"body larger than {MAX_BODY} bytes")
    except ClientDisconnect:
        # Gone before the end of its body (or dropped by the listener as too slow): nobody is
        # left to answer, and nothing went wrong here.
        raise HTTPException(400, "the client went away before the end of its body") from None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise ConfigError(f"invalid {what}", ["body: not valid JSON"]) from None
    if not isinstance(value, dict):
        raise ConfigError(f"invalid {what}", [f"body: must be a JSON object (the {what})"])
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"invalid {what}", ["body: holds an unpaired surrogate escape (\\ud800-\\udfff)"]
        ) from None
    if _depth(value) > MAX_DEPTH:
        raise ConfigError(f"invalid {what}", [f"body: nested deeper than {MAX_DEPTH} levels"])
    return value


def _depth(value: Any) -> int:
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
    return deepest


def _repeatable(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _repeatable(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_repeatable(arg) for arg in typing.get_args(annotation))
    return origin in (list, tuple, set, frozenset)


def _query_params(dependant: Dependant) -> dict[str, bool]:
    """A route's query parameters: name -> whether it may be repeated (a list)."""
    params = {
        param.alias: _repeatable(param.field_info.annotation) for param in dependant.query_params
    }
    for inner in dependant.dependencies:
        params.update(_query_params(inner))
    return params


async def check_query(request: Request) -> None:
    """Refuse query parameters a route does not take, and single-valued ones given twice (422):
    a misspelt filter (``?pol=www``) or an ambiguous one (``?pool=a&pool=b``) is an error, not
    silently ignored with everything (or the last one) returned."""
    route = request.scope.get("route")
    if not request.query_params or not isinstance(route, APIRoute):
        return
    known = _query_params(route.dependant)
    problems = []
    for name in sorted(set(request.query_params.keys())):
        if name not in known:
            problems.append({"loc": ("query", name), "msg": "unknown parameter"})
        elif not known[name] and len(request.query_params.getlist(name)) > 1:
            problems.append({"loc": ("query", name), "msg": "given more than once"})
    if problems:
        raise RequestValidationError(problems)


def _without_required(schema: Mapping[str, Any], key: str) -> dict[str, Any]:
    result = copy.deepcopy(dict(schema))
    if key in result.get("required", []):
        result["required"] = [name for name in result["required"] if name != key]
    return result


def _per_cost(served: int, seconds: float) -> float | None:
    """Requests per server-second; None without seconds. Bounded whatever the counts hold."""
    served_f, seconds_f = bounded_float(served), bounded_float(seconds)
    if served_f is None or seconds_f is None or seconds_f <= 0:
        return None
    return bounded_float(served_f / seconds_f)


PoolName = Annotated[str, Path(description="pool name")]
ServerId = Annotated[str, Path(description="server id")]


def v1_router(control: ManagerControl, schemas: SpecSchemas) -> APIRouter:
    """The ``/v1`` routes over ``control``."""
    router = APIRouter(prefix="/v1", dependencies=[Depends(check_query)])

    @router.get("/status", responses=READ_ERRORS, tags=["manager"])
    async def status() -> StatusOut:
        """The manager at a glance: readiness, plan, ticks, reports, servers by state."""
        servers = control.servers()
        by_state = Counter(server.state.value for server in servers)
        return StatusOut(
            manager=StatsOut.of(control.stats()),
            pools=len(control.pools()),
            servers=dict(by_state),
            paused=sum(1 for s in servers if s.paused or s.admin_paused),
            locations=[LocationLoadOut.of(load) for load in location_loads(servers)],
        )

    @router.get("/pools", responses=READ_ERRORS, tags=["pools"])
    async def list_pools() -> list[PoolOut]:
        """Every pool, from the file and created here."""
        return [PoolOut.of(pool) for pool in control.pools()]

    @router.post(
        "/pools",
        status_code=201,
        responses=CHANGE_ERRORS,
        tags=["pools"],
        openapi_extra=_body(schemas.pool, POOL_EXAMPLE),
    )
    async def create_pool(request: Request) -> PoolOut:
        """Create a pool (persisted; answered from the next plan). Same shape as in the file."""
        spec = await json_object(request, "pool")
        return PoolOut.of(await control.create_pool(spec))

    @router.get("/pools/{name}", responses={**READ_ERRORS, **NOT_FOUND}, tags=["pools"])
    async def show_pool(name: PoolName) -> PoolOut:
        return PoolOut.of(control.pool(name))

    @router.put(
        "/pools/{name}",
        responses=CHANGE_ERRORS,
        tags=["pools"],
        openapi_extra=_body(_without_required(schemas.pool, "name"), POOL_EXAMPLE),
    )
    async def update_pool(name: PoolName, request: Request) -> PoolOut:
        """Replace a pool created here: policy and checks apply at once; members are diffed.

        ``name`` may be left out of the body; when given it must be the path's. Pools from the
        configuration file are changed in the file (409).
        """
        spec = await json_object(request, "pool")
        if "name" in spec and spec["name"] != name:
            raise ConfigError("invalid pool", ["name: must be the pool's name in the path"])
        return PoolOut.of(await control.update_pool(name, spec))

    @router.delete("/pools/{name}", status_code=204, responses=CHANGE_ERRORS, tags=["pools"])
    async def delete_pool(name: PoolName) -> Response:
        """Delete a pool created here; its launched servers are terminated."""
        await control.delete_pool(name)
        return Response(status_code=204)

    @router.post(
        "/pools/{name}/members",
        status_code=201,
        responses=CHANGE_ERRORS,
        tags=["pools"],
        openapi_extra=_body(schemas.member, MEMBER_EXAMPLE),
    )
    async def add_member(name: PoolName, request: Request) -> ServerOut:
        """Add a static member to a pool created here."""
        member = await json_object(request, "member")
        return ServerOut.of(await control.add_member(name, member))

    @router.delete(
        "/pools/{name}/members/{server_id}",
        status_code=204,
        responses=CHANGE_ERRORS,
        tags=["pools"],
    )
    async def remove_member(name: PoolName, server_id: ServerId) -> Response:
        """Remove a static member (it leaves the plan now); launched servers are drained instead."""
        if control.server(server_id).pool != name:
            raise NotFound(f"no server {server_id!r} in pool {name!r}")
        await control.remove_member(server_id)
        return Response(status_code=204)

    @router.get("/servers", responses={**READ_ERRORS, **NOT_FOUND}, tags=["servers"])
    async def list_servers(
        pool: Annotated[
            str | None, Query(min_length=1, description="only this pool's servers")
        ] = None,
    ) -> list[ServerOut]:
        """Servers with state, utilization, weight, TTL, pause flags and cost."""
        return [ServerOut.of(server) for server in control.servers(pool)]

    @router.get("/servers/{server_id}", responses={**READ_ERRORS, **NOT_FOUND}, tags=["servers"])
    async def show_server(server_id: ServerId) -> ServerOut:
        return ServerOut.of(control.server(server_id))

    @router.post("/servers/{server_id}/actions", responses=CHANGE_ERRORS, tags=["servers"])
    async def act(server_id: ServerId, action: ActionRequest) -> ServerOut:
        """pause, resume, disable, enable or drain a server; the reason goes to the event log."""
        return ServerOut.of(await control.act(server_id, action.action, action.reason))

    @router.get("/plan", responses={**READ_ERRORS, 404: _error("no plan yet")}, tags=["manager"])
    async def plan() -> PlanOut:
        """The plan the pipe backends serve now, and its age."""
        view = control.plan()
        if view is None:
            raise NotFound("no plan published yet (after a start the manager waits for reports)")
        stale_after = view.plan.stale_after
        return PlanOut(
            version=view.plan.version,
            published_at=view.published_at,
            age=view.age,
            stale=stale_after is not None and view.age > stale_after,
            plan=plan_to_dict(view.plan),
        )

    @router.get("/events", responses=READ_ERRORS, tags=["manager"])
    async def events(
        *,
        pool: Annotated[str | None, Query(min_length=1, description="only this pool's")] = None,
        server: Annotated[str | None, Query(min_length=1, description="only this server's")] = None,
        kind: Annotated[
            list[Annotated[str, StringConstraints(min_length=1)]],
            Query(default_factory=list, description="only these kinds (repeat the parameter)"),
        ],
        before_id: Annotated[
            EventId | None, Query(description="page: events older than this id")
        ] = None,
        limit: Annotated[PageSize, Query(description="events per page")] = 100,
    ) -> EventPage:
        """Events newest first, filtered and paginated."""
        found: Sequence[Any] = control.events(
            pool=pool, server=server, kinds=tuple(kind), before_id=before_id, limit=limit
        )
        page = [EventOut.of(event) for event in found]
        more = len(page) == limit and page[-1].id is not None
        return EventPage(events=page, next_before_id=page[-1].id if more else None)

    @router.get("/costs", responses={**READ_ERRORS, **NOT_FOUND}, tags=["manager"])
    async def costs(
        pool: Annotated[str | None, Query(min_length=1, description="only this pool")] = None,
    ) -> CostReport:
        """Server-seconds and requests served, per pool and per server, and their ratio."""
        pools = [control.pool(pool)] if pool is not None else list(control.pools())
        report = []
        for view in pools:
            servers = [
                ServerCost(
                    server=server.id,
                    state=server.state,
                    server_seconds=server.cost_seconds,
                    served=server.served,
                    requests_per_cost=_per_cost(server.served, server.cost_seconds),
                )
                for server in control.servers(view.name)
            ]
            report.append(
                PoolCost(
                    pool=view.name,
                    server_seconds=view.cost_seconds,
                    served=view.served,
                    requests_per_cost=_per_cost(view.served, view.cost_seconds),
                    servers=servers,
                )
            )
        seconds = sum(item.server_seconds for item in report)
        served = sum(item.served for item in report)
        return CostReport(
            pools=report,
            server_seconds=seconds,
            served=served,
            requests_per_cost=_per_cost(served, seconds),
        )

    @router.get(
        "/explain/{name}",
        responses={**READ_ERRORS, 404: _error("no such pool, or no plan published yet")},
        tags=["pools"],
    )
    async def explain(
        name: Annotated[str, Path(max_length=255, description="a pool's name or its DNS name")],
    ) -> ExplanationOut:
        """Why a name answers as it does, from the published plan: every server of its pool
        with state, weight, TTL, pause and why it is or is not answered, and one answer of the
        plan's rotation per address family (what a client may get now: each pipe backend walks
        the rotation from a random place)."""
        return ExplanationOut.of(control.explain(name))

    @router.get("/history", responses={**READ_ERRORS, **NOT_FOUND}, tags=["manager"])
    async def history(
        pool: Annotated[str | None, Query(min_length=1, description="only this pool's")] = None,
        since: Annotated[
            float | None,
            Query(
                ge=0,
                le=1e11,
                allow_inf_nan=False,
                description="unix seconds: only samples after this (what a page already has)",
            ),
        ] = None,
    ) -> HistoryOut:
        """The last hour, oldest first: one sample per pool every few seconds (utilization,
        weight, TTL and pause per server; servers by state and cost per pool)."""
        return HistoryOut.of(control.history(pool=pool, since=since))

    return router
