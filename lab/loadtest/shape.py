"""The step load: users raised gradually in steps, as in the paper's evaluation, then held.

``start`` users at once, ``step`` more every ``every`` seconds for ``count`` steps, then the peak
is held for ``hold`` seconds and the test ends. Pure: locust's shape class asks
:meth:`StepLoad.users_at`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepLoad:
    """A staircase of users."""

    start: int
    step: int
    every: float
    count: int
    hold: float = 0.0

    def problems(self) -> Iterator[str]:
        if self.start < 0 or self.step < 0 or self.count < 0:
            yield "users and steps must be 0 or more"
        if self.every <= 0:
            yield f"step time must be above 0, not {self.every:g}"
        if self.hold < 0:
            yield f"hold must be 0 or more, not {self.hold:g}"
        if self.peak < 1:
            yield "the load never has a user"

    @property
    def peak(self) -> int:
        return self.start + self.count * self.step

    @property
    def duration(self) -> float:
        """Seconds from the start to the end of the test."""
        return self.count * self.every + self.every + self.hold

    def users_at(self, elapsed: float) -> int | None:
        """Users wanted ``elapsed`` seconds into the test; None once it is over."""
        if elapsed >= self.duration:
            return None
        done = min(self.count, int(elapsed // self.every))
        return self.start + done * self.step
