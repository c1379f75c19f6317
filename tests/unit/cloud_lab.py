"""A real Manager with a cloud provider on a fake clock, for the EC2 and OpenStack tests.

Cloud providers run their SDK calls in worker threads, so ``Manager.settle()`` (a few event-loop
turns) is not enough to let a launch finish: :meth:`CloudLab.settle` waits, in real time, until
every lifecycle task has ended or waits on the fake clock. The servers' agents are played by the
test: :meth:`CloudLab.report` posts for every running server with the token found in the user
data the cloud holds for its instance, which is how a real agent gets it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dnslb.clock import FakeClock
from dnslb.model import ServerState
from manager.config import load_manager_config
from manager.service import Manager

_TOKEN_LINE = re.compile(r"printf '%s\\n' '([^']+)' > \"\$dir/agent.token\"")


def token_in_user_data(user_data: str) -> str | None:
    """The agent token the default user-data script writes, or None."""
    found = _TOKEN_LINE.search(user_data)
    return found.group(1) if found else None


class ThreadedClock(FakeClock):
    """A fake clock that can tell how many sleepers wait on it."""

    @property
    def waiting(self) -> int:
        return len(self._sleepers)  # woken sleepers leave this list in advance()


class CloudLab:
    """A manager on ``config`` whose agents report with the tokens ``token_of(ref)`` finds."""

    def __init__(self, tmp_path: Path, config: str, token_of: Callable[[str], str | None]) -> None:
        self.path = tmp_path / "manager.yaml"
        self.path.write_text(config)
        self.clock = ThreadedClock()
        self.token_of = token_of
        self.seq = 1000
        self.manager = Manager(load_manager_config(self.path), clock=self.clock)

    async def settle(self, timeout: float = 30.0) -> None:
        """Wait until every lifecycle task has ended or sleeps on the fake clock."""
        deadline = time.monotonic() + timeout
        while True:
            await asyncio.sleep(0)
            tasks = [
                task
                for lifecycle in self.manager.lifecycles.values()
                for task in lifecycle.tasks
                if not task.done()
            ]
            if len(tasks) <= self.clock.waiting:
                return
            if time.monotonic() > deadline:
                names = ", ".join(task.get_name() for task in tasks)
                raise AssertionError(f"lifecycle tasks still busy after {timeout} s: {names}")
            await asyncio.sleep(0.005)

    async def restart(self) -> None:
        """The manager process ends (its tasks with it) and a new one starts on the same state."""
        await self.manager.close()
        self.manager = Manager(load_manager_config(self.path), clock=self.clock)

    def report(self, in_progress: int) -> None:
        """Every running server's agent reports ``in_progress`` of 100."""
        self.seq += 1
        for server in self.manager.fleet.servers.values():
            if server.state not in (ServerState.WARMING, ServerState.ACTIVE, ServerState.DRAINING):
                continue
            token = self.token_of(server.record.provider_ref or "")
            if token is None:
                continue
            body: dict[str, Any] = {
                "server_id": server.id,
                "seq": self.seq,
                "time": self.clock.time(),
                "in_progress": in_progress,
                "max_concurrency": 100,
            }
            self.manager.ingest.accept(token, json.dumps(body).encode())

    async def run(self, seconds: int, in_progress: int) -> None:
        for _ in range(seconds):
            self.report(in_progress)
            self.clock.advance(1)
            self.manager.tick()
            await self.settle()

    def servers(self, *states: ServerState) -> list[str]:
        return sorted(
            s.id for s in self.manager.fleet.servers.values() if not states or s.state in states
        )

    def events(self, kind: str) -> list[str]:
        return [
            f"{e.server}: {e.summary}"
            for e in reversed(self.manager.store.events(kinds=[kind], limit=500))
        ]
