"""The manager's configuration file: a YAML document built into these frozen dataclasses.

``dnslb manager --config manager.yaml`` loads it once with :func:`dnslb.config.load_config`;
unknown keys, bad values and missing secrets are reported together with file and line.
``docs/manager.md`` holds the reference generated from these classes.

A pool's ``provider`` and ``health_check`` blocks are plugin families
(:class:`~dnslb.config.PluginConfig`): each provider's and each check's configuration class
lives beside its implementation (:mod:`manager.providers`, :mod:`manager.checks`) and is
accepted here once registered there.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from dnslb.config import FileReference, Secret, load_config, setting
from dnslb.dnsname import name_problem, normalize
from dnslb.errors import ConfigError
from dnslb.plan import (
    GEOIP_CODE,
    MAX_GEOIP_CODES,
    MAX_NETWORKS,
    STATIC_TYPES,
    GeoIp,
    Network,
    address_problem,
    geoip_path_problem,
    location_problem,
    network_problem,
    show,
    text_problem,
)
from dnslb.policy import PoolPolicy
from dnslb.report import id_problem
from dnslb.scaling import ScalingPolicy
from dnslb.tls import (
    TlsListenerConfig,
    ca_file_problem,
    plaintext_listener_problem,
    plaintext_url_problem,
)
from manager.checks import HealthCheckConfig
from manager.clusters import ClusterNode, ClusterSettings
from manager.leadership import LeaseSettings
from manager.providers import ProviderConfig


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """Where the manager listens: agent reports, the REST API, /metrics and the dashboard."""

    address: str = setting("127.0.0.1", help="listen address; loopback unless you mean it")
    port: int = setting(8700, help="listen port", min=1, max=65535)
    advertise_url: str | None = setting(
        None, help="URL launched servers' agents report to (default http://ADDRESS:PORT)"
    )
    peer_urls: tuple[str, ...] = setting(
        default_factory=tuple,
        help="the other managers' URLs (active/standby; this one's may be listed too): launched "
        "servers' agents get them all and follow the leader",
    )
    cors_origins: tuple[str, ...] = setting(
        default_factory=tuple,
        help="origins whose pages may call the API from a browser (CORS), e.g. "
        "https://ops.example.com; empty: CORS off",
    )
    header_timeout: float = setting(
        5.0, help="seconds a request's headers may take to arrive; slower: closed", min=0.5, max=300
    )
    body_timeout: float = setting(
        10.0, help="seconds a request's body may take after its headers", min=0.5, max=300
    )
    max_connections: int | None = setting(
        None,
        help="connections held at once; more are closed as they arrive (default: 4,096 or half "
        "the file-descriptor limit, whichever is lower)",
        min=1,
        max=1_000_000,
    )
    tls: TlsListenerConfig | None = setting(
        None, help="serve HTTPS (TLS 1.2 or later) with this certificate and key; null: HTTP"
    )
    agent_ca_file: FileReference | None = setting(
        None,
        help="CA certificate(s) the agents of servers the manager launches verify it with "
        "(local provider; null: the system's trust store)",
    )
    allow_plaintext: bool = setting(
        False,
        help="accept tokens in clear text from beyond this host: plain HTTP on an address that "
        "is not loopback, or an http:// advertise_url to another host (only on a network you "
        "trust)",
    )

    @property
    def url(self) -> str:
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = f"[{self.address}]" if ":" in self.address else self.address
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    def config_problems(self) -> Iterator[str]:
        try:
            ipaddress.ip_address(self.address)
        except ValueError:
            yield f"address: {self.address!r} is not an IP address"
        else:
            problem = plaintext_listener_problem(
                "address", self.address, self.tls is not None, self.allow_plaintext
            )
            if problem:
                yield problem
        if self.advertise_url is not None:
            problem = plaintext_url_problem(
                "advertise_url", self.advertise_url, self.allow_plaintext
            )
            if problem:
                yield problem
        if problem := ca_file_problem(self.agent_ca_file):
            yield f"agent_{problem}"
        for index, peer in enumerate(self.peer_urls):
            parts = urlsplit(peer)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                yield f"peer_urls[{index}]: {peer[:100]!r} is not an http(s) URL"
            elif problem := plaintext_url_problem(
                f"peer_urls[{index}]", peer, self.allow_plaintext
            ):
                yield problem
        for index, origin in enumerate(self.cors_origins):
            parsed = urlsplit(origin)
            if (
                parsed.scheme not in ("http", "https")
                or not parsed.netloc
                or parsed.path not in ("", "/")
                or parsed.query
                or parsed.fragment
            ):
                yield (
                    f"cors_origins[{index}]: {origin!r} is not an origin "
                    "(scheme://host[:port], no path; '*' is not allowed)"
                )


@dataclass(frozen=True, slots=True)
class ApiTokenConfig:
    """A bearer token for the REST API, the metrics and the dashboard."""

    token: Secret = setting(help="the token, as a reference")
    role: Literal["read", "admin"] = setting(
        help="read: every GET (views, events, metrics); admin: also every change"
    )


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Tokens, always as references (``env:NAME`` or ``file:PATH``)."""

    agent_token: Secret | None = setting(
        None, help="token agents of static members may present (each member may have its own)"
    )
    api_tokens: tuple[ApiTokenConfig, ...] = setting(
        default_factory=tuple,
        help="tokens of the REST API (agent tokens never work there); none: the API refuses all",
    )
    metrics_public: bool = setting(
        False, help="serve /metrics without a token (default: the read role is needed)"
    )

    def config_problems(self) -> Iterator[str]:
        agent = self.agent_token.reveal() if self.agent_token is not None else None
        seen: dict[str, int] = {}
        for index, entry in enumerate(self.api_tokens):
            value = entry.token.reveal()
            if value == agent:
                yield (
                    f"api_tokens[{index}].token: the same token as agent_token; "
                    "agents and the API need different tokens"
                )
            if value in seen:
                yield f"api_tokens[{index}].token: the same token as api_tokens[{seen[value]}]"
            seen.setdefault(value, index)


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """Where and how the plan is published."""

    path: str = setting("plan.json", help="plan file (relative to the config file's directory)")
    store: str | None = setting(
        None,
        help="publish to Redis instead of the file, for DNS servers on several hosts: "
        "redis://HOST:PORT/DB?key=NAME",
    )
    redis_password: Secret | None = setting(None, help="the Redis password, as a reference")
    stale_after: float = setting(
        30.0, help="pipe backends answer with TTL floors when the plan is older than this", min=1.0
    )
    refresh: float = setting(
        5.0, help="republish an unchanged plan this often, to keep its age low", min=0.5
    )

    def config_problems(self) -> Iterator[str]:
        if self.store is not None and not self.store.startswith("redis://"):
            yield f"store: {self.store!r} must be a redis:// URL (or leave it out: a file)"
        if self.refresh >= self.stale_after:
            yield f"refresh ({self.refresh}) must be below stale_after ({self.stale_after})"


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Durable state: a SQLite file (one manager), or PostgreSQL (managers in active/standby)."""

    path: str = setting("state.db", help="SQLite database (relative to the config file)")
    url: str | None = setting(
        None,
        help="PostgreSQL instead of SQLite, shared by managers in active/standby: "
        "postgresql://USER@HOST:PORT/DATABASE (docs/high-availability.md)",
    )
    password: Secret | None = setting(None, help="the PostgreSQL password, as a reference")
    sslmode: Literal["disable", "prefer", "require", "verify-ca", "verify-full"] | None = setting(
        None, help="libpq's sslmode for PostgreSQL (verify-full: check the server's name too)"
    )
    ssl_ca_file: str | None = setting(
        None, help="CA certificate(s) to verify PostgreSQL's certificate with (sslrootcert)"
    )
    leadership: LeaseSettings = setting(
        default_factory=LeaseSettings, help="the leadership lease (PostgreSQL only)"
    )
    events_max_age: float = setting(
        2592000.0, help="seconds events are kept (30 days)", min=1.0, max=1e10
    )
    events_max_rows: int = setting(
        1000000, help="events kept at most (the oldest are deleted first)", min=1, max=10**12
    )
    servers_max_age: float = setting(
        2592000.0,
        help="seconds a terminated server's record is kept (30 days); its cost and served "
        "count stay in its pool's totals",
        min=1.0,
        max=1e10,
    )

    def config_problems(self) -> Iterator[str]:
        if self.url is None:
            for name in ("password", "sslmode", "ssl_ca_file"):
                if getattr(self, name) is not None:
                    yield f"{name}: only for PostgreSQL (set url)"
            return
        parts = urlsplit(self.url)
        if parts.scheme not in ("postgresql", "postgres"):
            yield f"url: {self.url[:100]!r} must be a postgresql:// URL"
        elif parts.password is not None:
            yield "url: name the password as a reference in password, not in the URL"


@dataclass(frozen=True, slots=True)
class SoaConfig:
    """The zone's SOA record; serial follows the plan version."""

    mname: str | None = setting(None, help="primary name server (default: the first NS)")
    rname: str | None = setting(None, help="mailbox of the zone's owner (default hostmaster.ZONE)")
    refresh: int = setting(10800, help="SOA refresh", min=0)
    retry: int = setting(3600, help="SOA retry", min=0)
    expire: int = setting(604800, help="SOA expire", min=0)
    minimum: int = setting(
        10,
        help="negative-caching TTL (RFC 2308): short, so that a pool empty for a moment is "
        "answered again soon",
        min=0,
    )
    ttl: int = setting(3600, help="TTL of the SOA record", min=0)


