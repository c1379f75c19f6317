"""Agent CPU at one report a second: the real ``dnslb agent`` process, real nginx, a real receiver.

Starts nginx (a cache server with its status page), an HTTP receiver standing in for the
manager, and ``dnslb agent`` reading nginx and reporting every ``--interval`` seconds. After the
first report (start-up is measured apart) it samples the agent process's CPU time (user +
system, psutil) over ``--seconds`` and prints it as a percentage of one core. The goal is at
most 1 %; nothing is asserted.

    .venv/bin/python bench/agent.py                  # 60 s, nginx source
    .venv/bin/python bench/agent.py --seconds 10 --source port
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

from daemons.nginx import NginxServer, NginxSettings
from daemons.process import free_port, stop_group
from dnslb.agent_config import (
    AgentConfig,
    NginxSourceConfig,
    PortSourceConfig,
    SourceConfig,
    agent_command,
)
from dnslb.config import dump_config, resolve_secret


class Receiver:
    """Counts the reports it is sent (answers 204)."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.arrived = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                owner.reports.append(json.loads(body))
                owner.arrived.set()
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measuring time (60)")
    parser.add_argument("--interval", type=float, default=1.0, help="report interval (1.0)")
    parser.add_argument("--source", choices=["nginx", "port"], default="nginx")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dnslb-bench-agent-") as temp:
        work = Path(temp)
        address = "127.0.1.50"
        nginx = NginxServer(
            NginxSettings(address=address, port=free_port(address, ("tcp",))), work / "nginx"
        )
        receiver = Receiver()
        agent: subprocess.Popen[bytes] | None = None
        try:
            nginx.start()
            (work / "token").write_text("bench-token")
            source: SourceConfig = (
                NginxSourceConfig(url=nginx.status_url, max_concurrency=100)
                if args.source == "nginx"
                else PortSourceConfig(port=nginx.settings.port, max_concurrency=100)
            )
            config = AgentConfig(
                server_id="bench-1",
                manager_url=receiver.url,
                token=resolve_secret(f"file:{work / 'token'}"),
                source=source,
                interval=args.interval,
            )
            (work / "agent.yaml").write_text(dump_config(config))
            launched = time.monotonic()
            agent = subprocess.Popen(
                agent_command(work / "agent.yaml"),
                stdin=subprocess.DEVNULL,
                stderr=(work / "agent.log").open("wb"),
                start_new_session=True,
            )
            process = psutil.Process(agent.pid)
            if not receiver.arrived.wait(30):
                raise SystemExit("the agent sent no report within 30 s")
            startup_cpu = cpu_seconds(process)
            startup_wall = time.monotonic() - launched
            count_before = len(receiver.reports)
            cpu_before, wall_before = cpu_seconds(process), time.monotonic()
            time.sleep(args.seconds)
            cpu_after, wall_after = cpu_seconds(process), time.monotonic()
            count = len(receiver.reports) - count_before
            rss = process.memory_info().rss
        finally:
            if agent is not None:
                stop_group(agent, sig=signal.SIGTERM)
            nginx.stop()
            receiver.close()

    wall = wall_after - wall_before
    cpu = cpu_after - cpu_before
    errors = sum(1 for report in receiver.reports if report.get("error"))
    print(f"agent, {args.source} source, one report every {args.interval:g} s:")
    print(f"  start-up: {startup_cpu * 1000:.0f} ms CPU, first report after {startup_wall:.2f} s")
    print(
        f"  steady:   {cpu * 1000:.0f} ms CPU in {wall:.1f} s = {100 * cpu / wall:.3f} % of one "
        f"core ({1000 * cpu / max(count, 1):.2f} ms per report; goal <= 1 %)"
    )
    print(f"  reports:  {count} received ({count / wall:.2f}/s), {errors} with an error")
    print(f"  memory:   {rss / 2**20:.1f} MiB resident")


if __name__ == "__main__":
    main()
