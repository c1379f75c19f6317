"""The project's exceptions, one root and a small tree under it.

::

    DnslbError                    every error this project raises on purpose
    +-- ConfigError               a configuration file (or command-line value) is wrong
    +-- PlanError                 a plan document is invalid (carries every problem found)
    +-- ProtocolError             a peer spoke a protocol wrongly (pipe lines, agent reports)
    |   +-- agents.node_agent.ReportRefused   the leading manager refused a node agent's report
    +-- ProcessError              a program we run (pdns_server, nginx, nft) failed to start or run
    +-- SourceError               an agent's utilization source (nginx, a port...) is unreadable
    +-- dnslb.control.NotFound    no pool or server by that name (the API's 404)
    +-- dnslb.control.Conflict    the request contradicts the current state (the API's 409)
    +-- dnslb.resp.RedisError     Redis failed or answered with an error; also an OSError
    |   +-- RedisProtocolError    the reply broke RESP2 or a limit
    |   +-- RedisTimeoutError     no reply in time; also a TimeoutError
    |   +-- RedisConnectionError  no connection, or it was lost; also a ConnectionError
    |       +-- RedisBackoffError no new attempt until the back-off ends
    +-- dnslb.fuzzing.Finding     a fuzzed boundary broke its contract
    +-- dnslb.geoip.GeoIpError    a MaxMind-format database cannot be read
    +-- manager.providers.base.ProviderError     a cloud call failed (``retryable`` or not)
    +-- manager.ingest.Rejected                 an agent's report was refused (its HTTP status)
    +-- manager.clusters.VersionsExhausted      a cluster has no dispatch table version left
    +-- manager.leadership.Fenced               a write of a manager whose epoch has passed
    +-- cli.ctl.CtlError                        a ``dnslb ctl`` command failed (its exit status)
    +-- lab.loadtest.resolver.LookupFailed      a load-test client's DNS lookup got no address

A class named with its module is defined beside the code that raises it (a component's in the
component: the core imports no component). Left out on purpose, because no handler of ours may catch
them: ``dnslb.fuzzing.Hang``, which a timer raises inside the code under test, and the private
exceptions modules use for their own control flow (``_Refused``, ``_Stop``, ...).

Errors that carry several problems (``ConfigError``, ``PlanError``) keep them as a list of
``"path: message"`` strings in ``problems`` so that a caller can show all of them at once.
Each process's entry point turns a ``DnslbError`` into one clear message and a non-zero exit;
the API maps them to HTTP statuses in one handler (:mod:`api.errors`). ``RedisError`` stays an
``OSError`` too: code that reads a plan store catches ``OSError`` for any store unreachable,
file or Redis alike.
"""

from __future__ import annotations

from collections.abc import Iterable


class DnslbError(Exception):
    """Root of every error raised on purpose by dnslb."""


class _ProblemsError(DnslbError):
    """An error that lists every problem found, each prefixed with where it is."""

    def __init__(self, what: str, problems: Iterable[str]) -> None:
        self.what = what
        self.problems = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.problems) == 1:
            return f"{self.what}: {self.problems[0]}"
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        return f"{self.what}: {len(self.problems)} problems\n{lines}"


class ConfigError(_ProblemsError):
    """A configuration file or value is wrong; ``problems`` lists each with its file and line."""


class PlanError(_ProblemsError):
    """A plan document is invalid; ``problems`` lists each with its JSON path."""


class ProtocolError(DnslbError):
    """A peer sent something the protocol does not allow."""


class ProcessError(DnslbError):
    """An external program could not be started, or failed while running."""


class SourceError(DnslbError):
    """A utilization source could not be read; the message says why, for the agent's report."""
