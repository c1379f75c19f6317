"""``dnslb cache-server``: one cache server in one container, nginx and its agent together.

The local provider starts a cache server's nginx and agent as two processes of the manager's
host; a container holds one server, so this command runs both: nginx (:class:`NginxServer`,
configured by :func:`daemons.nginx.render_config` from the options, capacity emulation included) as
a child process, and the agent (:mod:`agents.agent`) in this process, reading nginx's
``stub_status`` on loopback and reporting to the manager. It starts nginx first (the agent must
never report for a server that does not answer), and ends when it is told to (SIGTERM, SIGINT:
exit status 0, nginx stopped gracefully with its workers: the requests in progress end, for
:data:`GRACEFUL_STOP` seconds at most) or when nginx exits (status 1, with the end of nginx's
error log on stderr, where the container's log and the docker provider see it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from agents.agent import Agent
from agents.manager_client import ManagerClient
from agents.sources import create_source
from daemons.nginx import NginxServer, NginxSettings
from dnslb import logs
from dnslb.agent_config import AgentConfig
from dnslb.config import checked, load_config
from dnslb.tls import client_context

log = logging.getLogger("dnslb.cache_server")

WATCH_INTERVAL = 0.5
"""Seconds between checks that nginx still runs."""
GRACEFUL_STOP = 5.0
"""Seconds nginx has, once told to stop, to end the requests in progress: a drained server's
last ones (``docker stop`` kills after the docker provider's ``stop_timeout``, 10 s)."""


async def serve(settings: NginxSettings, workdir: Path, agent_config: AgentConfig) -> int:
    """Run nginx and the agent until a signal (0) or until nginx exits (1)."""
    nginx = NginxServer(settings, workdir)
    await asyncio.to_thread(nginx.start)
    log.info("nginx answers on %s:%d, caching %s", settings.address, settings.port, settings.origin)
    source = create_source(agent_config.source)
    client = ManagerClient(
        agent_config.reports_urls,
        agent_config.token,
        timeout=agent_config.manager_timeout,
        verify=client_context(agent_config.ca_file),
    )
    agent = Agent(agent_config, source, client)
    stopped = asyncio.Event()
    received: list[str] = []
    loop = asyncio.get_running_loop()

    def stop(signum: signal.Signals) -> None:
        received.append(signum.name)
        stopped.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    reporting = asyncio.create_task(agent.run(), name="agent")
    watching = asyncio.create_task(_watch(nginx), name="nginx")
    waiting = asyncio.create_task(stopped.wait(), name="signal")
    try:
        done, _ = await asyncio.wait(
            {reporting, watching, waiting}, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in (reporting, watching, waiting):
            task.cancel()
        await asyncio.gather(reporting, watching, waiting, return_exceptions=True)
        await asyncio.to_thread(nginx.stop, GRACEFUL_STOP, graceful=bool(received))
    if received:
        log.info("stopped by %s after %d reports", received[0], agent.seq - agent.first_seq)
        return 0
    if watching in done:
        log.error("nginx exited; its log ends:\n%s", nginx.log_tail())
    else:
        log.error("the agent stopped: %r", reporting.exception())
    return 1


async def _watch(nginx: NginxServer) -> None:
    """Return when nginx's master process has exited."""
    process = nginx.process
    while process is not None and process.poll() is None:
        await asyncio.sleep(WATCH_INTERVAL)


def main(
    settings: NginxSettings, workdir: str | os.PathLike[str], agent_config: str | os.PathLike[str]
) -> int:
    """``dnslb cache-server``: load the agent's configuration, then :func:`serve`.

    A bad configuration is a :class:`ConfigError` listing every problem; nginx that does not
    start is a :class:`~dnslb.errors.ProcessError` with its log's end.
    """
    config = load_config(agent_config, AgentConfig)
    checked(settings, "cache server")
    logs.configure("cache-server")
    # nginx that does not start raises ProcessError: the command's caller prints it.
    return asyncio.run(serve(settings, Path(workdir), config))
