"""Following the leading manager among several (managers in active/standby).

An agent is configured with one or more manager base URLs. It sends to the current one; on a
connection error, a timeout or a ``503`` (a standby that knows no leader) it tries the next;
on a ``307 Temporary Redirect`` (a standby naming the leader) it goes where the ``Location``
points **only** when that is one of the configured managers (same scheme, host and port), and
then sends to the configured URL, never to the redirect target itself: the bearer token goes to
configured managers alone. Each manager is tried at most once per report, so a redirect loop
or a fleet of standbys costs at most one attempt each. The one that took a report becomes the
current one.

:class:`ManagerUrls` holds that choice and nothing else (no I/O); the agent's
:class:`~agents.manager_client.ManagerClient` (httpx) and the node agent's
:class:`~agents.node_agent.ManagerLink` (http.client) both walk a :class:`Round` of it.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

_DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_LOCATION = 2048  # a Location header longer than this is not looked at


def origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the port made explicit; None for anything else."""
    if len(url) > MAX_LOCATION:
        return None
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:  # a port that is not a number or out of range
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


class ManagerUrls:
    """The configured managers' base URLs and which one is current (the leader, as far as
    this agent knows)."""

    def __init__(self, urls: Sequence[str]) -> None:
        unique = list(dict.fromkeys(url.rstrip("/") for url in urls))
        if not unique:
            raise ValueError("at least one manager URL is needed")
        self.urls: tuple[str, ...] = tuple(unique)
        self.current = 0
        self._origins = [origin(url) for url in self.urls]

    @property
    def url(self) -> str:
        """The current manager's base URL."""
        return self.urls[self.current]

    def describe(self) -> str:
        """The managers for a log line: the current one first."""
        if len(self.urls) == 1:
            return self.urls[0]
        others = [url for index, url in enumerate(self.urls) if index != self.current]
        return f"{self.url} (or {', '.join(others)})"

    def configured(self, location: str, base: str) -> int | None:
        """The index of the configured manager a redirect's ``Location`` points at, or None
        when it points anywhere else. A relative ``Location`` is read against ``base`` (the
        URL that answered)."""
        target = origin(urllib.parse.urljoin(base, location.strip()))
        if target is None:
            return None
        for index, known in enumerate(self._origins):
            if known == target:
                return index
        return None

    def round(self) -> Round:
        """The attempts of one send: the current manager first, then the others in order."""
        return Round(self)


class Round:
    """The managers one report is offered to, each at most once.

    Iterate for the next index to try; :meth:`redirect` puts a configured leader next;
    :meth:`took` makes the index that took the report current.
    """

    def __init__(self, managers: ManagerUrls) -> None:
        self.managers = managers
        count = len(managers.urls)
        self._queue = [(managers.current + step) % count for step in range(count)]
        self._tried: set[int] = set()
        self.problems: list[str] = []  # one per failed attempt, for the log line

    def __iter__(self) -> Round:
        return self

    def __next__(self) -> int:
        while self._queue:
            index = self._queue.pop(0)
            if index not in self._tried:
                self._tried.add(index)
                return index
        raise StopIteration

    def redirect(self, location: str, base: str) -> str | None:
        """Follow a ``307`` from ``base`` to ``location``: the next attempt goes to that
        configured manager. Returns why not, when it is not followed."""
        index = self.managers.configured(location, base)
        if index is None:
            shown = location[:200]
            return f"redirected to {shown!r}, which is not a configured manager: not followed"
        if index in self._tried:
            return f"redirected to {self.managers.urls[index]}, tried already for this report"
        self._queue.insert(0, index)
        return None

    def took(self, index: int) -> None:
        """The manager at ``index`` answered for good (took or refused the report)."""
        self.managers.current = index


__all__ = ["MAX_LOCATION", "ManagerUrls", "Round", "origin"]
