"""The domain model shared by the manager and the components that look at it (API, metrics, lab).

A server's *lifecycle* (DESIGN section 5)::

    launching -> warming -> active -> draining -> terminated
                              ^  |
                              |  v
                              down            (health: no reports, failed checks)

plus the operator's ``disabled``, which keeps a server out of answers whatever its health. Being
*paused* (above ``th_over``) is not a lifecycle state: it is the policy's verdict on an active
server, recomputed every tick. Every transition is an :class:`Event` of kind ``state`` with the
state it left, the state it entered and its reason, each a field of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ServerState(StrEnum):
    LAUNCHING = "launching"  # asked of the provider; no address or agent yet
    WARMING = "warming"  # exists; waiting for a healthy report before it is answered
    ACTIVE = "active"  # answered (unless paused by the policy or an operator)
    DOWN = "down"  # stopped reporting, reported a broken source, or failed health checks
    DRAINING = "draining"  # out of the answers; terminated once clients have left
    DISABLED = "disabled"  # taken out by an operator
    TERMINATED = "terminated"  # gone; kept for cost and history

    @property
    def counts_as_capacity(self) -> bool:
        """States the autoscaler counts as capacity (present or on the way)."""
        return self in (ServerState.LAUNCHING, ServerState.WARMING, ServerState.ACTIVE)


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened, and why.

    A server's state change (kind ``state``) names the state it left (``from_state``) and the
    one it entered (``to_state``); ``reason`` is only why. Other kinds have neither.
    """

    time: float  # unix seconds
    kind: str  # e.g. "state", "paused", "resumed", "scale_out", "report_rejected"
    reason: str
    pool: str | None = None
    server: str | None = None
    from_state: ServerState | None = None
    to_state: ServerState | None = None
    id: int | None = None  # assigned when stored

    @property
    def summary(self) -> str:
        """The reason, after the change it explains: ``warming -> active: reporting``."""
        if self.from_state is None and self.to_state is None:
            return self.reason
        before = self.from_state.value if self.from_state is not None else "?"
        after = self.to_state.value if self.to_state is not None else "?"
        return f"{before} -> {after}: {self.reason}"
