"""Requests in progress from nginx's ``stub_status`` page.

The page reads (nginx 1.22)::

    Active connections: 6
    server accepts handled requests
     8 8 8
    Reading: 0 Writing: 6 Waiting: 0

``Reading`` counts requests whose header is still arriving, ``Writing`` the requests nginx is
working on after that, waiting for the origin included, until the last byte is sent. Both are
summed over all workers. The status request itself is one of the Writing, so requests in
progress are ``Reading + Writing - 1``. ``Waiting`` are idle keep-alive connections and
connections that have not sent a byte yet: no request in progress. ``requests`` counts every
request *started* since the master started, status requests included; it is the reading's
``served_total``. nginx does not know its capacity, so ``max_concurrency`` comes from the
configuration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

from agents.sources.base import Reading, Source, fetch
from dnslb.agent_config import NginxSourceConfig
from dnslb.errors import SourceError

_STUB_STATUS = re.compile(
    rb"\AActive connections:\s*(?P<active>\d+)\s*\n"
    rb"\s*server accepts handled requests\s*\n"
    rb"\s*(?P<accepts>\d+)\s+(?P<handled>\d+)\s+(?P<requests>\d+)\s*\n"
    rb"\s*Reading:\s*(?P<reading>\d+)\s+Writing:\s*(?P<writing>\d+)\s+Waiting:\s*(?P<waiting>\d+)"
)


@dataclass(frozen=True, slots=True)
class StubStatus:
    """The counters of one ``stub_status`` page."""

    active: int
    accepts: int
    handled: int
    requests: int
    reading: int
    writing: int
    waiting: int

    @property
    def in_progress(self) -> int:
        """Requests in progress, not counting the status request that read this page."""
        return max(0, self.reading + self.writing - 1)


def parse_stub_status(body: bytes) -> StubStatus:
    """Parse a ``stub_status`` page; raises :class:`SourceError` when it is not one."""
    match = _STUB_STATUS.match(body.lstrip())
    if match is None:
        start = body[:60].decode("utf-8", "replace")
        raise SourceError(f"not an nginx stub_status page: {start!r}")
    return StubStatus(**{name: int(value) for name, value in match.groupdict().items()})


class NginxStatusSource(Source):
    """Reads nginx's ``stub_status`` page over a kept-alive connection."""

    name = "nginx"

    def __init__(self, config: NginxSourceConfig, client: httpx.AsyncClient | None = None) -> None:
        super().__init__(config.max_concurrency)
        self.config = config
        self.client = client or httpx.AsyncClient(trust_env=False)

    async def measure(self) -> Reading:
        status = parse_stub_status(await fetch(self.client, self.config.url, self.config.timeout))
        return Reading(
            in_progress=status.in_progress,
            max_concurrency=self.config.max_concurrency,
            served_total=status.requests,
        )

    def describe(self) -> str:
        return f"nginx stub_status at {self.config.url}"

    async def aclose(self) -> None:
        await self.client.aclose()