@dataclass(frozen=True, slots=True)
class RecordConfig:
    """A static record of a zone."""

    name: str = setting(help="owner name: absolute, or relative to the zone ('@' for the apex)")
    type: str = setting(help=f"one of {', '.join(STATIC_TYPES)}")
    content: str = setting(help="zone-file data (an address, a name, '10 mx.example.com', ...)")
    ttl: int = setting(3600, help="TTL", min=0)

    def config_problems(self) -> Iterator[str]:
        if self.type not in STATIC_TYPES:
            yield f"type must be one of {', '.join(STATIC_TYPES)}, not {self.type!r}"


@dataclass(frozen=True, slots=True)
class ZoneConfig:
    """A zone the DNS servers are authoritative for."""

    name: str = setting(help="the zone apex, e.g. example.com")
    ns: tuple[str, ...] = setting(help="the apex NS names")
    ns_ttl: int = setting(3600, help="TTL of the NS records", min=0)
    soa: SoaConfig = setting(default_factory=SoaConfig, help="SOA record")
    records: tuple[RecordConfig, ...] = setting(default_factory=tuple, help="static records")

    def config_problems(self) -> Iterator[str]:
        problem = name_problem(normalize(self.name))
        if problem:
            yield f"name: {self.name!r}: {problem}"
        if not self.ns:
            yield "ns: must name at least one name server"


