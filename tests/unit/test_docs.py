"""The docs stay true: generated references are current, and examples load."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli.docgen import DOCS, stale_docs
from manager.config import load_manager_config
from manager.providers.userdata import DEFAULT_USER_DATA
from tests.tls_support import make_pki


def test_configuration_references_are_current() -> None:
    assert stale_docs() == [], "run: dnslb docs"


def _yaml_blocks(doc: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.DOTALL)


def test_the_manager_example_configuration_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNSLB_AGENT_TOKEN", "example")
    (tmp_path / "cache-3.token").write_text("example-3\n")
    [example] = _yaml_blocks(DOCS / "manager.md")
    path = tmp_path / "manager.yaml"
    path.write_text(example)
    loaded = load_manager_config(path)
    assert [pool.dns_name for pool in loaded.config.pools] == ["www.example.com"]


def _fenced(doc: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", doc.read_text(), re.DOTALL)


def test_the_cloud_example_configurations_load(tmp_path: Path) -> None:
    examples = [block for block in _yaml_blocks(DOCS / "cloud.md") if "zones:" in block]
    make_pki(tmp_path / "tls")  # the examples' tls: server.pem and server.key beside them
    kinds = []
    for number, example in enumerate(examples):
        path = tmp_path / f"manager-{number}.yaml"
        path.write_text(example)
        for pool in load_manager_config(path).config.pools:
            assert pool.provider is not None
            kinds.append(pool.provider.type)
    assert kinds == ["ec2", "ec2", "openstack"]


def test_the_cloud_docs_show_the_user_data_servers_really_get() -> None:
    script = _fenced(DOCS / "cloud.md", "sh")[0]  # the first: the default user data
    assert script == DEFAULT_USER_DATA


def test_the_iam_policy_and_clouds_yaml_examples_are_valid(tmp_path: Path) -> None:
    from openstack.config.loader import OpenStackConfig  # noqa: PLC0415 - slow to import

    [policy] = _fenced(DOCS / "cloud.md", "json")
    statements = json.loads(policy)["Statement"]
    actions = {statement["Action"] for statement in statements}
    assert actions == {
        "ec2:DescribeInstances",
        "ec2:RunInstances",
        "ec2:CreateTags",
        "ec2:TerminateInstances",
        "iam:PassRole",
    }
    [clouds] = [block for block in _yaml_blocks(DOCS / "cloud.md") if "clouds:" in block]
    path = tmp_path / "clouds.yaml"
    path.write_text(clouds)
    region = OpenStackConfig(config_files=[str(path)]).get_one("dnslb")
    assert region.config["auth_type"] == "v3applicationcredential"
    assert region.get_region_name() == "RegionOne"
