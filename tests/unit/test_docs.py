"""The docs stay true: generated references are current, and examples load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dnslb.docgen import DOCS, stale_docs
from manager.config import load_manager_config


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