@dataclass(frozen=True, slots=True)
class ClusterNodeConfig:
    """A node of a single-IP cluster."""

    id: str = setting(help="node id (in tables; its node agent reports under it)")
    agent_url: str = setting(help="its node agent's URL, e.g. https://10.0.0.11:8701")
    token: Secret = setting(help="the node agent's token: authenticates pushes and its reports")
    max_concurrency: int | None = setting(
        None,
        help="the most its reported capacity counts for, not bounded by capacity_spread "
        "(default: what its agent reports, bounded by capacity_spread)",
        min=1,
        max=10**9,
    )


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A single-IP cluster: nodes sharing one address, each taking its share of connections."""

    name: str = setting(help="cluster name")
    vip: str = setting(help="the shared address (a pool member with cluster: NAME answers it)")
    seed: int = setting(help="jhash seed: fixed for the cluster's life", min=0, max=2**32 - 1)
    nodes: tuple[ClusterNodeConfig, ...] = setting(help="the nodes")
    bucket_count: int = setting(1024, help="buckets in the dispatch table", min=1, max=65536)
    failover_after: float = setting(
        0.3, help="seconds without a heartbeat before a node's buckets move", min=0.01, max=60.0
    )
    tick: float = setting(0.05, help="seconds between the controller's decisions", min=0.01)
    weight_floor: float = setting(
        0.05,
        help="a fully loaded node keeps this share of a free node's weight",
        min=0.001,
        max=1.0,
    )
    smoothing: float = setting(
        0.3, help="weight of the newest utilization sample (1: no smoothing)", min=0.001, max=1.0
    )
    rebalance_threshold: float = setting(
        0.05, help="fraction of buckets a weight change must move to be made", min=0.0, max=1.0
    )
    join_after: float = setting(
        1.0, help="seconds a node (back) in service must stay alive before it joins", min=0.0
    )
    push_timeout: float = setting(1.0, help="seconds a table push may take", min=0.01)
    capacity_spread: float = setting(
        4.0,
        help="a node's reported max_concurrency counts for at most this multiple of the live "
        "nodes' median (a node agent that claimed 10^9 would draw nearly every connection); "
        "raise it for nodes that differ more, or configure nodes' max_concurrency",
        min=1.0,
        max=1e9,
    )
    ca_file: FileReference | None = setting(
        None,
        help="CA certificate(s) that node agents' https:// listeners are verified with (null: "
        "the system's trust store)",
    )
    allow_plaintext: bool = setting(
        False,
        help="push tables (and their token) in clear text to http:// agent URLs beyond this "
        "host (only on a network you trust)",
    )

    def config_problems(self) -> Iterator[str]:
        try:
            ipaddress.IPv4Address(self.vip)
        except ValueError:
            yield f"vip: {self.vip!r} is not an IPv4 address (clusters are IPv4 only)"
        for index, node in enumerate(self.nodes):
            url = node.agent_url
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                yield f"nodes[{index}].agent_url: {url!r} is not an http(s) URL"
            elif problem := plaintext_url_problem(
                f"nodes[{index}].agent_url", url, self.allow_plaintext
            ):
                yield problem
        if problem := ca_file_problem(self.ca_file):
            yield problem
        ids = [node.id for node in self.nodes]
        if len(set(ids)) != len(ids):
            yield "nodes: node ids must be unique"
        if not self.nodes:
            yield "nodes: at least one node"

    def settings(self) -> ClusterSettings:
        """The controller's settings (secrets revealed here, for the pushes)."""
        return ClusterSettings(
            name=self.name,
            vip=self.vip,
            nodes=tuple(
                ClusterNode(
                    node.id, node.agent_url.rstrip("/"), node.token.reveal(), node.max_concurrency
                )
                for node in self.nodes
            ),
            seed=self.seed,
            bucket_count=self.bucket_count,
            failover_after=self.failover_after,
            weight_floor=self.weight_floor,
            smoothing=self.smoothing,
            rebalance_threshold=self.rebalance_threshold,
            join_after=self.join_after,
            push_timeout=self.push_timeout,
            capacity_spread=self.capacity_spread,
        )


