"""Who may call what: every route of the app's route table, with no token, the wrong token or
role, and the right role. The cases come from the route table itself, so a new route cannot be
left out: a mutating route without an example here fails the suite."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from api.app import create_app
from api.auth import ApiAuth, Role
from dnslb.control import ManagerControl
from tests.api_support import ADMIN, AGENT, READ, RUNTIME_POOL, ApiLab


def api_routes(routes: Sequence[BaseRoute]) -> Iterator[APIRoute]:
    """Every APIRoute, including those of included routers (FastAPI nests them)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from api_routes(included.routes)


def route_table() -> list[tuple[str, str]]:
    """(method, path) of every route the API serves, from the app itself."""
    app = create_app(cast(ManagerControl, object()), auth=ApiAuth())
    return sorted(
        (method, route.path) for route in api_routes(app.routes) for method in route.methods or ()
    )


ROUTES = route_table()
MUTATING = [(m, p) for m, p in ROUTES if m not in ("GET", "HEAD")]
READING = [(m, p) for m, p in ROUTES if m == "GET" and (p.startswith("/v1/") or p == "/metrics")]
PUBLIC = [(m, p) for m, p in ROUTES if (m, p) not in MUTATING and (m, p) not in READING]


# Each mutating route: a request that succeeds for an admin (path, body, status). The lab has
# pool "rt" (created at runtime, member r1) and the file's pools www (s1, s2, s3) and auto.
CHANGES: dict[tuple[str, str], tuple[str, Any, int]] = {
    ("POST", "/v1/pools"): (
        "/v1/pools",
        {"name": "api", "zone": "example.test", "members": [{"id": "a1", "address": "10.2.0.1"}]},
        201,
    ),
    ("PUT", "/v1/pools/{name}"): (
        "/v1/pools/rt",
        {**RUNTIME_POOL, "policy": {"k": 3}},
        200,
    ),
    ("DELETE", "/v1/pools/{name}"): ("/v1/pools/rt", None, 204),
    ("POST", "/v1/pools/{name}/members"): (
        "/v1/pools/rt/members",
        {"id": "r2", "address": "10.1.0.2"},
        201,
    ),
    ("DELETE", "/v1/pools/{name}/members/{server_id}"): ("/v1/pools/rt/members/r1", None, 204),
    ("POST", "/v1/servers/{server_id}/actions"): (
        "/v1/servers/s1/actions",
        {"action": "pause", "reason": "auth test"},
        200,
    ),
}

PATH_VALUES = {"{name}": "www", "{server_id}": "s1"}


def concrete(path: str) -> str:
    for template, value in PATH_VALUES.items():
        path = path.replace(template, value)
    return path


def run(tmp_path: Path, scenario: Callable[[ApiLab], Awaitable[None]]) -> None:
    async def main() -> None:
        lab = ApiLab(tmp_path)
        try:
            await lab.control.create_pool(RUNTIME_POOL)
            await lab.ready()
            await scenario(lab)
        finally:
            await lab.close()

    asyncio.run(main())


def snapshot(lab: ApiLab) -> Any:
    """What a change would alter: pools, servers' states and flags, the event log."""
    return (
        [(pool.name, dict(pool.spec)) for pool in lab.control.pools()],
        [(s.id, s.state, s.admin_paused) for s in lab.control.servers()],
        [event.id for event in lab.control.events(limit=1000)],
    )


def test_the_route_table_is_what_the_matrix_covers() -> None:
    assert MUTATING, "no mutating routes found: the route table is not read right"
    missing = sorted(set(MUTATING) - set(CHANGES))
    assert not missing, f"mutating routes without an auth-matrix example: {missing}"
    assert not set(CHANGES) - set(MUTATING), "examples for routes that no longer exist"
    assert ("GET", "/v1/servers") in READING and ("GET", "/metrics") in READING


REFUSED = [
    pytest.param(None, 401, id="no-token"),
    pytest.param("not-a-token", 401, id="unknown-token"),
    pytest.param(AGENT, 401, id="agent-token"),
    pytest.param(READ, 403, id="read-role"),
]


@pytest.mark.parametrize(("method", "route"), MUTATING, ids=[f"{m} {p}" for m, p in MUTATING])
@pytest.mark.parametrize(("token", "status"), REFUSED)
def test_changes_are_refused_without_the_admin_role(
    tmp_path: Path, method: str, route: str, token: str | None, status: int
) -> None:
    path, body, _ = CHANGES[(method, route)]

    async def scenario(lab: ApiLab) -> None:
        before = snapshot(lab)
        async with lab.client(token) as api:
            answer = await api.request(method, path, json=body)
        assert answer.status_code == status
        error = answer.json()["error"]
        assert ("admin" in error) if status == 403 else ("token" in error)
        if status == 401:
            assert answer.headers["www-authenticate"].startswith("Bearer")
        assert snapshot(lab) == before, "a refused request changed something"

    run(tmp_path, scenario)


