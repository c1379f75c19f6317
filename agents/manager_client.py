"""Posting reports to the manager: one kept-alive HTTP connection, a bearer token, timeouts.

:meth:`ManagerClient.send` never raises for what the network or the manager do: it returns
None when the manager took the report (any 2xx) and a :class:`DeliveryProblem` saying why not
otherwise, so that the agent decides how to wait and what to log.

With several managers (active/standby) it follows the leader as :mod:`agents.managers` says:
the next one on a network failure or a ``503``, a ``307`` only to a configured manager.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from agents.managers import ManagerUrls
from dnslb.config import Secret
from dnslb.report import Report, report_to_dict
from dnslb.tls import client_context, verification_failure

MAX_MESSAGE = 200  # of a refusal's body, in the log


@dataclass(frozen=True, slots=True)
class DeliveryProblem:
    """Why a report was not taken. ``refused`` is a 4xx: the manager will not take it as is
    (bad token, unknown server), which retrying alone will not fix."""

    message: str
    refused: bool = False


def _refusal_text(response: httpx.Response) -> str:
    """The manager's reason in one line: a JSON ``detail``/``error`` if there is one."""
    text = response.text.strip()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key in ("detail", "error", "message"):
            if isinstance(body.get(key), str):
                text = body[key]
                break
    text = " ".join(text.split())
    return text[:MAX_MESSAGE] + ("..." if len(text) > MAX_MESSAGE else "")


class ManagerClient:
    """Sends reports to ``url`` (one reports URL, or one per manager: the leader is followed)
    with ``Authorization: Bearer <token>``; an ``https://`` manager is verified with ``verify``
    (:func:`dnslb.tls.client_context`; default: the system's trust store)."""

    def __init__(
        self,
        url: str | Sequence[str],
        token: Secret,
        *,
        timeout: float,
        verify: ssl.SSLContext | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.managers = ManagerUrls([url] if isinstance(url, str) else url)
        # Proxies from the environment are ignored: agents talk to their manager directly.
        self._client = httpx.AsyncClient(
            timeout=timeout,
            verify=verify or client_context(),
            headers={"Authorization": f"Bearer {token.reveal()}"},
            trust_env=False,
            transport=transport,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )

    @property
    def url(self) -> str:
        """The reports URL of the current manager (the leader, as far as this agent knows)."""
        return self.managers.url

    async def send(self, report: Report) -> DeliveryProblem | None:
        """Post ``report``; None when the leading manager took it, else why not."""
        body = report_to_dict(report)
        attempts = self.managers.round()
        for index in attempts:
            url = self.managers.urls[index]
            try:
                response = await self._client.post(url, json=body)
                await response.aread()
            except httpx.TimeoutException:
                attempts.problems.append(f"manager at {url} did not answer in time")
                continue
            except httpx.HTTPError as exc:
                reason = verification_failure(exc) or str(exc) or type(exc).__name__
                attempts.problems.append(f"manager at {url} unreachable: {reason}")
                continue
            if response.status_code == 307:  # a standby naming the leader
                location = response.headers.get("location")
                why = attempts.redirect(location, url) if location else "gave no Location"
                if why is not None:
                    attempts.problems.append(f"manager at {url} redirected: {why}")
                continue
            if response.status_code == 503:  # a standby that knows no leader, or one starting
                reason = _refusal_text(response)
                attempts.problems.append(f"manager at {url} is not taking reports: {reason}")
                continue
            attempts.took(index)
            return _outcome(response)
        return DeliveryProblem("; ".join(attempts.problems))

    async def aclose(self) -> None:
        await self._client.aclose()


def _outcome(response: httpx.Response) -> DeliveryProblem | None:
    """What the leader's answer means: None when it took the report."""
    if response.is_success:
        return None
    refused = response.is_client_error
    what = "refused the report" if refused else "failed to take the report"
    status = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    reason = _refusal_text(response)
    message = f"manager {what}: {status}" + (f": {reason}" if reason else "")
    return DeliveryProblem(message, refused=refused)