@dataclass(frozen=True, slots=True)
class MemberConfig:
    """A server that is always in the pool (a static member)."""

    id: str = setting(help="unique server id; its agent reports under this id")
    address: str = setting(help="the address answered in DNS (IPv4 or IPv6)")
    check_address: str | None = setting(
        None, help="address health checks connect to (default: address)"
    )
    max_concurrency: int | None = setting(
        None, help="requests it can serve at once (default: what its agent reports)", min=1
    )
    token: Secret | None = setting(None, help="this server's own agent token")
    cluster: str | None = setting(
        None, help="a single-IP cluster (clusters[].name): its nodes' load is this member's load"
    )
    location: str | None = setting(
        None, help="its region or site, matched against the pool's networks (docs/topology.md)"
    )

    def config_problems(self) -> Iterator[str]:
        if problem := id_problem(self.id):
            yield f"id: {problem}"
        if self.location is not None and (problem := location_problem(self.location)):
            yield f"location: {problem}"
        if problem := address_problem(self.address):
            yield f"address: {problem} (DNS answers carry no %scope)"
        if self.check_address is not None:
            try:
                ipaddress.ip_address(self.check_address)
            except ValueError:
                yield f"check_address: {show(self.check_address)} is not an IP address"
            else:
                if problem := text_problem(self.check_address, ascii_only=True):
                    yield f"check_address: {problem}"


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """Clients in a network are in a location (docs/topology.md)."""

    network: str = setting(help="client network, IPv4 or IPv6, without host bits: 10.0.0.0/8")
    location: str = setting(help="the location of its clients (members' location)")

    def config_problems(self) -> Iterator[str]:
        if problem := network_problem(self.network):
            yield f"network: {problem}"
        if problem := location_problem(self.location):
            yield f"location: {problem}"


