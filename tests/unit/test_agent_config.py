"""The agent's configuration file: what it accepts, what it refuses (with file and line), and
writing one back (as the local provider does)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from dnslb.agent_config import (
    AgentConfig,
    JsonSourceConfig,
    NginxSourceConfig,
    PortSourceConfig,
)
from dnslb.config import dump_config, load_config, parse_config, resolve_secret
from dnslb.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent.yaml"


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "agent.token").write_text("s3cret\n")
    path = tmp_path / "agent.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_minimal_file_takes_the_defaults(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            """\
            server_id: cache-1
            manager_url: http://127.0.0.1:8000/
            token: file:agent.token
            source: {type: nginx, max_concurrency: 200}
            """,
        ),
        AgentConfig,
    )
    assert config.token.reveal() == "s3cret"
    assert config.reports_url == "http://127.0.0.1:8000/v1/reports"
    assert (config.interval, config.backoff_cap, config.manager_timeout) == (1.0, 10.0, 2.0)
    assert config.source == NginxSourceConfig(max_concurrency=200)
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "{type: port, port: 8080, max_concurrency: 50}",
            PortSourceConfig(port=8080, max_concurrency=50),
        ),
        (
            "{type: json, url: 'http://127.0.0.1:9000/load'}",
            JsonSourceConfig(url="http://127.0.0.1:9000/load"),
        ),
        (
            "{type: nginx, url: 'http://127.0.1.2:8080/s', max_concurrency: 9, timeout: 0.2}",
            NginxSourceConfig(url="http://127.0.1.2:8080/s", max_concurrency=9, timeout=0.2),
        ),
    ],
    ids=["port", "json", "nginx"],
)
def test_each_source_type(tmp_path: Path, source: str, expected: object) -> None:
    text = f"server_id: a\nmanager_url: https://m\ntoken: file:agent.token\nsource: {source}\n"
    assert load_config(write(tmp_path, text), AgentConfig).source == expected


def test_every_problem_is_reported_with_its_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    path = write(
        tmp_path,
        """\
        server_id: cache-1
        manager_url: ftp://manager
        token: env:NO_SUCH_TOKEN
        interval: 0
        backof_cap: 3
        source:
          type: port
          max_concurrency: 0
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, AgentConfig)
    assert caught.value.problems == [
        f"{path}, line 3: token: environment variable NO_SUCH_TOKEN is not set",
        f"{path}, line 4: interval: must be at least 0.05, not 0.0",
        f"{path}, line 5: backof_cap: unknown key (did you mean 'backoff_cap'?)",
        f"{path}, line 7: source.port: missing",
        f"{path}, line 8: source.max_concurrency: must be at least 1, not 0",
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "source: {type: apache}",
            "line 4: source.type: must be one of json, nginx, port, not 'apache'",
        ),
        ("source: {type: nginx, max_concurrency: 5, url: 'localhost/x'}", "url: must be an http"),
        (
            "source: {type: nginx, max_concurrency: 5}\ninterval: 5\nbackoff_cap: 2",
            "backoff_cap (2.0) must be at least interval (5.0)",
        ),
        ("source: {type: nginx, max_concurrency: 5}\ntoken2: x", "token2: unknown key"),
    ],
    ids=["unknown-source", "bad-url", "cap-below-interval", "unknown-key"],
)
def test_bad_files_are_refused(text: str, problem: str, tmp_path: Path) -> None:
    head = "server_id: a\nmanager_url: https://m\ntoken: file:agent.token\n"
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        load_config(write(tmp_path, head + text), AgentConfig)


def test_a_token_written_as_its_value_is_refused(tmp_path: Path) -> None:
    text = (
        "server_id: a\nmanager_url: https://m\ntoken: s3cret\n"
        "source: {type: port, port: 1, max_concurrency: 1}\n"
    )
    with pytest.raises(ConfigError, match="never the value itself") as caught:
        load_config(write(tmp_path, text), AgentConfig)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "source",
    [
        NginxSourceConfig(url="http://127.0.1.3:8080/nginx_status", max_concurrency=30),
        PortSourceConfig(port=8080, max_concurrency=30),
        JsonSourceConfig(url="http://127.0.0.1:9000/load", max_concurrency=None, timeout=1.5),
    ],
    ids=["nginx", "port", "json"],
)
def test_a_dumped_config_loads_back_equal(source, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("abc")
    config = AgentConfig(
        server_id="cache-3",
        manager_url="http://127.0.0.1:8000",
        token=resolve_secret(f"file:{token_file}"),
        source=source,
        interval=0.5,
    )
    text = dump_config(config)
    assert "abc" not in text
    assert parse_config(text, AgentConfig) == config


def test_the_example_file_loads(monkeypatch) -> None:
    monkeypatch.setenv("DNSLB_AGENT_TOKEN", "example")
    assert load_config(EXAMPLE, AgentConfig).server_id == "cache-1"


def test_the_documented_example_loads(tmp_path: Path) -> None:
    docs = (EXAMPLE.parents[1] / "docs" / "agent.md").read_text()
    [example] = re.findall(r"```yaml\n(.*?)```", docs, re.DOTALL)
    config = load_config(write(tmp_path, example), AgentConfig)
    assert config.source == NginxSourceConfig(
        url="http://127.0.0.1:8080/nginx_status", max_concurrency=200
    )
