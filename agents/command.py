"""The agents' command lines: ``dnslb agent``, ``dnslb cache-server`` and ``dnslb node-agent``.

Option defaults come from the settings they fill (:class:`~daemons.nginx.NginxSettings`,
:class:`~agents.node_agent.NodeAgentConfig`), declared there once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from daemons.nginx import NginxSettings
from dnslb.config import default_of

DEFAULT_CACHE_WORKDIR = "/var/lib/dnslb/cache"
# A cache server's command runs in its own container or VM, where clients reach it from outside.
CACHE_SERVER_ADDRESS = "0.0.0.0"  # noqa: S104


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb agent``."""
    parser.add_argument("--config", required=True, metavar="FILE", help="agent configuration")


def run_agent(args: argparse.Namespace) -> int:
    """Run a cache server's agent until stopped."""
    from agents.agent import main  # noqa: PLC0415

    return main(args.config)


def add_cache_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb cache-server``."""

    def default(name: str) -> object:
        return default_of(NginxSettings, name)

    parser.add_argument("--agent-config", required=True, metavar="FILE", help="agent config")
    parser.add_argument("--origin", required=True, help="the origin nginx caches, http://HOST:PORT")
    parser.add_argument(
        "--address",
        default=CACHE_SERVER_ADDRESS,
        help="listen address (%(default)s)",
    )
    parser.add_argument(
        "--port", type=int, default=default("port"), help="listen port (%(default)s)"
    )
    parser.add_argument(
        "--workdir", default=DEFAULT_CACHE_WORKDIR, help="nginx's files and cache directory"
    )
    parser.add_argument(
        "--capacity-rps", type=float, help="emulated capacity: requests a second (none: no limit)"
    )
    parser.add_argument(
        "--send-rate", type=int, help="emulated bandwidth: bytes a second per response"
    )
    parser.add_argument(
        "--send-chunk",
        type=int,
        default=default("send_chunk"),
        help="bytes per paced write (%(default)s)",
    )


def run_cache_server(args: argparse.Namespace) -> int:
    """Run nginx and its agent in one process tree."""
    from agents.cache_server import main  # noqa: PLC0415

    settings = NginxSettings(
        address=args.address,
        port=args.port,
        origin=args.origin,
        capacity_rps=args.capacity_rps,
        send_rate=args.send_rate,
        send_chunk=args.send_chunk,
    )
    return main(settings, args.workdir, args.agent_config)


def add_node_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb node-agent``."""
    from agents.node_agent import NodeAgentConfig  # noqa: PLC0415

    def default(name: str) -> object:
        return default_of(NodeAgentConfig, name)

    parser.add_argument("--cluster", required=True, help="cluster name, as the manager knows it")
    parser.add_argument("--node-id", required=True, help="this node's id in dispatch tables")
    parser.add_argument("--vip", required=True, help="the cluster's shared IPv4 address")
    parser.add_argument(
        "--listen",
        default=f"{default('listen_host')}:{default('listen_port')}",
        help="HOST:PORT for table pushes (default %(default)s)",
    )
    parser.add_argument(
        "--manager-url", help="manager base URL for heartbeats (none: no heartbeats)"
    )
    token = parser.add_mutually_exclusive_group(required=True)
    token.add_argument("--token-file", help="file holding the bearer token")
    token.add_argument("--token-env", help="environment variable holding the bearer token")
    parser.add_argument(
        "--driver",
        default=default("driver"),
        help="dispatch driver: nftables or dry-run (default %(default)s)",
    )
    parser.add_argument(
        "--bucket-count",
        type=int,
        default=default("bucket_count"),
        help="buckets per table (default %(default)s)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=default("heartbeat_interval"),
        help="seconds between heartbeats (default %(default)s)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=default("max_concurrency"),
        help="connections to the VIP at full load (default %(default)s)",
    )
    parser.add_argument(
        "--service-port",
        type=int,
        action="append",
        default=[],
        help="port the service listens on (repeatable); none listening means not serving",
    )
    parser.add_argument(
        "--nft-table",
        default=default("nft_table"),
        help="nftables table to own (default %(default)s)",
    )
    parser.add_argument(
        "--no-listener-check",
        action="store_true",
        help="accept a SYN of our bucket even when no socket listens (the stack then resets it)",
    )
    parser.add_argument(
        "--lease",
        type=float,
        default=default("lease"),
        help="seconds the node takes new connections without its agent, renewed before each "
        "heartbeat (0: forever; at least twice --heartbeat-interval, below the manager's "
        "failover_after) (default %(default)s)",
    )


def run_node_agent(args: argparse.Namespace) -> int:
    """Run a cluster node's agent until SIGTERM/SIGINT."""
    from agents.node_agent import (  # noqa: PLC0415
        MIN_TOKEN_LENGTH,
        NodeAgentConfig,
        read_token,
        run,
    )
    from dnslb.errors import ConfigError  # noqa: PLC0415

    # Collect every problem (listen address, token, settings) before failing.
    problems: list[str] = []
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        problems.append(f"--listen {args.listen!r}: expected HOST:PORT")
        host, port = "127.0.0.1", "0"
    try:
        token = read_token(args.token_file, args.token_env)
    except ConfigError as exc:
        problems += exc.problems
        token = "-" * MIN_TOKEN_LENGTH  # stands in so that the other settings get checked
    try:
        config = NodeAgentConfig(
            cluster=args.cluster,
            node_id=args.node_id,
            vip=args.vip,
            token=token,
            manager_url=args.manager_url,
            listen_host=host.strip("[]"),
            listen_port=int(port),
            driver=args.driver,
            bucket_count=args.bucket_count,
            heartbeat_interval=args.heartbeat_interval,
            max_concurrency=args.max_concurrency,
            service_ports=tuple(args.service_port),
            nft_table=args.nft_table,
            require_listener=not args.no_listener_check,
            lease=args.lease,
        )
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError("node agent", problems)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"dnslb node-agent[{os.getpid()}]: %(levelname)s %(message)s",
    )
    return run(config)