@pytest.mark.parametrize(("method", "route"), MUTATING, ids=[f"{m} {p}" for m, p in MUTATING])
def test_changes_are_carried_out_for_the_admin_role(
    tmp_path: Path, method: str, route: str
) -> None:
    path, body, status = CHANGES[(method, route)]

    async def scenario(lab: ApiLab) -> None:
        before = snapshot(lab)
        async with lab.client(ADMIN) as api:
            answer = await api.request(method, path, json=body)
        assert answer.status_code == status, answer.text
        assert snapshot(lab) != before, "the change left no trace"

    run(tmp_path, scenario)


@pytest.mark.parametrize(("method", "route"), READING, ids=[f"{m} {p}" for m, p in READING])
@pytest.mark.parametrize(
    ("token", "status"),
    [
        pytest.param(None, 401, id="no-token"),
        pytest.param("not-a-token", 401, id="unknown-token"),
        pytest.param(AGENT, 401, id="agent-token"),
        pytest.param(READ, 200, id="read-role"),
        pytest.param(ADMIN, 200, id="admin-role"),
    ],
)
def test_reading_needs_a_read_or_admin_token(
    tmp_path: Path, method: str, route: str, token: str | None, status: int
) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(token) as api:
            answer = await api.request(method, concrete(route))
        assert answer.status_code == status, answer.text

    run(tmp_path, scenario)


@pytest.mark.parametrize(("method", "route"), PUBLIC, ids=[f"{m} {p}" for m, p in PUBLIC])
def test_public_routes_hold_no_data(tmp_path: Path, method: str, route: str) -> None:
    """Without a token: the dashboard's static files and the schema, never a view."""

    async def scenario(lab: ApiLab) -> None:
        async with lab.client(None) as api:
            answer = await api.request(method, concrete(route).replace("{name}", "index.html"))
        assert answer.status_code in (200, 307, 404), answer.text
        for server in lab.control.servers():
            assert server.address not in answer.text

    assert route == "/" or route.startswith(("/dashboard", "/openapi"))
    run(tmp_path, scenario)


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("Basic " + ADMIN, id="basic-scheme"),
        pytest.param("Bearer", id="bearer-without-token"),
        pytest.param("Bearer ", id="bearer-empty"),
        pytest.param(ADMIN, id="no-scheme"),
        pytest.param("Bearer " + ADMIN + "x", id="longer"),
        pytest.param("Bearer " + ADMIN[:-1], id="shorter"),
    ],
)
def test_malformed_authorization_is_401(tmp_path: Path, header: str) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(None) as api:
            answer = await api.get("/v1/servers", headers={"Authorization": header})
        assert answer.status_code == 401

    run(tmp_path, scenario)


def test_scheme_is_case_insensitive(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(None) as api:
            answer = await api.get("/v1/servers", headers={"Authorization": f"bearer {READ}"})
        assert answer.status_code == 200

    run(tmp_path, scenario)


def test_unknown_paths_need_a_token_too(tmp_path: Path) -> None:
    """A caller without a token cannot tell which paths exist."""

    async def scenario(lab: ApiLab) -> None:
        async with lab.client(None) as api:
            assert (await api.get("/v1/no-such-thing")).status_code == 401
            assert (await api.get("/admin")).status_code == 401
            assert (await api.post("/v1/pools", content=b"{broken")).status_code == 401
        async with lab.client(READ) as api:
            assert (await api.get("/v1/no-such-thing")).status_code == 404

    run(tmp_path, scenario)


def test_metrics_can_be_made_public(tmp_path: Path) -> None:
    async def main() -> None:
        lab = ApiLab(tmp_path, metrics_public=True)
        try:
            async with lab.client(None) as api:
                assert (await api.get("/metrics")).status_code == 200
                assert (await api.get("/v1/servers")).status_code == 401
        finally:
            await lab.close()

    asyncio.run(main())


def test_roles_and_token_lookup() -> None:
    auth = ApiAuth.from_tokens([("a", Role.ADMIN), ("r", "read")])
    assert auth.role_of("a") is Role.ADMIN
    assert auth.role_of("r") is Role.READ
    assert auth.role_of("x") is None
    assert all(len(stored) == 64 and stored not in ("a", "r") for stored, _ in auth.hashes)
    assert Role.ADMIN.allows(Role.READ) and not Role.READ.allows(Role.ADMIN)
