"""User data: the default script really gives a server's agent a configuration it loads."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from dnslb.agent_config import AgentConfig
from dnslb.config import load_config
from manager.providers.base import LaunchRequest, ProviderError
from manager.providers.userdata import DEFAULT_USER_DATA, render_user_data, template_problems

REQUEST = LaunchRequest(
    server_id="www-3f2a9c01",
    pool="www",
    agent_token="Zm9vYmFyLXRva2VuLTE5Mi1iaXRz",
    manager_url="https://dnslb.internal.example.com",
)

SOURCE = """\
source:
  type: nginx
  url: http://127.0.0.1:8080/nginx_status
  max_concurrency: 200
"""


def test_the_default_script_writes_an_agent_configuration_that_loads(tmp_path: Path) -> None:
    """Run the rendered script as cloud-init would, in a scratch directory instead of /etc."""
    script = render_user_data(None, REQUEST, limit=16384)
    assert script.count("dir=/etc/dnslb\n") == 1
    etc = tmp_path / "etc-dnslb"
    etc.mkdir()
    (etc / "agent-source.yaml").write_text(SOURCE)  # what the image ships
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/systemctl.called\n')
    systemctl.chmod(0o755)
    (tmp_path / "user-data").write_text(script.replace("dir=/etc/dnslb", f"dir={etc}"))
    subprocess.run(
        ["/bin/sh", str(tmp_path / "user-data")],
        check=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
    )
    config = load_config(etc / "agent.yaml", AgentConfig)
    assert config.server_id == REQUEST.server_id
    assert config.manager_url == REQUEST.manager_url
    assert config.token.reveal() == REQUEST.agent_token
    assert REQUEST.agent_token not in (etc / "agent.yaml").read_text()  # only a reference
    assert stat.S_IMODE(os.stat(etc / "agent.token").st_mode) == 0o600
    called = (tmp_path / "systemctl.called").read_text()
    assert called == "enable --now dnslb-agent.service\n"


def test_a_custom_template_fills_placeholders_and_leaves_the_shell_alone() -> None:
    template = (
        'echo "{{ server_id }} of {{pool}}" > "$HOME/id" && curl -H "X: ${TOKEN}" {{manager_url}}'
    )
    assert list(template_problems(template)) == []
    assert render_user_data(template, REQUEST, limit=1000) == (
        'echo "www-3f2a9c01 of www" > "$HOME/id" && curl -H "X: ${TOKEN}" '
        "https://dnslb.internal.example.com"
    )


def test_unknown_placeholders_are_named() -> None:
    [problem] = template_problems("token={{token}} id={{server_id}}")
    assert problem.startswith("user_data: unknown placeholder {{token}} (known: {{server_id}}")


def test_user_data_over_the_clouds_limit_is_a_clear_error() -> None:
    with pytest.raises(ProviderError, match=r"user data is \d+ bytes once rendered; the cloud"):
        render_user_data(DEFAULT_USER_DATA + "#" * 20000, REQUEST, limit=16384)
