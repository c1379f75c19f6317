"""The step load: users raised gradually in steps, as in the paper's evaluation, then held.

``start`` users at once, ``step`` more every ``every`` seconds for ``count`` steps, then the peak
is held for ``hold`` seconds and the test ends. Pure: locust's shape class asks
:meth:`StepLoad.users_at`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dnslb.config import setting


@dataclass(frozen=True, slots=True)
class StepLoad:
    """A staircase of users (validate one built in code with :func:`dnslb.config.checked`)."""

    start: int = setting(20, help="users at the start", min=0)
    step: int = setting(20, help="users added each step", min=0)
    every: float = setting(30.0, help="seconds a step lasts (above 0)", min=0)
    count: int = setting(5, help="steps after the start", min=0)
    hold: float = setting(30.0, help="seconds the peak is held", min=0)

    def config_problems(self) -> Iterator[str]:
        if self.every <= 0:
            yield f"every: must be above 0, not {self.every:g}"
        if self.peak < 1:
            yield "the load never has a user"

    @property
    def peak(self) -> int:
        return self.start + self.count * self.step

    @property
    def spawn_rate(self) -> float:
        """Users a second locust starts: those of the start, and of each step, arrive within
        about a second, as the simulator's users do (a constant load of 100 users started at
        one a second had the lab's resolvers asking 1 s apart, the simulator's together)."""
        return max(1.0, float(self.start), float(self.step))

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
