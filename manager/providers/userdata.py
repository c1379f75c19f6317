"""User data for cloud servers: a template filled with the server's identity and agent token.

A cloud provider (``ec2``, ``openstack``) hands every server it launches a user-data script
rendered from a template. Placeholders are written ``{{name}}`` (shell's ``$VAR`` and ``${VAR}``
stay untouched) and are:

- ``{{server_id}}``: the id the manager gave the server (its agent reports under it);
- ``{{pool}}``: the pool's name;
- ``{{manager_url}}``: where the agent reports;
- ``{{manager_urls}}``: the other managers (``http.peer_urls``, active/standby) as a YAML list,
  ``[]`` for none;
- ``{{agent_token}}``: the server's own agent token.

User data is readable by whoever may read the instance's attributes (EC2's
``ec2:DescribeInstanceAttribute``, Nova's ``os-extended-server-attributes`` for admins) and from
inside the server by any process that can reach the metadata service; ``docs/cloud.md`` says how to
narrow that. The token is never put in tags or metadata: only its hash is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from manager.providers.base import LaunchRequest, ProviderError

PLACEHOLDERS = ("server_id", "pool", "manager_url", "manager_urls", "agent_token")

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")

DEFAULT_USER_DATA = """\
#!/bin/sh
# Written by the dnslb manager at launch: this server's identity and its agent's token. The image
# provides /etc/dnslb/agent-source.yaml (the agent's source: section) and dnslb-agent.service.
set -eu
dir=/etc/dnslb
umask 077
mkdir -p "$dir"
printf '%s\\n' '{{agent_token}}' > "$dir/agent.token"
{
  echo '# pool {{pool}}: written at launch by the dnslb manager'
  echo 'server_id: "{{server_id}}"'
  echo 'manager_url: "{{manager_url}}"'
  echo 'manager_urls: {{manager_urls}}'
  echo "token: file:$dir/agent.token"
  cat "$dir/agent-source.yaml"
} > "$dir/agent.yaml"
systemctl enable --now dnslb-agent.service
"""
"""The script servers get when a provider's ``user_data`` is not set (docs/cloud.md)."""


def template_problems(template: str) -> Iterator[str]:
    """Placeholders in ``template`` that are not known (for a config's ``config_problems``)."""
    for name in sorted({match.group(1) for match in _PLACEHOLDER.finditer(template)}):
        if name not in PLACEHOLDERS:
            yield (
                f"user_data: unknown placeholder {{{{{name}}}}} "
                f"(known: {', '.join('{{' + p + '}}' for p in PLACEHOLDERS)})"
            )


def render_user_data(template: str | None, request: LaunchRequest, *, limit: int) -> str:
    """``template`` (or the default script) filled in for ``request``.

    Raises :class:`ProviderError` when the result is longer than ``limit`` bytes (the cloud's
    own limit on user data), so the launch fails with a clear message instead of an API error.
    """
    values = {
        "server_id": request.server_id,
        "pool": request.pool,
        "manager_url": request.manager_url,
        # A JSON list is a YAML flow sequence; the URLs were checked as URLs by the config.
        "manager_urls": json.dumps(list(request.manager_urls)),
        "agent_token": request.agent_token,
    }
    text = _PLACEHOLDER.sub(
        lambda match: values.get(match.group(1), match.group(0)),
        DEFAULT_USER_DATA if template is None else template,
    )
    size = len(text.encode("utf-8"))
    if size > limit:
        raise ProviderError(f"user data is {size} bytes once rendered; the cloud takes {limit}")
    return text
