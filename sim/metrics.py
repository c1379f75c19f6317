"""What a simulated run measured: the shared columns of :mod:`evaluation.columns`, plus the seed,
the simulator's own measures of work, and what the fault suite checks."""

from __future__ import annotations

import math
from dataclasses import dataclass

from evaluation.columns import CaseResult


@dataclass(frozen=True, slots=True)
class RunResult(CaseResult):
    """One simulated run's figures."""

    seed: int
    simulated: float  # seconds of simulated time
    events: int  # client events processed (a measure of the work)
    # What the fault suite looks for (0 in a sound run):
    failed_on_termination: int = 0  # requests in progress on a server the manager terminated
    sent_to_terminated: int = 0  # connections of TTL-honouring users to a terminated server
    orphans: int = 0  # servers running in the cloud at the end that the manager does not know
    double_launches: int = 0  # server ids the cloud started more than one machine for
    # Topology scenarios: requests failed because their server crashed (the rest of ``failed``
    # timed out or found no address), and the share of requests served in the user's location.
    failed_on_crash: int = 0
    in_location: float = math.nan
    # The TTL users were given by their resolvers when they looked up (what is left in the
    # resolver's cache), as the lab measures its mean TTL; ``mean_ttl`` is what DNS gave.
    user_ttl: float = math.nan
