"""What every utilization source is: a :class:`Source` that turns into a :class:`Reading`.

A source knows how busy the server is: the requests in progress now and, where it can know it,
the server's capacity (``max_concurrency``) and the requests served so far. The base fixes the
workflow: :meth:`Source.read` never raises; a subclass implements :meth:`Source.measure`, which
raises :class:`~dnslb.errors.SourceError` saying why the source cannot be read, and the reading
then carries that reason (the report has ``in_progress: null`` and ``error``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import httpx

from dnslb.errors import SourceError

MAX_BODY = 64 * 1024  # a status answer is a few hundred bytes; more is not a status page


@dataclass(frozen=True, slots=True)
class Reading:
    """What a source saw: requests in progress and capacity, or (``error``) why it could not."""

    in_progress: int | None
    max_concurrency: int | None
    served_total: int | None = None
    error: str | None = None


class Source(ABC):
    """A utilization source; subclasses set ``name`` and implement :meth:`measure`."""

    name: ClassVar[str]

    def __init__(self, max_concurrency: int | None) -> None:
        self.max_concurrency = max_concurrency  # the configured capacity, when there is one

    async def read(self) -> Reading:
        """The current reading; a source that cannot be read gives a reading saying why."""
        try:
            return await self.measure()
        except SourceError as exc:
            return Reading(in_progress=None, max_concurrency=self.max_concurrency, error=str(exc))

    @abstractmethod
    async def measure(self) -> Reading:
        """Read the source now; raises :class:`SourceError` saying why it cannot."""

    def describe(self) -> str:
        """One line saying what this source reads, for the agent's log."""
        return self.name

    async def aclose(self) -> None:  # noqa: B027 - most sources hold nothing to release
        """Release what the source holds (connections); it is not used afterwards."""


async def fetch(client: httpx.AsyncClient, url: str, timeout: float) -> bytes:
    """The body of a 200 answer to ``GET url``; raises :class:`SourceError` saying what failed."""
    try:
        async with client.stream("GET", url, timeout=timeout) as response:
            if response.status_code != 200:
                raise SourceError(f"{url} answered HTTP {response.status_code}")
            body = b""
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY:
                    raise SourceError(f"{url} answered more than {MAX_BODY} bytes")
            return body
    except httpx.TimeoutException:
        raise SourceError(f"{url} did not answer within {timeout:g} s") from None
    except httpx.ConnectError as exc:
        raise SourceError(f"cannot connect to {url}: {_reason(exc)}") from None
    except httpx.HTTPError as exc:
        raise SourceError(f"GET {url} failed: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    # httpx wraps the OS error; its text is the useful part ("[Errno 111] Connection refused").
    return str(exc) or type(exc).__name__
