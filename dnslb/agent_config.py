"""The agent's configuration file: which server it speaks for, where it reports, what it measures.

It lives in the core, beside the report contract, because two components share it: the agent
(``dnslb agent --config FILE``, package ``agents``) reads it, and the manager's local provider
writes one for every cache server it starts (:func:`dnslb.config.dump_config`), without
importing the agent. Build it with :func:`dnslb.config.load_config`; the reference table in
``docs/agent.md`` is :func:`dnslb.config.reference` of :class:`AgentConfig`.

The sources an agent may read are a plugin family, :class:`SourceConfig`. Their configuration
classes are here, in the core, because they are the contract between the two: the manager
writes them without the agents' code and must accept the same ones. Their implementations are in
:mod:`agents.sources`, which maps each registered configuration to its class (and a test checks
that every one has an implementation and every implementation a configuration). A new source is
its configuration class here, with ``@SourceConfig.register``, its module in ``agents/sources/``
and its line in :data:`agents.sources.SOURCES`.

A minimal file::

    server_id: cache-1
    manager_url: http://127.0.0.1:8000
    token: file:/etc/dnslb/agent.token
    source:
      type: nginx
      url: http://127.0.0.1/nginx_status
      max_concurrency: 200
"""

from __future__ import annotations

import os
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from dnslb.config import FileReference, PluginConfig, Secret, setting
from dnslb.report import MAX_ID_LENGTH
from dnslb.tls import ca_file_problem, plaintext_url_problem

MAX_MANAGERS = 16
"""Most manager URLs an agent is given (each is tried at most once per report)."""


def _url_problem(name: str, url: str) -> str | None:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"{name}: must be an http:// or https:// URL, not {url!r}"
    return None


class SourceConfig(PluginConfig):
    """An agent's ``source`` block: the configuration of one registered utilization source."""

    __slots__ = ()


@SourceConfig.register
@dataclass(frozen=True, slots=True, kw_only=True)
class NginxSourceConfig(SourceConfig):
    """Requests in progress from nginx's `stub_status` page (Reading + Writing - 1).

    The status request itself is one of the Writing; nginx cannot know its capacity.
    """

    type: Literal["nginx"] = setting("nginx", help="selects this source")
    url: str = setting(
        "http://127.0.0.1/nginx_status",
        help="the `stub_status` page (must allow the agent's address)",
    )
    max_concurrency: int = setting(
        help="requests this server serves at once at full load (nginx cannot know it)", min=1
    )
    timeout: float = setting(0.5, help="seconds to wait for the status page", min=0.01, max=30.0)

    def config_problems(self) -> Iterator[str]:
        problem = _url_problem("url", self.url)
        if problem:
            yield problem


@SourceConfig.register
@dataclass(frozen=True, slots=True, kw_only=True)
class PortSourceConfig(SourceConfig):
    """Requests in progress as the established TCP connections to a local port.

    One request per connection: right for servers without keep-alive, an upper bound with it.
    """

    type: Literal["port"] = setting("port", help="selects this source")
    port: int = setting(help="the local TCP port the service listens on", min=1, max=65535)
    max_concurrency: int = setting(
        help="connections this server serves at once at full load", min=1
    )


@SourceConfig.register
@dataclass(frozen=True, slots=True, kw_only=True)
class JsonSourceConfig(SourceConfig):
    """Requests in progress from the application: `{"in_progress": n, "max_concurrency": m}`.

    ``served_total`` in the answer is optional.
    """

    type: Literal["json"] = setting("json", help="selects this source")
    url: str = setting(help="the application's status URL")
    max_concurrency: int | None = setting(
        None, help="capacity to use when the application's answer has none", min=1
    )
    timeout: float = setting(0.5, help="seconds to wait for the answer", min=0.01, max=30.0)

    def config_problems(self) -> Iterator[str]:
        problem = _url_problem("url", self.url)
        if problem:
            yield problem


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """One agent: the server it speaks for, the manager it reports to, the source it reads."""

    server_id: str = setting(help="this server's id, as the manager knows it")
    manager_url: str = setting(
        help="the manager's base URL; reports go to `{manager_url}/v1/reports`"
    )
    manager_urls: tuple[str, ...] = setting(
        default_factory=tuple,
        help="more managers' base URLs (standbys of an active/standby pair): reports go to the "
        "leader among these and manager_url, following a standby's redirect only to one of them",
    )
    token: Secret = setting(help="this agent's bearer token")
    source: SourceConfig = setting(help="where requests in progress are read")
    interval: float = setting(1.0, help="seconds between reports", min=0.05, max=60.0)
    backoff_cap: float = setting(
        10.0,
        help="longest wait between attempts while the manager fails or refuses",
        min=0.1,
        max=600.0,
    )
    manager_timeout: float = setting(
        2.0, help="seconds to wait for the manager to take a report", min=0.05, max=60.0
    )
    ca_file: FileReference | None = setting(
        None,
        help="CA certificate(s) an https:// manager_url is verified with (null: the system's "
        "trust store)",
    )
    allow_plaintext: bool = setting(
        False,
        help="send the token in clear text to an http:// manager_url beyond this host (only on "
        "a network you trust)",
    )

    def config_problems(self) -> Iterator[str]:
        if len(self.server_id) > MAX_ID_LENGTH:
            yield f"server_id: must be at most {MAX_ID_LENGTH} characters"
        problem = _url_problem("manager_url", self.manager_url) or plaintext_url_problem(
            "manager_url", self.manager_url, self.allow_plaintext
        )
        if problem:
            yield problem
        if len(self.manager_urls) > MAX_MANAGERS:
            yield f"manager_urls: at most {MAX_MANAGERS} managers"
        for index, url in enumerate(self.manager_urls[:MAX_MANAGERS]):
            name = f"manager_urls[{index}]"
            if problem := _url_problem(name, url) or plaintext_url_problem(
                name, url, self.allow_plaintext
            ):
                yield problem
        if problem := ca_file_problem(self.ca_file):
            yield problem
        if self.backoff_cap < self.interval:
            yield (f"backoff_cap ({self.backoff_cap}) must be at least interval ({self.interval})")

    @property
    def reports_url(self) -> str:
        """Where reports are posted (to the first manager)."""
        return self.manager_url.rstrip("/") + "/v1/reports"

    @property
    def reports_urls(self) -> tuple[str, ...]:
        """Where reports may be posted: one URL per manager, ``manager_url``'s first."""
        urls = (self.manager_url, *self.manager_urls)
        return tuple(dict.fromkeys(url.rstrip("/") + "/v1/reports" for url in urls))


def agent_command(config_path: str | os.PathLike[str], *, python: str | None = None) -> list[str]:
    """The command line that runs an agent on ``config_path`` (with this interpreter)."""
    return [python or sys.executable, "-m", "cli", "agent", "--config", str(config_path)]
