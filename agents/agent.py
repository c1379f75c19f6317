"""The agent of a cache server (``dnslb agent --config FILE``): measure, report, repeat.

Every ``interval`` seconds it reads its utilization source and the machine's CPU and memory,
builds a :class:`~dnslb.report.Report` and posts it to the manager. Its contract:

- ``seq`` starts at the unix time in milliseconds when the agent starts and grows by one per
  report, so a restarted agent is never behind the sequence the manager last saw;
- reports keep a fixed pace (the next is due ``interval`` after the previous one was due) and
  never burst to catch up;
- when the manager cannot be reached, fails (5xx) or refuses (4xx), the agent waits an
  exponentially growing, jittered delay (at most ``backoff_cap``) and sends a *fresh* report:
  there is no backlog, so the manager only ever hears the present. It resumes the normal pace
  at the first success, without a restart;
- a source it cannot read gives a report with ``in_progress: null`` and the reason in
  ``error``; an unexpected failure while measuring does too: the loop never stops on bad input;
- it logs one line per change (manager lost, refused with a new reason, back; source broken
  with a new reason, back), never one per attempt, and never the token.

SIGTERM and SIGINT stop it cleanly (exit status 0).
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal

from agents.host import HostSample, HostUsage
from agents.manager_client import DeliveryProblem, ManagerClient
from agents.sources import Reading, Source, create_source
from dnslb import logs
from dnslb.agent_config import AgentConfig
from dnslb.clock import Clock, SystemClock
from dnslb.config import load_config
from dnslb.report import Report
from dnslb.tls import client_context

log = logging.getLogger("dnslb.agent")

# Sanity for the doubling: 2**30 intervals is far past any cap.
_MAX_DOUBLINGS = 30


def backoff_delay(failures: int, interval: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait after ``failures`` (>= 1) failed attempts in a row.

    The ceiling doubles from ``2 * interval`` up to ``cap``; the delay is drawn from the upper
    half of it, so agents that lost the manager together do not come back in step, and it is
    never shorter than ``interval``.
    """
    ceiling = min(cap, interval * 2 ** min(max(failures, 1), _MAX_DOUBLINGS))
    return max(interval, rng.uniform(ceiling / 2, ceiling))


def build_report(
    server_id: str, seq: int, when: float, reading: Reading, host: HostSample
) -> Report:
    """The report for one measurement."""
    unreadable = reading.in_progress is None
    return Report(
        server_id=server_id,
        seq=seq,
        time=when,
        in_progress=reading.in_progress,
        max_concurrency=reading.max_concurrency,
        cpu=host.cpu,
        mem=host.mem,
        served_total=reading.served_total,
        # The report contract wants a reason whenever in_progress is null.
        error=(reading.error or "source gave no reading") if unreadable else None,
    )


class Agent:
    """Measures and reports until cancelled; see the module docstring for its contract."""

    def __init__(
        self,
        config: AgentConfig,
        source: Source,
        client: ManagerClient,
        *,
        host: HostUsage | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.source = source
        self.client = client
        self.host = host or HostUsage()
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.seq = int(self.clock.time() * 1000)
        self.first_seq = self.seq
        self.failures = 0  # failed deliveries in a row
        self._delivery_problem: str | None = None  # last one logged
        self._source_error: str | None = None  # last one logged

    async def measure(self) -> Report:
        """A fresh report (the next ``seq``); never raises for what the source does."""
        try:
            reading = await self.source.read()
        except Exception as exc:  # a bug in a source must not stop the reports
            reading = Reading(
                in_progress=None,
                max_concurrency=self.source.max_concurrency,
                error=f"source failed: {type(exc).__name__}: {exc}",
            )
            if self._source_error != reading.error:
                log.exception("source %s failed unexpectedly", self.source.name)
                self._source_error = reading.error
        self._note_source(reading.error)
        report = build_report(
            self.config.server_id, self.seq, self.clock.time(), reading, self.host.sample()
        )
        self.seq += 1
        return report

    def _note_source(self, error: str | None) -> None:
        if error == self._source_error:
            return
        if error is None:
            log.info("source readable again: %s", self.source.describe())
        else:
            log.warning("source unreadable, reporting no load: %s", error)
        self._source_error = error

    def _note_delivery(self, problem: DeliveryProblem | None) -> None:
        if problem is None:
            if self._delivery_problem is not None:
                log.info("manager took a report again after %d failed attempts", self.failures)
            self._delivery_problem = None
            return
        if problem.message == self._delivery_problem:
            return
        self._delivery_problem = problem.message
        retry = f"retrying with backoff up to {self.config.backoff_cap:g} s, latest report only"
        if problem.refused:
            log.error("%s (%s)", problem.message, retry)
        else:
            log.warning("%s (%s)", problem.message, retry)

    async def step(self) -> float:
        """Measure, send, and return how long to wait before the next report."""
        started = self.clock.monotonic()
        report = await self.measure()
        try:
            problem = await self.client.send(report)
        except Exception as exc:  # a bug in sending must not stop the reports either
            problem = DeliveryProblem(f"sending failed: {type(exc).__name__}: {exc}")
            if problem.message != self._delivery_problem:
                log.exception("sending a report failed unexpectedly")
                self._delivery_problem = problem.message
        self._note_delivery(problem)
        if problem is None:
            self.failures = 0
            return max(0.0, started + self.config.interval - self.clock.monotonic())
        self.failures += 1
        return backoff_delay(self.failures, self.config.interval, self.config.backoff_cap, self.rng)

    async def run(self) -> None:
        """Report until cancelled (then close the source and the connection to the manager)."""
        try:
            while True:
                await self.clock.sleep(await self.step())
        finally:
            await self.source.aclose()
            await self.client.aclose()


async def serve(config: AgentConfig) -> int:
    """Run an agent for ``config`` until SIGTERM or SIGINT; returns the exit status."""
    source = create_source(config.source)
    client = ManagerClient(
        config.reports_urls,
        config.token,
        timeout=config.manager_timeout,
        verify=client_context(config.ca_file),
    )
    agent = Agent(config, source, client)
    task = asyncio.create_task(agent.run())
    loop = asyncio.get_running_loop()
    received: list[str] = []

    def stop(signum: signal.Signals) -> None:
        received.append(signum.name)
        task.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    log.info(
        "server %s: reporting to %s every %g s, reading %s",
        config.server_id,
        client.managers.describe(),
        config.interval,
        source.describe(),
    )
    try:
        await task
    except asyncio.CancelledError:
        if not received:  # cancelled from outside, not by a signal of ours
            raise
    log.info("stopped by %s after %d reports", received[0], agent.seq - agent.first_seq)
    return 0


def main(config_path: str) -> int:
    """``dnslb agent``: load the configuration (a ConfigError goes to the caller), then serve."""
    config = load_config(config_path, AgentConfig)
    logs.configure("agent")
    return asyncio.run(serve(config))
