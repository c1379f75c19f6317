"""``GET /v1/explain`` and ``GET /v1/history`` over HTTP, in front of a manager on a fake clock."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from api.models import (
    AnswerExampleOut,
    ExplanationOut,
    HistoryOut,
    MemberExplanationOut,
    PoolSampleOut,
    ServerSampleOut,
)
from dnslb.control import (
    AnswerExample,
    Explanation,
    History,
    MemberExplanation,
    PoolSample,
    ServerSample,
)
from tests.api_support import ADMIN, READ, ApiLab
from tests.unit.test_api import run


@pytest.mark.parametrize(
    ("model", "view"),
    [
        pytest.param(ExplanationOut, Explanation, id="explanation"),
        pytest.param(MemberExplanationOut, MemberExplanation, id="member"),
        pytest.param(AnswerExampleOut, AnswerExample, id="answer"),
        pytest.param(HistoryOut, History, id="history"),
        pytest.param(PoolSampleOut, PoolSample, id="pool-sample"),
        pytest.param(ServerSampleOut, ServerSample, id="server-sample"),
    ],
)
def test_response_models_mirror_the_views(model: Any, view: Any) -> None:
    assert set(model.model_fields) == {field.name for field in dataclasses.fields(view)}


def test_explain_a_name(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        async with lab.client(READ) as api:
            early = await api.get("/v1/explain/www")
            assert early.status_code == 404 and "no plan published yet" in early.json()["error"]
            await lab.ready()
            await lab.step(load=lambda server: 95 if server == "s3" else 20, seconds=2)
            answer = await api.get("/v1/explain/WWW.example.test.")
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body == ExplanationOut.of(lab.control.explain("www")).model_dump(mode="json")
            assert (body["name"], body["pool"], body["k"]) == ("www.example.test", "www", 2)
            members = {member["id"]: member for member in body["members"]}
            assert members["s3"]["paused"] and not members["s3"]["in_answers"]
            assert members["s3"]["why"].startswith("paused by the policy: utilization 0.95")
            assert members["s1"]["in_answers"] and members["s1"]["answer_share"] == 1.0
            [example] = body["answers"]
            assert example["family"] == "A" and set(example["members"]) == {"s1", "s2"}

            servers = (await api.get("/v1/servers", params={"pool": "www"})).json()
            assert {s["id"]: s["why"] for s in servers} == {
                m["id"]: m["why"] for m in body["members"]
            }

            missing = await api.get("/v1/explain/nope.example.test")
            assert missing.status_code == 404
            assert "no pool named 'nope.example.test'" in missing.json()["error"]
            assert (await api.get("/v1/explain/")).status_code == 404
            assert (await api.get("/v1/explain/www?name=www")).status_code == 422
            assert (await api.get("/v1/explain/" + "x" * 256)).status_code == 422

    run(tmp_path, scenario)


def test_history_then_since(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        await lab.step(seconds=16)
        async with lab.client(READ) as api:
            answer = await api.get("/v1/history")
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert (body["resolution"], body["retention"]) == (5.0, 3600.0)
            samples = body["samples"]
            assert {s["pool"] for s in samples} == {"www", "auto"}
            assert [s["time"] for s in samples] == sorted(s["time"] for s in samples)
            www = [s for s in samples if s["pool"] == "www"]
            assert {m["id"] for m in www[-1]["members"]} == {"s1", "s2", "s3"}
            assert www[-1]["servers"] == {"active": 3}

            since = www[-2]["time"]
            newer = (await api.get("/v1/history", params={"pool": "www", "since": since})).json()
            assert newer["samples"] == [www[-1]]
            assert (await api.get("/v1/history", params={"pool": "nope"})).status_code == 404
            for value in ("nan", "inf", "-1", "1e12", "soon"):
                refused = await api.get("/v1/history", params={"since": value})
                assert refused.status_code == 422, (value, refused.text)
                assert refused.json()["problems"][0]["field"] == "since"
            json.loads(answer.content)  # strict JSON

    run(tmp_path, scenario)


def test_a_read_token_is_enough_and_none_is_refused(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        async with lab.client(None) as anonymous:
            for path in ("/v1/explain/www", "/v1/history"):
                assert (await anonymous.get(path)).status_code == 401
        async with lab.client(ADMIN) as admin:
            assert (await admin.get("/v1/explain/www")).status_code == 200

    run(tmp_path, scenario)
