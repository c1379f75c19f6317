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
    """A clock that moves only when advanced; sleepers wake when it has moved far enough.

    Virtual time: ``await clock.sleep(5)`` returns once ``advance`` has moved the clock five
    seconds on, however long that takes in real time, so a test drives background tasks
    (launches that poll a provider, say) second by second.
    """

    def __init__(self, start: float = 1_000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self.now = start
        self.wall_offset = wall_offset
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + self.wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.now += seconds
        waiting = []
        for deadline, future in self._sleepers:
            if deadline <= self.now:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((deadline, future))
        self._sleepers = waiting

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, future))
        await future