@dataclass(frozen=True, slots=True)
class GeoIpConfig:
    """Clients no network holds, located with a MaxMind-format database (docs/topology.md)."""

    database: str = setting(help="absolute path (*.mmdb) of the database on every DNS server")
    locations: Mapping[str, str] = setting(
        help="countries (FR) and regions (US-CA) by location; a region wins over its country"
    )

    def config_problems(self) -> Iterator[str]:
        if problem := geoip_path_problem(self.database):
            yield f"database: {problem}"
        if len(self.locations) > MAX_GEOIP_CODES:
            yield f"locations: at most {MAX_GEOIP_CODES}, not {len(self.locations)}"
        for code, location in self.locations.items():
            if not GEOIP_CODE.match(code):
                yield f"locations: {show(code)} is not a country (FR) or region (US-CA)"
            if problem := location_problem(location):
                yield f"locations.{code}: {problem}"

    def plan_geoip(self) -> GeoIp:
        return GeoIp(self.database, tuple(sorted(self.locations.items())))


@functools.lru_cache(maxsize=256)
def _plan_networks(networks: tuple[NetworkConfig, ...]) -> tuple[Network, ...]:
    return tuple(Network(str(ipaddress.ip_network(n.network)), n.location) for n in networks)


@dataclass(frozen=True, slots=True)
class LifecycleConfig:
    """Timeouts of a pool's servers."""

    warming_timeout: float = setting(
        300.0, help="seconds from launch to a healthy report before the server is replaced", min=1.0
    )
    drain_timeout: float = setting(
        600.0, help="longest drain: terminate even with requests still in progress", min=0.0
    )
    describe_interval: float = setting(
        2.0, help="seconds between provider status checks while a server boots", min=0.05
    )
    max_failed_launches: int = setting(
        3, help="failed launches in a row before launching pauses", min=1
    )
    launch_backoff: float = setting(
        300.0,
        help="longest pause of launching after max_failed_launches failures in a row",
        min=0.0,
    )
    launch_backoff_start: float = setting(
        15.0,
        help="first pause of launching after max_failed_launches failures in a row; it doubles "
        "at each pause until a launch works, up to launch_backoff",
        min=0.0,
    )
    replace_after: float = setting(
        600.0,
        help="a launched server down this long is terminated (and replaced if needed); 0: never",
        min=0.0,
    )
    reconcile_interval: float = setting(
        60.0, help="seconds between comparisons of the provider's servers with the state", min=1.0
    )
    adopt_unknown: bool = setting(
        False,
        help="servers the provider runs for the pool but the state does not know: adopt them "
        "(true) or terminate them (false)",
    )


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """A load-balanced name and the servers behind it."""

    name: str = setting(help="pool name; its DNS name is NAME.ZONE ('@': the zone apex)")
    zone: str = setting(help="the zone the name is in (one of zones[].name)")
    policy: PoolPolicy = setting(default_factory=PoolPolicy, help="load policy")
    members: tuple[MemberConfig, ...] = setting(default_factory=tuple, help="static members")
    health_check: HealthCheckConfig | None = setting(
        None, help="active health check, run centrally by the manager"
    )
    provider: ProviderConfig | None = setting(
        None,
        help="launches and terminates servers (local, docker, ec2, openstack); none: members only",
    )
    scaling: ScalingPolicy | None = setting(
        None, help="autoscaling; needs a provider that launches servers"
    )
    lifecycle: LifecycleConfig = setting(
        default_factory=LifecycleConfig, help="timeouts of launched servers"
    )
    location: str | None = setting(
        None, help="the region or site of the servers the provider launches (docs/topology.md)"
    )
    answers_for: str | None = setting(
        None,
        help="another pool of the same zone whose name this pool's servers answer for: a "
        "location of that pool with its own provider and autoscaling (docs/topology.md)",
    )
    networks: tuple[NetworkConfig, ...] = setting(
        default_factory=tuple,
        help="client networks by location: clients are answered first by their location's "
        "members (docs/topology.md)",
    )
    geoip: GeoIpConfig | None = setting(
        None, help="a MaxMind-format database locating the clients no network holds"
    )
    capacity_spread: float = setting(
        4.0,
        help="a server's reported max_concurrency counts for at most this multiple of the "
        "pool's median (an agent that claimed 10^9 would draw nearly every answer); raise it "
        "for a pool whose servers differ more, or configure members' max_concurrency, which is "
        "not bounded",
        min=1.0,
        max=1e9,
    )

    def plan_networks(self) -> tuple[Network, ...]:
        """The networks as the plan carries them (normalized; computed once per config)."""
        return _plan_networks(self.networks)

    @property
    def dns_name(self) -> str:
        """The name it answers: its own, or with ``answers_for`` the other pool's."""
        zone = normalize(self.zone)
        name = self.answers_for or self.name
        return zone if name == "@" else f"{normalize(name)}.{zone}"

    def config_problems(self) -> Iterator[str]:
        if self.name != "@" and (problem := name_problem(normalize(self.name))):
            yield f"name: {self.name!r}: {problem}"
        if self.scaling is not None and self.provider is None:
            yield "scaling: needs a provider that launches servers"
        if self.location is not None and (problem := location_problem(self.location)):
            yield f"location: {problem}"
        if self.answers_for is not None:
            if self.location is None:
                yield "answers_for: needs the location of this pool's servers"
            if self.networks or self.geoip is not None:
                yield (
                    f"answers_for: the networks and geoip of {self.answers_for!r} apply; "
                    "give them there"
                )
        if len(self.networks) > MAX_NETWORKS:
            yield f"networks: at most {MAX_NETWORKS}, not {len(self.networks)}"
        networks = [network.network for network in self.networks]
        if len(set(networks)) != len(networks):
            yield "networks: a network is listed twice"
        seen: set[str] = set()
        for member in self.members:
            if member.id in seen:
                yield f"members: duplicate id {member.id!r}"
            seen.add(member.id)


