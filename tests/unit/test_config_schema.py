"""The JSON Schema of configuration classes agrees with what the builder accepts and refuses;
the API's settings in the manager's configuration are checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from dnslb.config import json_schema, parse_config, to_document
from dnslb.errors import ConfigError
from manager.config import ManagerConfig, MemberConfig, PoolConfig, load_manager_config
from tests.api_support import CONFIG, write_config

POOL_SCHEMA = jsonschema_rs.Draft202012Validator(json_schema(PoolConfig))
MEMBER_SCHEMA = jsonschema_rs.Draft202012Validator(json_schema(MemberConfig))


def builds(document: dict[str, Any]) -> bool:
    try:
        parse_config(json.dumps(document), PoolConfig, source="pool")
    except ConfigError:
        return False
    return True


def test_configured_pools_are_valid_documents(tmp_path: Path) -> None:
    loaded = load_manager_config(write_config(tmp_path))
    assert len(loaded.config.pools) == 2
    for pool in loaded.config.pools:
        document = to_document(pool)
        assert POOL_SCHEMA.is_valid(document), list(POOL_SCHEMA.iter_errors(document))
        for member in document["members"]:
            assert MEMBER_SCHEMA.is_valid(member)


BASE: dict[str, Any] = {"name": "api", "zone": "example.test"}


@pytest.mark.parametrize(
    "document",
    [
        pytest.param({**BASE, "colour": "red"}, id="unknown-key"),
        pytest.param({"zone": "example.test"}, id="missing-name"),
        pytest.param({**BASE, "policy": {"k": 0}}, id="below-min"),
        pytest.param({**BASE, "policy": {"k": 65}}, id="above-max"),
        pytest.param({**BASE, "policy": {"k": "4"}}, id="string-for-int"),
        pytest.param({**BASE, "policy": {"th_over": True}}, id="bool-for-number"),
        pytest.param({**BASE, "policy": {"fallback": "sometimes"}}, id="enum"),
        pytest.param({**BASE, "name": ""}, id="empty-string"),
        pytest.param({**BASE, "members": {"id": "a"}}, id="mapping-for-list"),
        pytest.param(
            {**BASE, "members": [{"id": "a", "address": "10.0.0.1", "token": "x"}]},
            id="secret-by-value",
        ),
        pytest.param({**BASE, "health_check": {"port": 80}}, id="plugin-without-type"),
        pytest.param({**BASE, "health_check": {"type": "ftp"}}, id="unknown-plugin"),
        pytest.param({**BASE, "provider": {"type": "memory", "boot": 1}}, id="plugin-unknown-key"),
    ],
)
def test_what_the_schema_refuses_the_builder_refuses(document: dict[str, Any]) -> None:
    assert not POOL_SCHEMA.is_valid(document)
    assert not builds(document)


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(BASE, id="minimal"),
        pytest.param({**BASE, "policy": {"th_over": 1}}, id="int-for-number"),
        pytest.param({**BASE, "health_check": {"type": "tcp", "port": 80}}, id="plugin"),
        pytest.param({**BASE, "health_check": None}, id="null-optional"),
        pytest.param({**BASE, "provider": {"type": "static"}}, id="plugin-with-defaults"),
    ],
)
def test_what_the_schema_accepts_the_builder_builds(document: dict[str, Any]) -> None:
    assert POOL_SCHEMA.is_valid(document)
    assert builds(document)


def _manager_config(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "manager.yaml"
    path.write_text(text)
    for name in ("admin", "read", "agent"):
        (tmp_path / f"{name}.token").write_text(f"{name}-token\n")
    (tmp_path / "same.token").write_text("agent-token\n")
    try:
        load_manager_config(path)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param(
            ("file:read.token, role: read", "file:same.token, role: read"),
            "api_tokens[1].token: the same token as agent_token",
            id="agent-token-reused",
        ),
        pytest.param(
            ("file:read.token, role: read", "file:admin.token, role: read"),
            "api_tokens[1].token: the same token as api_tokens[0]",
            id="duplicate",
        ),
        pytest.param(("role: read", "role: write"), "role: must be one of read, admin", id="role"),
        pytest.param(
            ("cors_origins: []", 'cors_origins: ["*"]'), "cors_origins[0]", id="cors-star"
        ),
        pytest.param(
            ("cors_origins: []", 'cors_origins: ["https://ops.example.com/dash"]'),
            "is not an origin",
            id="cors-path",
        ),
        pytest.param(
            ("{id: s1, address: 10.0.0.1}", "{id: s1, address: 10.0.0.1, token: file:read.token}"),
            "is also the token of server 's1'",
            id="member-token-reused",
        ),
    ],
)
def test_api_settings_are_checked(tmp_path: Path, change: tuple[str, str], problem: str) -> None:
    text = CONFIG.replace("PORT", "8700").replace("TICK", "1").replace("CORS", "[]")
    text = text.replace("METRICS_PUBLIC", "false")
    assert _manager_config(tmp_path, text) == []
    old, new = change
    assert old in text
    problems = _manager_config(tmp_path, text.replace(old, new, 1))
    assert any(problem in found for found in problems), problems


def test_the_api_settings_have_safe_defaults() -> None:
    config = parse_config("zones: [{name: example.test, ns: [ns1.example.test]}]", ManagerConfig)
    assert config.auth.api_tokens == ()
    assert config.auth.metrics_public is False
    assert config.http.cors_origins == ()
    assert config.http.address == "127.0.0.1"
