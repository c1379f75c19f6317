"""``/metrics``: the Prometheus text format, figures true to the manager's views."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from api.auth import ApiAuth, Role
from dnslb.control import AdminAction, ServerView
from dnslb.model import ServerState
from manager.control import Control
from tests.api_support import READ, ApiLab, bearer

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), sample.value))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    [found] = [v for found_labels, v in samples[name] if found_labels == labels]
    return found


async def scrape(lab: ApiLab) -> Samples:
    async with lab.client(READ) as api:
        answer = await api.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(answer.text)


def test_metrics_follow_the_views(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        await lab.step(load=lambda server: 95 if server == "s3" else 30, seconds=2)
        await lab.control.act("s2", AdminAction.PAUSE, "metrics test")
        await lab.step(load=lambda server: 95 if server == "s3" else 30)
        samples = await scrape(lab)

        for server in lab.control.servers():
            labels = {"pool": server.pool, "server": server.id}
            assert value(samples, "dnslb_server_cost_seconds_total", **labels) == pytest.approx(
                server.cost_seconds
            )
            assert value(samples, "dnslb_server_served_requests_total", **labels) == server.served
            states = {
                found["state"]: v
                for found, v in samples["dnslb_server_state"]
                if found["server"] == server.id
            }
            assert states == {s.value: float(s is server.state) for s in ServerState}
            assert server.utilization is not None
            assert value(samples, "dnslb_server_utilization", **labels) == pytest.approx(
                server.utilization
            )
        policy = {"pool": "www", "server": "s3", "by": "policy"}
        operator = {"pool": "www", "server": "s2", "by": "operator"}
        assert value(samples, "dnslb_server_paused", **policy) == 1
        assert value(samples, "dnslb_server_paused", **operator) == 1
        assert value(samples, "dnslb_server_paused", **{**policy, "server": "s1"}) == 0

        # Only answered servers have a weight; shares in a pool add up to one.
        answered = {labels["server"] for labels, _ in samples["dnslb_server_weight"]}
        assert answered == {s.id for s in lab.control.servers() if s.weight is not None}
        assert "s3" not in answered and "s1" in answered
        shares: dict[str, float] = defaultdict(float)
        for labels, share in samples["dnslb_server_intended_share"]:
            shares[labels["pool"]] += share
        assert shares == {"www": pytest.approx(1.0), "auto": pytest.approx(1.0)}
        # What each server carries of its pool's load (paused ones too: their clients are still
        # leaving them), as the views say it; the share correction's factor likewise.
        delivered: dict[str, float] = defaultdict(float)
        for labels, share in samples["dnslb_server_delivered_share"]:
            delivered[labels["pool"]] += share
        assert delivered == {"www": pytest.approx(1.0), "auto": pytest.approx(1.0)}
        for server in lab.control.servers("www"):
            assert server.delivered_share is not None
            assert value(
                samples, "dnslb_server_delivered_share", pool="www", server=server.id
            ) == pytest.approx(server.delivered_share)
        assert value(samples, "dnslb_server_delivered_share", pool="www", server="s3") > 0.5
        corrections = {
            labels["server"]: factor
            for labels, factor in samples["dnslb_server_share_correction"]
            if labels["pool"] == "www"
        }
        assert corrections == {
            server.id: pytest.approx(server.share_correction)
            for server in lab.control.servers("www")
        }
        assert set(corrections) == {"s1", "s2", "s3"}
        counted = {labels["server"]: v for labels, v in samples["dnslb_server_answers_total"]}
        assert counted == {s.id: s.answers for s in lab.control.servers() if s.answers is not None}

        www = lab.control.pool("www")
        assert value(samples, "dnslb_pool_servers", pool="www", state="active") == 3
        assert value(samples, "dnslb_pool_servers", pool="www", state="down") == 0
        assert value(samples, "dnslb_pool_mean_ttl_seconds", pool="www") == www.mean_ttl
        assert value(samples, "dnslb_pool_cost_seconds_total", pool="www") == pytest.approx(
            www.cost_seconds
        )
        stats = lab.control.stats()
        assert value(samples, "dnslb_plan_version") == stats.plan_version
        assert value(samples, "dnslb_manager_ready") == 1
        assert (
            value(samples, "dnslb_manager_reports_total", outcome="accepted")
            == (stats.reports["accepted"])
        )
        assert value(samples, "dnslb_manager_tick_errors_total") == 0

    asyncio.run(_with_lab(tmp_path, scenario))


def test_scale_events_are_counted_per_pool(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        await lab.step(load=95, seconds=6)
        samples = await scrape(lab)
        scaled = value(samples, "dnslb_pool_scale_events_total", pool="auto")
        assert scaled == lab.control.pool("auto").scale_events > 0
        launched = sum(v for labels, v in samples["dnslb_pool_servers"] if labels["pool"] == "auto")
        assert launched == sum(lab.control.pool("auto").servers.values()) > 1

    asyncio.run(_with_lab(tmp_path, scenario))


class CountingControl(Control):
    """The manager's control, with answer counts as the pipe backends would report them."""

    def __init__(self, control: Control, answers: dict[str, int]) -> None:
        super().__init__(control.manager)
        self.answers = answers

    def servers(self, pool: str | None = None) -> Sequence[ServerView]:
        return [
            dataclasses.replace(view, answers=self.answers.get(view.id))
            for view in super().servers(pool)
        ]


def test_answers_are_exported_when_the_manager_has_them(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        control = CountingControl(lab.control, {"s1": 40, "s2": 7})
        app = create_app(control, auth=ApiAuth.from_tokens([(READ, Role.READ)]))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as api:
            answer = await api.get("/metrics", headers=bearer(READ))
        samples = parse(answer.text)
        counted = {labels["server"]: v for labels, v in samples["dnslb_server_answers_total"]}
        assert counted == {"s1": 40, "s2": 7}

    asyncio.run(_with_lab(tmp_path, scenario))


async def _with_lab(tmp_path: Path, scenario: Any) -> None:
    lab = ApiLab(tmp_path)
    try:
        await scenario(lab)
    finally:
        await lab.close()