RUNTIME_PROVIDERS = ("static", "memory", "ec2", "openstack")
"""Providers a pool made through the API may use unless ``runtime_pools.providers`` says more:
``local`` runs processes on the manager's host and ``docker`` drives its Docker engine (root on
the host), so an API token must not reach them unless the operator says so."""

LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))


@dataclass(frozen=True, slots=True)
class RuntimePoolsConfig:
    """What a pool created or changed through the API may do. A pool in this file may do
    anything: whoever writes the file owns the host; an admin API token should not."""

    providers: tuple[str, ...] = setting(
        RUNTIME_PROVIDERS,
        help="providers API-made pools may use (add local or docker only if admin API tokens "
        "may run processes or containers on this host)",
    )
    file_secrets: bool = setting(
        False,
        help="let API-made pools name secrets as file:PATH (read as the manager's user); "
        "default: env: references only",
    )
    link_local_checks: bool = setting(
        False,
        help="let API-made pools health-check link-local addresses (169.254.0.0/16, fe80::/10, "
        "where clouds serve instance metadata and credentials)",
    )

    def config_problems(self) -> Iterator[str]:
        known = tuple(ProviderConfig.plugins())
        for name in self.providers:
            if name not in known:
                yield f"providers: {name!r} is not one of {', '.join(known)}"

    @property
    def refuse_files(self) -> str | None:
        """Why ``file:`` secrets in API documents are refused (None: they are allowed); they are
        refused while the document is read, before any file is opened."""
        if self.file_secrets:
            return None
        return (
            "pools made through the API name secrets as env:NAME "
            "(runtime_pools.file_secrets allows file:)"
        )

    def pool_problems(self, pool: PoolConfig) -> Iterator[str]:
        """Why a pool made through the API may not be as it is (nothing: it may)."""
        if pool.answers_for is not None:
            yield "answers_for: only pools in the manager's configuration file may use it"
        if pool.provider is not None and pool.provider.type not in self.providers:
            yield (
                f"provider: {pool.provider.type!r} pools cannot be made through the API "
                f"(runtime_pools.providers in the manager's configuration allows "
                f"{', '.join(self.providers)})"
            )
        if not self.link_local_checks and pool.health_check is not None:
            for index, member in enumerate(pool.members):
                target = ipaddress.ip_address(
                    (member.check_address or member.address).split("%")[0]
                )
                if any(target in network for network in LINK_LOCAL):
                    yield (
                        f"members[{index}]: health checks of the link-local address {target} "
                        "(cloud metadata) are refused for pools made through the API "
                        "(runtime_pools.link_local_checks allows them)"
                    )


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    """The manager's whole configuration."""

    zones: tuple[ZoneConfig, ...] = setting(help="zones answered")
    pools: tuple[PoolConfig, ...] = setting(default_factory=tuple, help="load-balanced names")
    clusters: tuple[ClusterConfig, ...] = setting(
        default_factory=tuple, help="single-IP clusters behind pool members"
    )
    http: HttpConfig = setting(default_factory=HttpConfig, help="HTTP listener")
    auth: AuthConfig = setting(default_factory=AuthConfig, help="tokens")
    plan: PlanConfig = setting(default_factory=PlanConfig, help="plan publishing")
    state: StateConfig = setting(default_factory=StateConfig, help="durable state")
    tick: float = setting(1.0, help="seconds between plan rebuilds", min=0.05, max=60.0)
    down_after: float = setting(
        3.0, help="a server whose agent has not reported for this long is down", min=0.1
    )
    runtime_pools: RuntimePoolsConfig = setting(
        default_factory=RuntimePoolsConfig,
        help="limits of pools created or changed through the API",
    )

    def config_problems(self) -> Iterator[str]:
        zones = {normalize(zone.name) for zone in self.zones}
        names: set[str] = set()
        ids: dict[str, str] = {}
        for pool in self.pools:
            if normalize(pool.zone) not in zones:
                yield f"pools: pool {pool.name!r} names zone {pool.zone!r}, which is not configured"
            if pool.name in names:
                yield f"pools: duplicate pool name {pool.name!r}"
            names.add(pool.name)
            for member in pool.members:
                if member.id in ids:
                    yield (
                        f"pools: server id {member.id!r} is in both {ids[member.id]!r} "
                        f"and {pool.name!r}"
                    )
                ids[member.id] = pool.name
        yield from _location_pool_problems(self.pools)
        if not self.zones:
            yield "zones: at least one zone is needed"
        clusters = {cluster.name: cluster for cluster in self.clusters}
        if len(clusters) != len(self.clusters):
            yield "clusters: cluster names must be unique"
        used: set[str] = set()
        for pool in self.pools:
            for member in pool.members:
                if member.cluster is None:
                    continue
                cluster = clusters.get(member.cluster)
                if cluster is None:
                    yield f"pools: member {member.id!r} names cluster {member.cluster!r}: not found"
                    continue
                if member.address != cluster.vip:
                    yield (
                        f"pools: member {member.id!r} has address {member.address}, but cluster "
                        f"{cluster.name!r} has vip {cluster.vip}"
                    )
                used.add(cluster.name)
        for cluster in self.clusters:
            for node in cluster.nodes:
                if node.id in ids:
                    yield f"clusters: node id {node.id!r} is also a server id"
            if cluster.name not in used:
                yield f"clusters: cluster {cluster.name!r} is not a member of any pool"
        api_tokens = {entry.token.reveal(): i for i, entry in enumerate(self.auth.api_tokens)}
        for pool in self.pools:
            for member in pool.members:
                if member.token is not None and member.token.reveal() in api_tokens:
                    index = api_tokens[member.token.reveal()]
                    yield (
                        f"auth: api_tokens[{index}] is also the token of server {member.id!r}; "
                        "agents and the API need different tokens"
                    )


