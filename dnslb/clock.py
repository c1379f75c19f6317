"""Clocks passed in, so that logic that depends on time is tested without sleeping.

:class:`SystemClock` is the real one. :class:`FakeClock` only moves when told (``advance``) or
when something sleeps on it; tests drive the manager's ticks, health timeouts and autoscaler
windows with it in microseconds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals, wall time for timestamps, and sleeping."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The machine's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FakeClock:
    """A clock that moves only when advanced; sleeping advances it (and yields to the loop)."""

    def __init__(self, start: float = 1_000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self.now = start
        self.wall_offset = wall_offset

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + self.wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)
