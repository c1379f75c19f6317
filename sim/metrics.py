"""What a simulated run measured: the shared columns of :mod:`evaluation.columns`, plus the seed
and the simulator's own measures of work."""

from __future__ import annotations

from dataclasses import dataclass

from evaluation.columns import CaseResult


@dataclass(frozen=True, slots=True)
class RunResult(CaseResult):
    """One simulated run's figures."""

    seed: int
    simulated: float  # seconds of simulated time
    events: int  # client events processed (a measure of the work)
