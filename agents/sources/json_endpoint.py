"""Requests in progress from the application: a URL answering a small JSON object.

The application answers ``GET url`` with ``{"in_progress": n, "max_concurrency": m}``, and may
add ``served_total`` (requests served since it started). Parsing is tolerant of what
applications write: numbers may be integers, whole floats (``3.0``) or numeric strings
(``"3"``); other keys are ignored; ``max_concurrency`` may be left to the configuration; a
``served_total`` that is not a count is dropped (it is optional). Anything else is an error
that names the key and the value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import httpx

from agents.sources.base import Reading, Source, fetch
from dnslb.agent_config import JsonSourceConfig
from dnslb.errors import SourceError


def _count(value: object) -> int | None:
    """``value`` as a non-negative whole number, or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and value >= 0:
        return int(value)
    return None


def parse_application_status(body: bytes, *, max_concurrency: int | None = None) -> Reading:
    """The reading in an application's JSON answer; raises :class:`SourceError` saying why not.

    ``max_concurrency`` is used when the answer has none.
    """
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        start = body[:60].decode("utf-8", "replace")
        raise SourceError(f"answer is not JSON ({exc}): {start!r}") from None
    if not isinstance(document, Mapping):
        raise SourceError(f"answer must be a JSON object, not {type(document).__name__}")
    if "in_progress" not in document:
        raise SourceError("answer has no in_progress")
    in_progress = _count(document["in_progress"])
    if in_progress is None:
        raise SourceError(
            f"in_progress must be a whole number >= 0, not {document['in_progress']!r}"
        )
    capacity = max_concurrency
    if document.get("max_concurrency") is not None:
        capacity = _count(document["max_concurrency"])
        if not capacity:
            raise SourceError(
                f"max_concurrency must be a whole number >= 1, not {document['max_concurrency']!r}"
            )
    if capacity is None:
        raise SourceError("answer has no max_concurrency and none is configured")
    return Reading(
        in_progress=in_progress,
        max_concurrency=capacity,
        served_total=_count(document.get("served_total")),
    )


class JsonEndpointSource(Source):
    """Reads the application's status URL over a kept-alive connection."""

    name = "json"

    def __init__(self, config: JsonSourceConfig, client: httpx.AsyncClient | None = None) -> None:
        super().__init__(config.max_concurrency)
        self.config = config
        self.client = client or httpx.AsyncClient(trust_env=False)

    async def measure(self) -> Reading:
        body = await fetch(self.client, self.config.url, self.config.timeout)
        return parse_application_status(body, max_concurrency=self.config.max_concurrency)

    def describe(self) -> str:
        return f"application status at {self.config.url}"

    async def aclose(self) -> None:
        await self.client.aclose()
