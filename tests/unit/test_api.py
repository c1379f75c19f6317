"""The REST API over HTTP (httpx, ASGI transport) in front of a real manager on a fake clock."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.app import create_app
from api.auth import ApiAuth
from api.dashboard import STATIC
from api.models import EventOut, PoolOut, ServerOut, StatsOut
from api.routes import MAX_BODY
from dnslb.control import ManagerStats, PoolView, ServerView
from dnslb.model import Event
from dnslb.plan import MemberState, parse_plan
from manager.config import load_manager_config
from manager.service import Manager
from tests.api_support import ADMIN, AGENT, READ, RUNTIME_POOL, ApiLab


def run(tmp_path: Path, scenario: Callable[[ApiLab], Awaitable[None]], **options: Any) -> None:
    async def main() -> None:
        lab = ApiLab(tmp_path, **options)
        try:
            await scenario(lab)
        finally:
            await lab.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("model", "view"),
    [
        pytest.param(ServerOut, ServerView, id="server"),
        pytest.param(PoolOut, PoolView, id="pool"),
        pytest.param(EventOut, Event, id="event"),
        pytest.param(StatsOut, ManagerStats, id="stats"),
    ],
)
def test_response_models_mirror_the_views(model: Any, view: Any) -> None:
    assert set(model.model_fields) == {field.name for field in dataclasses.fields(view)}


def test_views_over_http_match_the_manager(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.step(load=lambda server: 90 if server == "s3" else 20, seconds=3)
        async with lab.client(READ) as api:
            servers = (await api.get("/v1/servers", params={"pool": "www"})).json()
            assert {s["id"] for s in servers} == {"s1", "s2", "s3"}
            by_id = {s["id"]: s for s in servers}
            for server_id, server in by_id.items():
                view = lab.control.server(server_id)
                assert server["state"] == view.state.value == "active"
                assert server["weight"] == view.weight
                assert server["ttl"] == view.ttl
                assert server["cost_seconds"] == pytest.approx(view.cost_seconds)
            assert by_id["s1"]["utilization"] == pytest.approx(0.2)
            assert by_id["s3"]["paused"] is True and by_id["s3"]["weight"] is None
            assert by_id["s1"]["paused"] is False and by_id["s1"]["weight"] > 0

            pools = (await api.get("/v1/pools")).json()
            assert [p["name"] for p in pools] == ["www", "auto"]
            www = (await api.get("/v1/pools/www")).json()
            assert www["source"] == "config" and www["servers"] == {"active": 3}
            assert www["spec"]["members"][0]["id"] == "s1"
            assert www["mean_ttl"] == lab.control.pool("www").mean_ttl

            one = (await api.get("/v1/servers/s2")).json()
            assert one == by_id["s2"]

            status = (await api.get("/v1/status")).json()
            assert status["manager"]["ready"] is True
            assert status["paused"] == 1
            assert sum(status["servers"].values()) == len(lab.control.servers())

    run(tmp_path, scenario)


def test_plan_is_absent_until_published_then_served_whole(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(READ) as api:
            answer = await api.get("/v1/plan")
            assert answer.status_code == 404
            assert "no plan published yet" in answer.json()["error"]
            await lab.ready()
            answer = await api.get("/v1/plan")
            assert answer.status_code == 200
            body = answer.json()
            view = lab.control.plan()
            assert view is not None
            assert body["version"] == view.plan.version
            assert parse_plan(body["plan"]) == view.plan
            assert body["age"] == view.age and body["stale"] is False

    run(tmp_path, scenario)


def test_runtime_pools_are_created_changed_and_deleted(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(ADMIN) as api:
            created = await api.post("/v1/pools", json=RUNTIME_POOL)
            assert created.status_code == 201, created.text
            assert created.json()["dns_name"] == "rt.example.test"
            assert created.json()["source"] == "api"

            member = await api.post(
                "/v1/pools/rt/members", json={"id": "r2", "address": "10.1.0.2"}
            )
            assert member.status_code == 201, member.text
            assert member.json()["pool"] == "rt" and member.json()["state"] == "warming"
            await lab.step(seconds=2)
            assert {s["id"] for s in (await api.get("/v1/servers?pool=rt")).json()} == {
                "r1",
                "r2",
            }

            both = [*RUNTIME_POOL["members"], {"id": "r2", "address": "10.1.0.2"}]
            changed = await api.put(
                "/v1/pools/rt",
                json={"zone": "example.test", "policy": {"k": 2}, "members": both},
            )
            assert changed.status_code == 200, changed.text
            assert changed.json()["spec"]["policy"]["k"] == 2
            assert lab.control.pool("rt").spec["policy"]["k"] == 2

            removed = await api.delete("/v1/pools/rt/members/r2")
            assert removed.status_code == 204
            assert (await api.get("/v1/servers/r2")).status_code == 404

            assert (await api.delete("/v1/pools/rt")).status_code == 204
            assert (await api.get("/v1/pools/rt")).status_code == 404
            kinds = [e["kind"] for e in (await api.get("/v1/events?pool=rt")).json()["events"]]
            assert kinds[0] == "pool_deleted" and "pool_created" in kinds

    run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "fields"),
    [
        pytest.param(
            "POST",
            "/v1/pools",
            {"name": "x", "zone": "example.test", "members": [{"id": "x1", "address": "ten"}]},
            422,
            {"members[0].address"},
            id="bad-address",
        ),
        pytest.param(
            "POST",
            "/v1/pools",
            {"name": "x", "zone": "example.test", "policy": {"k": 0}, "colour": "red"},
            422,
            {"policy.k", "colour"},
            id="every-problem-at-once",
        ),
        pytest.param(
            "POST", "/v1/pools", {"name": "x", "zone": "example.org"}, 422, {"zone"}, id="zone"
        ),
        pytest.param(
            "POST",
            "/v1/pools",
            {"name": "x", "zone": "example.test", "members": [{"id": "s1", "address": "10.2.0.1"}]},
            422,
            {"members[0].id"},
            id="taken-server-id",
        ),
        pytest.param("POST", "/v1/pools", ["not", "an", "object"], 422, {"body"}, id="not-object"),
        pytest.param(
            "POST", "/v1/pools", {"name": "www", "zone": "example.test"}, 409, set(), id="exists"
        ),
        pytest.param("PUT", "/v1/pools/www", {"zone": "example.test"}, 409, set(), id="file-pool"),
        pytest.param(
            "PUT",
            "/v1/pools/rt",
            {"name": "other", "zone": "example.test"},
            422,
            {"name"},
            id="renamed",
        ),
        pytest.param("DELETE", "/v1/pools/www", None, 409, set(), id="delete-file-pool"),
        pytest.param("DELETE", "/v1/pools/nope", None, 404, set(), id="delete-unknown"),
        pytest.param("GET", "/v1/pools/nope", None, 404, set(), id="unknown-pool"),
        pytest.param("GET", "/v1/servers?pool=nope", None, 404, set(), id="unknown-pool-filter"),
        pytest.param("GET", "/v1/servers/nope", None, 404, set(), id="unknown-server"),
        pytest.param(
            "POST", "/v1/pools/rt/members", {"address": "10.1.0.9"}, 422, {"id"}, id="member-id"
        ),
        pytest.param(
            "DELETE", "/v1/pools/www/members/r1", None, 404, set(), id="member-of-another-pool"
        ),
        pytest.param(
            "DELETE", "/v1/pools/www/members/s1", None, 409, set(), id="member-of-file-pool"
        ),
        pytest.param(
            "POST", "/v1/servers/s1/actions", {"action": "explode"}, 422, {"action"}, id="action"
        ),
        pytest.param(
            "POST",
            "/v1/servers/s1/actions",
            {"action": "pause", "reason": "x" * 501},
            422,
            {"reason"},
            id="long-reason",
        ),
        pytest.param(
            "POST",
            "/v1/servers/s1/actions",
            {"action": "pause", "colour": 1},
            422,
            {"colour"},
            id="unknown-key",
        ),
        pytest.param(
            "POST", "/v1/servers/nope/actions", {"action": "pause"}, 404, set(), id="act-unknown"
        ),
        pytest.param(
            "POST", "/v1/servers/s1/actions", {"action": "enable"}, 409, set(), id="enable-active"
        ),
        pytest.param("GET", "/v1/events?limit=0", None, 422, {"limit"}, id="limit"),
        pytest.param("GET", "/v1/events?before_id=x", None, 422, {"before_id"}, id="before-id"),
        pytest.param(
            "GET", f"/v1/events?before_id={2**63}", None, 422, {"before_id"}, id="huge-id"
        ),
        pytest.param("PATCH", "/v1/pools/www", None, 405, set(), id="method"),
        # Integers are decimal digits: what the client sent is what the API understood.
        *(
            pytest.param("GET", f"/v1/events?{query}", None, 422, {field}, id=query)
            for query, field in [
                ("before_id=86400.0", "before_id"),
                ("before_id=1e3", "before_id"),
                ("before_id=+5", "before_id"),
                ("before_id=%205", "before_id"),
                ("before_id=5_0", "before_id"),
                ("limit=10.0", "limit"),
                ("limit=" + "9" * 5000, "limit"),
            ]
        ),
    ],
)
def test_bad_calls_get_clear_4xx_naming_the_fields(
    tmp_path: Path,
    method: str,
    path: str,
    body: Any,
    status: int,
    fields: set[str],
) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.control.create_pool(RUNTIME_POOL)
        await lab.step()
        async with lab.client(ADMIN) as api:
            answer = await api.request(method, path, json=body)
        assert answer.status_code == status, answer.text
        error = answer.json()
        assert error["error"]
        named = {problem["field"] for problem in error["problems"]}
        assert fields <= named, error

    run(tmp_path, scenario)


def test_malformed_and_oversized_bodies(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(ADMIN) as api:
            answer = await api.post("/v1/pools", content=b"{not json")
            assert answer.status_code == 422
            assert answer.json()["problems"] == [{"field": "body", "message": "not valid JSON"}]
            answer = await api.post("/v1/servers/s1/actions", content=b"{not json")
            assert answer.status_code == 422
            assert answer.json()["problems"][0]["field"] == "body"
            answer = await api.post("/v1/pools", content=b" " * (MAX_BODY + 1))
            assert answer.status_code == 413
            deep: Any = {}
            for _ in range(100):
                deep = {"a": deep}
            answer = await api.post("/v1/pools", json=deep)
            assert answer.status_code == 422

    run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("POST", "/v1/pools", id="create-pool"),
        pytest.param("PUT", "/v1/pools/rt", id="update-pool"),
        pytest.param("POST", "/v1/pools/rt/members", id="add-member"),
        pytest.param("POST", "/v1/servers/s1/actions", id="action"),
    ],
)
@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_every_body_is_capped(tmp_path: Path, method: str, path: str, chunked: bool) -> None:
    sent = [0]

    async def chunks() -> Any:
        for _ in range(100):
            sent[0] += 1
            yield b" " * 65536

    async def scenario(lab: ApiLab) -> None:
        await lab.control.create_pool(RUNTIME_POOL)
        async with lab.client(ADMIN) as api:
            body = chunks() if chunked else b" " * (MAX_BODY + 1)
            answer = await api.request(
                method, path, content=body, headers={"Content-Type": "application/json"}
            )
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"] == f"body larger than {MAX_BODY} bytes"
        assert answer.headers["connection"] == "close"
        assert sent[0] < 100  # not read to its end

    run(tmp_path, scenario)


DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 50_000 + b"1" + b"}" * 50_000


@pytest.mark.parametrize(
    ("method", "path", "token"),
    [
        pytest.param("POST", "/v1/pools", ADMIN, id="create-pool"),
        pytest.param("PUT", "/v1/pools/rt", ADMIN, id="update-pool"),
        pytest.param("POST", "/v1/pools/rt/members", ADMIN, id="add-member"),
        pytest.param("POST", "/v1/servers/s1/actions", ADMIN, id="action"),
        pytest.param("POST", "/v1/reports", AGENT, id="report"),
        pytest.param("POST", "/v1/reports", "not-a-token", id="report-unauthenticated"),
        pytest.param("POST", "/v1/pools", "not-a-token", id="pool-unauthenticated"),
    ],
)
@pytest.mark.parametrize("body", [DEEP, DEEP[:16_000], DEEP_OBJECT], ids=["deep", "16k", "object"])
def test_deep_json_gets_a_clean_4xx_and_no_traceback(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    token: str,
    body: bytes,
) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.control.create_pool(RUNTIME_POOL)
        async with lab.client(token) as api:
            answer = await api.request(
                method, path, content=body, headers={"Content-Type": "application/json"}
            )
        assert 400 <= answer.status_code < 500, answer.text
        assert answer.json()["error"]

    caplog.set_level(logging.DEBUG)
    run(tmp_path, scenario)
    assert not [record for record in caplog.records if record.exc_info], caplog.text
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


def hostile_views(lab: ApiLab, case: str) -> None:
    """Put values into the manager's views that no check should have let in, as a bug upstream
    (or a stats document a pipe backend wrote) might: the API must still answer."""
    manager = lab.manager
    s1 = manager.fleet.servers["s1"]
    assert s1.load is not None
    if case == "served":
        for server in manager.fleet.servers.values():
            server.served = 10**400
    elif case == "utilization":
        s1.load = dataclasses.replace(s1.load, utilization=10**400)
        manager.fleet.servers["s2"].load = dataclasses.replace(s1.load, utilization=math.nan)
        manager.fleet.servers["s3"].load = dataclasses.replace(s1.load, utilization=math.inf)
    elif case == "answers":
        counts: dict[str, Any] = {"s1": ("x", 1e400), "s2": (1, 10**400), "s3": [None, "y"]}
        manager.answer_counts = lambda: counts  # type: ignore[method-assign,assignment]
    elif case == "stats":
        manager.ingest.counts["accepted"] = 10**400
        manager.tick_seconds = math.nan
        manager.tick_errors = 10**30
    elif case == "text":
        s1.record = dataclasses.replace(s1.record, state_reason="lone \ud800 surrogate")


@pytest.mark.parametrize("case", ["served", "utilization", "answers", "stats", "text"])
def test_odd_values_in_the_views_never_make_a_500(tmp_path: Path, case: str) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        hostile_views(lab, case)
        async with lab.client(READ) as api:
            for path in ("/v1/status", "/v1/servers", "/v1/servers/s1", "/v1/pools", "/v1/costs"):
                answer = await api.get(path)
                assert answer.status_code == 200, (path, answer.text)
                json.loads(answer.content)  # strict JSON: no NaN, no Infinity
            metrics = await api.get("/metrics")
            assert metrics.status_code == 200, metrics.text
            metrics.content.decode("utf-8")
            server = (await api.get("/v1/servers/s1")).json()
            costs = (await api.get("/v1/costs")).json()
            status = (await api.get("/v1/status")).json()
        if case == "served":
            assert server["served"] == 2**63 - 1  # clamped to what JSON readers keep
            assert costs["served"] == 2**63 - 1
            assert "dnslb_server_served_requests_total{" in metrics.text
            assert "+Inf" in metrics.text
        if case == "utilization":
            assert server["utilization"] == sys.float_info.max
        if case == "stats":
            assert status["manager"]["reports"]["accepted"] == 2**63 - 1
        if case == "text":
            assert server["state_reason"] == "lone \ufffd surrogate"

    run(tmp_path, scenario)


def test_admin_actions_change_the_next_plan(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()

        def answered() -> dict[str, MemberState]:
            assert lab.manager.plan is not None
            [pool] = [p for p in lab.manager.plan.pools if p.name == "www.example.test"]
            return {member.id: member.state for member in pool.members}

        async with lab.client(ADMIN) as api:

            async def act(server: str, action: str, reason: str = "") -> dict[str, Any]:
                answer = await api.post(
                    f"/v1/servers/{server}/actions", json={"action": action, "reason": reason}
                )
                assert answer.status_code == 200, answer.text
                return dict(answer.json())

            assert (await act("s1", "pause", "maintenance"))["admin_paused"] is True
            await lab.step()
            assert answered()["s1"] is MemberState.PAUSED
            assert (await act("s1", "resume"))["admin_paused"] is False
            await lab.step()
            assert answered()["s1"] is MemberState.ACTIVE
            assert (await act("s2", "disable", "bad disk"))["state"] == "disabled"
            await lab.step()
            assert answered()["s2"] is MemberState.DISABLED
            assert (await act("s2", "enable"))["state"] == "warming"
            await lab.step()
            assert answered()["s2"] is MemberState.ACTIVE
            assert (await act("s3", "drain", "retire"))["state"] == "draining"
            events = (await api.get("/v1/events", params={"server": "s2"})).json()["events"]
            assert any("operator: bad disk" in e["reason"] for e in events if e["kind"] == "state")
            changes = [
                (e["from_state"], e["to_state"]) for e in reversed(events) if e["kind"] == "state"
            ]
            assert ("active", "disabled") in changes and ("disabled", "warming") in changes
            others = [e for e in events if e["kind"] != "state"]
            assert others and all(e["from_state"] is e["to_state"] is None for e in others)

    run(tmp_path, scenario)


def test_events_are_filtered_and_paginated(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.step(load=10, seconds=2)
        for _ in range(3):
            await lab.step(load=lambda server: 95 if server == "s1" else 10)  # s1 paused
            await lab.step(load=10, seconds=30)  # and resumed, for pause_dwell (30 s) at least
        every = lab.control.events(limit=1000)
        async with lab.client(READ) as api:
            seen: list[int] = []
            before: int | None = None
            while True:
                params: dict[str, Any] = {"limit": 4}
                if before is not None:
                    params["before_id"] = before
                page = (await api.get("/v1/events", params=params)).json()
                seen += [event["id"] for event in page["events"]]
                before = page["next_before_id"]
                if before is None:
                    break
            assert seen == [event.id for event in every]
            assert seen == sorted(seen, reverse=True)

            kinds = ["paused", "resumed"]
            page = (await api.get("/v1/events", params={"kind": kinds, "server": "s1"})).json()
            got = page["events"]
            assert [e["kind"] for e in got] == ["resumed", "paused"] * 3
            assert {e["server"] for e in got} == {"s1"}
            assert page["next_before_id"] is None
            scaled = (await api.get("/v1/events", params={"pool": "www"})).json()["events"]
            assert scaled and {e["pool"] for e in scaled} == {"www"}

    run(tmp_path, scenario)


def test_costs_per_pool_and_server(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.step(seconds=5)
        async with lab.client(READ) as api:
            report = (await api.get("/v1/costs")).json()
            only = (await api.get("/v1/costs", params={"pool": "www"})).json()
            assert (await api.get("/v1/costs", params={"pool": "nope"})).status_code == 404
        pools = {pool["pool"]: pool for pool in report["pools"]}
        assert set(pools) == {"www", "auto"}
        assert only["pools"] == [pools["www"]]
        www = pools["www"]
        view = lab.control.pool("www")
        assert www["server_seconds"] == pytest.approx(view.cost_seconds)
        assert www["served"] == view.served > 0
        assert www["requests_per_cost"] == pytest.approx(view.served / view.cost_seconds)
        assert sum(s["server_seconds"] for s in www["servers"]) == pytest.approx(
            www["server_seconds"]
        )
        assert report["server_seconds"] == pytest.approx(
            sum(p["server_seconds"] for p in report["pools"])
        )

    run(tmp_path, scenario)


def test_health_and_readiness_need_no_token(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(None) as api:
            assert (await api.get("/healthz")).status_code == 200
            assert (await api.get("/readyz")).status_code == 503
            await lab.ready()
            assert (await api.get("/readyz")).json() == {"ready": True}

    run(tmp_path, scenario)


def test_scale_events_show_in_pools(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.step(load=10, seconds=2)
        await lab.step(load=95, seconds=6)
        async with lab.client(READ) as api:
            auto = (await api.get("/v1/pools/auto")).json()
            events = (await api.get("/v1/events", params={"kind": "scale_out"})).json()["events"]
        assert auto["provider"] == "memory"
        assert auto["scale_events"] == len(events) > 0
        assert sum(auto["servers"].values()) > 1

    run(tmp_path, scenario)


def test_no_token_reaches_the_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def scenario(lab: ApiLab) -> None:
        await lab.step()
        for token in (ADMIN, READ, AGENT, "guessed-token-xyz"):
            async with lab.client(token) as api:
                await api.get("/v1/servers")
                await api.post("/v1/servers/s1/actions", json={"action": "pause"})
                await api.post("/v1/pools", json={"name": "z", "zone": "nowhere"})

    run(tmp_path, scenario)
    assert caplog.records  # the run logged something, so the check below means something
    text = "\n".join(record.getMessage() for record in caplog.records)
    for token in (ADMIN, READ, AGENT, "guessed-token-xyz"):
        assert token not in text


def test_cors_is_off_unless_origins_are_configured(tmp_path: Path) -> None:
    preflight = {
        "Origin": "https://ops.example.com",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }

    async def off(lab: ApiLab) -> None:
        async with lab.client(READ) as api:
            answer = await api.get("/v1/pools", headers={"Origin": "https://ops.example.com"})
            assert answer.status_code == 200
            assert "access-control-allow-origin" not in answer.headers
            answer = await api.options("/v1/pools", headers=preflight)
            assert "access-control-allow-origin" not in answer.headers

    run(tmp_path / "off", off)

    async def on(lab: ApiLab) -> None:
        async with lab.client(READ) as api:
            answer = await api.options("/v1/pools", headers=preflight)
            assert answer.status_code == 200
            assert answer.headers["access-control-allow-origin"] == "https://ops.example.com"
            answer = await api.get("/v1/pools", headers={"Origin": "https://evil.example.net"})
            assert "access-control-allow-origin" not in answer.headers

    run(tmp_path / "on", on, cors=["https://ops.example.com"])


def test_the_dashboard_is_served_whole_from_here(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(None) as api:
            root = await api.get("/")
            assert root.status_code == 307 and root.headers["location"] == "/dashboard/"
            page = await api.get("/dashboard/")
            assert page.status_code == 200
            policy = page.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "connect-src 'self'" in policy
            for name in ("dashboard.js", "dashboard.css"):
                assert (await api.get(f"/dashboard/{name}")).status_code == 200
            chart = await api.get("/dashboard/vendor/chart.umd.js")
            assert chart.status_code == 200
            assert chart.headers["content-type"].startswith("text/javascript")
            assert "Chart" in chart.text
            assert (await api.get("/dashboard/..%2Froutes.py")).status_code == 404
            assert (await api.get("/dashboard/app.py")).status_code == 404
        for file in (STATIC / "index.html", STATIC / "dashboard.js"):
            assert "//" not in re.sub(r"(?m)^\s*//.*$|(?<=[\s;])//.*$", "", file.read_text()), (
                f"{file.name} refers to another host"
            )

    run(tmp_path, scenario)


def test_a_missing_chart_library_is_explained(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        app = create_app(
            lab.control,
            auth=ApiAuth(),
            chart_library=tmp_path / "node_modules" / "chart.js" / "dist" / "chart.umd.min.js",
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as api:
            answer = await api.get("/dashboard/vendor/chart.umd.js")
        assert answer.status_code == 404
        assert "reinstall dnslb" in answer.json()["error"]

    run(tmp_path, scenario)


def test_the_package_ships_the_chart_library_its_readme_names() -> None:
    # A pip install used to miss it (it came from npm into a checkout's node_modules/).
    readme = (STATIC / "vendor" / "README.md").read_text()
    [version] = re.findall(r"\| `chart.umd.min.js` \| [^|]+ \| ([0-9.]+) \|", readme)
    banner = (STATIC / "vendor" / "chart.umd.min.js").read_text()[:200]
    assert f"Chart.js v{version}" in banner
    assert (STATIC / "vendor" / "chart.js-LICENSE.md").is_file()
    pyproject = (STATIC.parent.parent / "pyproject.toml").read_text()
    assert '"static/vendor/*"' in pyproject  # package data: in the wheel


def test_the_openapi_document_states_auth_and_the_pool_schema(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(None) as api:
            refused = await api.get("/openapi.json")  # it lists every path: not for everyone
            assert refused.status_code == 401
            assert "paths" not in refused.text
        async with lab.client(READ) as api:
            document = (await api.get("/openapi.json")).json()
        assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                assert operation.get("security") == [{"bearer": []}], (method, path)
        create = document["paths"]["/v1/pools"]["post"]["requestBody"]["content"]
        schema = create["application/json"]["schema"]
        assert schema["additionalProperties"] is False
        assert {"name", "zone"} <= set(schema["required"])
        assert schema["properties"]["policy"]["properties"]["k"]["maximum"] == 64
        put = document["paths"]["/v1/pools/{name}"]["put"]["requestBody"]["content"]
        assert "name" not in put["application/json"]["schema"]["required"]

    run(tmp_path, scenario)


def test_text_beyond_the_basic_plane_survives_and_lone_surrogates_are_refused(
    tmp_path: Path,
) -> None:
    member = "srv-\U00010000"  # sent as the escaped surrogate pair \ud800\udc00

    async def scenario(lab: ApiLab) -> None:
        async with lab.client(ADMIN) as api:
            body = {**RUNTIME_POOL, "members": [{"id": member, "address": "10.1.0.9"}]}
            created = await api.post(
                "/v1/pools", content=json.dumps(body), headers={"Content-Type": "application/json"}
            )
            assert created.status_code == 201, created.text
            assert created.json()["spec"]["members"][0]["id"] == member
            lone = b'{"name": "x\\ud800", "zone": "example.test"}'
            refused = await api.post("/v1/pools", content=lone)
            assert refused.status_code == 422
            assert refused.json()["problems"][0]["field"] == "body"
        await lab.close()
        lab.manager = Manager(load_manager_config(lab.path), clock=lab.clock)  # a restart
        assert lab.manager.fleet.servers[member].record.pool == "rt"

    run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        pytest.param("pol=www", "pol", "unknown parameter", id="misspelt"),
        pytest.param("pool=www&pool=auto", "pool", "given more than once", id="repeated"),
    ],
)
def test_query_parameters_are_checked(tmp_path: Path, query: str, field: str, message: str) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(READ) as api:
            answer = await api.get(f"/v1/events?{query}")
            assert answer.status_code == 422
            assert answer.json()["problems"] == [
                {"field": field, "message": f"query parameter: {message}"}
            ]
            repeated = await api.get("/v1/events?kind=paused&kind=resumed")
            assert repeated.status_code == 200  # kind is a list: repeating it is how

    run(tmp_path, scenario)
