"""The agents' command lines: ``dnslb agent``, ``dnslb cache-server`` and ``dnslb node-agent``.

Option defaults come from the settings they fill (:class:`~daemons.nginx.NginxSettings`,
:class:`~agents.node_agent.NodeAgentConfig`), declared there once.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from daemons.nginx import NginxSettings
from dnslb import logs
from dnslb.config import (
    Secret,
    default_of,
    load_config,
    problems_of,
    resolve_file_reference,
    resolve_secret,
)
from dnslb.errors import ConfigError
from dnslb.tls import TlsListenerConfig

if TYPE_CHECKING:
    from agents.node_agent import NodeAgentConfig

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


_NODE_AGENT_OWN_FLAGS = ("listen", "token_file", "token_env", "tls_certificate", "tls_key")
"""Flags that are not one field of :class:`~agents.node_agent.NodeAgentConfig` each; every other
setting flag's ``dest`` is the field it sets."""
_NODE_AGENT_FLAG_NAMES = {
    "service_ports": "--service-port",
    "require_listener": "--no-listener-check",
}


def _flag_name(dest: str) -> str:
    return _NODE_AGENT_FLAG_NAMES.get(dest, "--" + dest.replace("_", "-"))


def add_node_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dnslb node-agent``: ``--config FILE``, or the settings as flags.

    A setting flag that is not given is absent from the namespace (``argparse.SUPPRESS``): the
    configuration then takes the field's default, and ``--config`` can tell it was not given.
    """
    from agents.dispatch_drivers import DRIVERS  # noqa: PLC0415
    from agents.node_agent import NodeAgentConfig  # noqa: PLC0415

    def default(name: str) -> object:
        return default_of(NodeAgentConfig, name)

    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML configuration (NodeAgentConfig, see docs/clusters.md); instead of the flags",
    )
    flags = parser.add_argument_group(
        "settings as flags", "the same settings as the file's, when there is no --config"
    )

    def flag(*names: str, **options: object) -> None:
        flags.add_argument(*names, default=argparse.SUPPRESS, **options)  # type: ignore[arg-type]

    flag("--cluster", help="cluster name, as the manager knows it (required)")
    flag("--node-id", help="this node's id in dispatch tables (required)")
    flag("--vip", help="the cluster's shared IPv4 address (required)")
    flag(
        "--listen",
        metavar="HOST:PORT",
        help="HOST:PORT for table pushes "
        f"(default {default('listen_host')}:{default('listen_port')})",
    )
    flag(
        "--manager-url",
        action="append",
        help="manager base URL for heartbeats (none: no heartbeats); repeat it for managers in "
        "active/standby: heartbeats follow the leader, the first given is tried first",
    )
    flag(
        "--tls-certificate",
        metavar="FILE",
        help="PEM certificate the push listener serves HTTPS with (with --tls-key)",
    )
    flag("--tls-key", metavar="FILE", help="PEM private key of --tls-certificate")
    flag(
        "--ca-file",
        metavar="FILE",
        help="CA certificate(s) an https:// --manager-url is verified with",
    )
    flag(
        "--allow-plaintext",
        action="store_true",
        help="let the token cross the network in clear text (an http:// --manager-url beyond "
        "this host, a listener without TLS beyond loopback)",
    )
    token = flags.add_mutually_exclusive_group()
    token.add_argument(
        "--token-file",
        default=argparse.SUPPRESS,
        help="file holding the bearer token (required: this or --token-env)",
    )
    token.add_argument(
        "--token-env",
        default=argparse.SUPPRESS,
        help="environment variable holding the bearer token",
    )
    flag(
        "--driver",
        help=f"dispatch driver: {', '.join(sorted(DRIVERS))} (default {default('driver')})",
    )
    flag(
        "--bucket-count",
        type=int,
        help=f"buckets per table (default {default('bucket_count')})",
    )
    flag(
        "--heartbeat-interval",
        type=float,
        help=f"seconds between heartbeats (default {default('heartbeat_interval')})",
    )
    flag(
        "--backoff-max",
        type=float,
        help="longest wait between heartbeats while the manager is unreachable "
        f"(default {default('backoff_max')})",
    )
    flag(
        "--max-concurrency",
        type=int,
        help=f"connections to the VIP at full load (default {default('max_concurrency')})",
    )
    flag(
        "--service-port",
        dest="service_ports",
        metavar="PORT",
        type=int,
        action="append",
        help="port the service listens on (repeatable); none listening means not serving",
    )
    flag("--nft-table", help=f"nftables table to own (default {default('nft_table')})")
    flag(
        "--no-listener-check",
        dest="require_listener",
        action="store_false",
        help="accept a SYN of our bucket even when no socket listens (the stack then resets it)",
    )
    flag(
        "--keep-tcp-loose",
        action="store_true",
        help="leave net.netfilter.nf_conntrack_tcp_loose as it is (default: set it to 0)",
    )
    flag(
        "--lease",
        type=float,
        help="seconds the node takes new connections without its agent, counted from each "
        "heartbeat the manager took (0: forever; at least twice --heartbeat-interval, below "
        f"the manager's failover_after) (default {default('lease')})",
    )


def node_agent_config(args: argparse.Namespace) -> NodeAgentConfig:
    """The configuration ``--config`` names, or the one the setting flags give (never both).

    Raises :class:`~dnslb.errors.ConfigError` listing every problem: with the file's lines, or
    naming the flags.
    """
    from agents.node_agent import (  # noqa: PLC0415
        MIN_TOKEN_LENGTH,
        NodeAgentConfig,
        token_reference,
    )

    fields = {item.name for item in dataclasses.fields(NodeAgentConfig)}
    given = {
        name: value
        for name, value in vars(args).items()
        if name in fields or name in _NODE_AGENT_OWN_FLAGS
    }
    if args.config is not None:
        if given:
            flags = ", ".join(sorted(_flag_name(name) for name in given))
            raise ConfigError(
                "node agent", [f"give the settings in --config or as flags, not both ({flags})"]
            )
        return load_config(args.config, NodeAgentConfig)
    # Collect every problem (required flags, listen address, token, settings) before failing.
    problems = [
        f"{_flag_name(name)}: required (or --config FILE)"
        for name in ("cluster", "node_id", "vip")
        if name not in given
    ]
    values = {name: value for name, value in given.items() if name in fields}
    values.setdefault("cluster", "-")  # stand-ins, so that the other settings get checked
    values.setdefault("node_id", "-")
    values.setdefault("vip", "0.0.0.0")  # noqa: S104
    if "listen" in given:
        host, _, port = given["listen"].rpartition(":")
        if host and port.isdigit():
            values["listen_host"], values["listen_port"] = host.strip("[]"), int(port)
        else:
            problems.append(f"--listen {given['listen']!r}: expected HOST:PORT")
    if "service_ports" in values:
        values["service_ports"] = tuple(values["service_ports"])
    if "manager_url" in values:
        values["manager_url"], *more = values["manager_url"]
        values["manager_urls"] = tuple(more)
    if "ca_file" in values:
        try:
            values["ca_file"] = resolve_file_reference(f"file:{values['ca_file']}")
        except ValueError as exc:
            problems.append(f"--ca-file: {exc}")
            del values["ca_file"]
    if ("tls_certificate" in given) != ("tls_key" in given):
        problems.append("--tls-certificate and --tls-key: give both or neither")
    elif "tls_certificate" in given:
        try:
            values["tls"] = TlsListenerConfig(
                certificate=resolve_file_reference(f"file:{given['tls_certificate']}"),
                key=resolve_file_reference(f"file:{given['tls_key']}"),
            )
        except ValueError as exc:
            problems.append(f"--tls-certificate, --tls-key: {exc}")
    values["token"] = Secret("-" * MIN_TOKEN_LENGTH, "-")
    try:
        reference = token_reference(given.get("token_file"), given.get("token_env"))
    except ConfigError as exc:
        problems += exc.problems
    else:
        flag = "--token-file" if reference.startswith("file:") else "--token-env"
        try:
            values["token"] = resolve_secret(reference)
        except ValueError as exc:
            problems.append(f"{flag}: {exc}")
    config = NodeAgentConfig(**values)
    problems += problems_of(config)
    if problems:
        raise ConfigError("node agent", problems)
    return config


def run_node_agent(args: argparse.Namespace) -> int:
    """Run a cluster node's agent until SIGTERM/SIGINT."""
    from agents.node_agent import run  # noqa: PLC0415

    config = node_agent_config(args)
    logs.configure("node-agent")
    return run(config)