def _location_pool_problems(pools: Sequence[PoolConfig]) -> Iterator[str]:
    """Pools answering for another (``answers_for``): it exists, in the same zone, answers for
    itself, and has the same policy (one set of answers: one k, TTL range, fallback...); each
    location once."""
    by_name = {pool.name: pool for pool in pools}
    locations: dict[str, set[str | None]] = {}
    for pool in pools:
        if pool.answers_for is None:
            continue
        lead = by_name.get(pool.answers_for)
        where = f"pools: pool {pool.name!r} answers_for {pool.answers_for!r}"
        if lead is None or lead is pool:
            yield f"{where}: no such other pool"
            continue
        if lead.answers_for is not None:
            yield f"{where}, which answers for {lead.answers_for!r}: name that pool instead"
            continue
        if normalize(lead.zone) != normalize(pool.zone):
            yield f"{where}: both must be in one zone ({pool.zone!r} and {lead.zone!r})"
        if pool.policy != lead.policy:
            yield f"{where}: its policy must be the same as {lead.name!r}'s (one set of answers)"
        if lead.location is None:
            yield f"{where}: {lead.name!r} needs a location too (its servers are one)"
        seen = locations.setdefault(lead.name, {lead.location})
        if pool.location in seen:
            yield f"{where}: location {pool.location!r} is already one of {lead.name!r}'s pools"
        seen.add(pool.location)


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A configuration and the directory its relative paths are resolved against."""

    config: ManagerConfig
    base: Path
    source: str = "the configuration file"

    def path(self, value: str) -> Path:
        path = Path(value)
        return path if path.is_absolute() else self.base / path


def load_manager_config(path: str | Path, *, advertise_url: str | None = None) -> LoadedConfig:
    """Load ``path``; a :class:`~dnslb.errors.ConfigError` lists every problem. With
    ``advertise_url`` (``dnslb manager --advertise-url``), that is this manager's
    ``http.advertise_url``: managers in active/standby share one file, each its own URL."""
    config = load_config(path, ManagerConfig)
    if advertise_url is not None:
        http = dataclasses.replace(config.http, advertise_url=advertise_url)
        parts = urlsplit(advertise_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems = [f"{advertise_url[:100]!r} is not an http(s) URL"]
        else:  # the file's own rule for http.advertise_url
            plaintext = plaintext_url_problem("advertise_url", advertise_url, http.allow_plaintext)
            problems = [plaintext] if plaintext else []
        if problems:
            raise ConfigError("--advertise-url", problems)
        config = dataclasses.replace(config, http=http)
    return LoadedConfig(config=config, base=Path(path).resolve().parent, source=str(path))
