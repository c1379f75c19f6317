"""What a lab runs with, and the manager configuration it generates from that.

:class:`LabSettings` holds every knob of a lab run (ports, the cache servers' emulated capacity,
the pool's policy and autoscaling); :func:`manager_config` renders the ``manager.yaml`` the lab's
manager reads. Both are pure. The defaults are the calibration of ``docs/lab.md``
(``bench/lab_capacity.py`` measures it): a cache server starts at most ``capacity_rps`` requests
a second and spends on each a time proportional to the object's size (0.57 s on average as
measured, 0.5 s of paced sending plus nginx's own), so that ``max_concurrency`` = 20/s x 0.57 s
~ 12 requests are in progress at full load, and more than that wait in its queue.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnslb.config import default_of, setting, to_document
from dnslb.policy import PoolPolicy
from dnslb.scaling import ScalingPolicy
from lab.objects import ObjectCatalog
from lab.origin import OriginSettings

LAB_ZONE = "lab.test"
LAB_POOL = "www"
BOOT_DELAY = 10.0
"""Seconds a cache server of the lab takes to boot (the local provider waits that long), and so
what the autoscaler expects a launch to take."""


def default_workdir() -> Path:
    """``$XDG_STATE_HOME/dnslb/lab`` (``~/.local/state/dnslb/lab``): outside any checkout."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dnslb" / "lab"


def default_policy() -> PoolPolicy:
    """The product's default policy (the simulator chose it)."""
    return PoolPolicy()


def default_scaling() -> ScalingPolicy:
    """Autoscaling sized for a 2-core machine: 1 to 4 servers, decisions in seconds."""
    return ScalingPolicy(
        min_servers=1,
        max_servers=4,
        th_high=0.7,
        th_low=0.3,
        window=10.0,
        scale_in_window=30.0,
        boot_time=BOOT_DELAY,
        max_step=2,
    )


_PORT = {"min": 1, "max": 65535}


@dataclass(frozen=True, slots=True)
class LabSettings:
    """One lab run. Every address is on loopback; ``workdir`` holds every file it writes.

    Validate settings built in code with :func:`dnslb.config.checked` (:meth:`Lab.start
    <lab.runner.Lab.start>` does): bounds, and :meth:`config_problems` across fields.
    """

    workdir: Path = setting(
        default_factory=default_workdir, help="the lab's directory, every file of a run"
    )
    dns_port: int = setting(5300, help="DNS port on 127.0.0.1", **_PORT)
    api_port: int = setting(8700, help="manager: API, dashboard, metrics", **_PORT)
    http_port: int = setting(
        8080, help="port of every cache server (each on its own NETWORK.N)", **_PORT
    )
    origin_port: int = setting(
        default_of(OriginSettings, "port"), help="origin port on 127.0.0.1", **_PORT
    )
    network: str = setting("127.0.1", help="cache servers' addresses NETWORK.1, .2...")
    zone: str = setting(LAB_ZONE, help="the lab's DNS zone")
    pool: str = setting(LAB_POOL, help="the pool, and the name clients resolve in the zone")
    boot_delay: float = setting(BOOT_DELAY, help="seconds a cache server takes to boot", min=0.0)
    capacity_rps: float = setting(
        20.0, help="requests a cache server starts a second at most (above 0)", min=0
    )
    max_concurrency: int = setting(12, help="requests a cache server serves at once", min=1)
    send_rate: int = setting(16384, help="bytes a second a response is sent at", min=1)
    send_chunk: int = setting(2048, help="bytes of a paced write", min=1)
    objects: ObjectCatalog = setting(default_factory=ObjectCatalog, help="what the origin serves")
    max_age: int = setting(
        default_of(OriginSettings, "max_age"), help="Cache-Control max-age of objects", min=0
    )
    policy: PoolPolicy = setting(default_factory=default_policy, help="the pool's policy")
    scaling: ScalingPolicy = setting(default_factory=default_scaling, help="its autoscaling")
    resolvers: int = setting(
        4,
        help="caching resolvers (unbound) users ask, on RESOLVER_NETWORK.N at the DNS port "
        "(0: users ask pdns directly)",
        min=0,
        max=16,
    )
    resolver_network: str = setting("127.0.2", help="resolvers' addresses NETWORK.1, .2...")
    rrset_roundrobin: bool = setting(
        False, help="resolvers rotate a cached answer's order for each client (unbound's option)"
    )
    sample_interval: float = setting(
        1.0, help="seconds between samples of the published plan and the manager's API", min=0.05
    )

    @property
    def dns_name(self) -> str:
        """The load-balanced name clients resolve."""
        return f"{self.pool}.{self.zone}"

    @property
    def manager_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def origin_url(self) -> str:
        return f"http://127.0.0.1:{self.origin_port}"

    @property
    def origin(self) -> OriginSettings:
        """The settings of the lab's origin."""
        return OriginSettings(
            address="127.0.0.1", port=self.origin_port, objects=self.objects, max_age=self.max_age
        )

    @property
    def mean_service_time(self) -> float:
        """Seconds a cache server spends on an average object (paced sending)."""
        return max(0.0, self.objects.mean_size - self.send_chunk) / self.send_rate

    def config_problems(self) -> Iterator[str]:
        """Rules across fields (bounds are the fields' own)."""
        seen: dict[int, str] = {}
        for name in ("dns_port", "api_port", "origin_port"):  # all three on 127.0.0.1
            port = getattr(self, name)
            if port in seen:
                yield f"{name} {port}: the same port as {seen[port]} (both on 127.0.0.1)"
            seen.setdefault(port, name)
        try:
            first = ipaddress.IPv4Address(f"{self.network}.1")
        except ValueError:
            yield f"network {self.network!r}: must be three octets, like 127.0.1"
        else:
            if not first.is_loopback:
                yield f"network {self.network}: must be on loopback (127.x.y)"
            elif self.network == "127.0.0":
                yield "network 127.0.0: taken by the lab's own services; use 127.0.1"
        if self.resolvers:
            try:
                resolver = ipaddress.IPv4Address(f"{self.resolver_network}.1")
            except ValueError:
                yield f"resolver_network {self.resolver_network!r}: must be three octets"
            else:
                if not resolver.is_loopback or self.resolver_network in ("127.0.0", self.network):
                    yield (
                        f"resolver_network {self.resolver_network}: must be on loopback, "
                        "apart from 127.0.0 and the cache servers' network"
                    )
        if self.capacity_rps <= 0:
            yield f"capacity_rps {self.capacity_rps:g}: must be above 0"
        if self.objects.mean_size <= self.send_chunk:
            yield (
                f"object mean size {self.objects.mean_size} must exceed the send chunk "
                f"{self.send_chunk}: smaller responses leave at once"
            )


def manager_config(settings: LabSettings, *, api_token_file: Path | None) -> str:
    """The ``manager.yaml`` of a lab: one zone, one pool of local cache servers.

    ``api_token_file`` holds the token the REST API, metrics and dashboard accept (admin
    role); None leaves the API without tokens (it then refuses every call).
    """
    zone = settings.zone
    document: dict[str, Any] = {
        "zones": [
            {
                "name": zone,
                "ns": [f"ns1.{zone}"],
                "records": [{"name": f"ns1.{zone}", "type": "A", "content": "127.0.0.1"}],
                # negative answers cached briefly: the pool is empty until the first server boots
                "soa": {"minimum": 5},
            }
        ],
        "tick": 1.0,
        "down_after": 3.0,
        "http": {"address": "127.0.0.1", "port": settings.api_port},
        # republished every second so that the plan's age, and the lab's samples, stay fresh
        "plan": {"path": "plan.json", "refresh": 1.0, "stale_after": 30.0},
        "state": {"path": "state.db"},
        "pools": [
            {
                "name": settings.pool,
                "zone": zone,
                "policy": to_document(settings.policy),
                "provider": {
                    "type": "local",
                    "origin": settings.origin_url,
                    "network": settings.network,
                    "port": settings.http_port,
                    "boot_delay": settings.boot_delay,
                    "max_concurrency": settings.max_concurrency,
                    "capacity_rps": settings.capacity_rps,
                    "send_rate": settings.send_rate,
                    "send_chunk": settings.send_chunk,
                    "report_interval": 1.0,
                },
                "scaling": to_document(settings.scaling),
                "lifecycle": {
                    "warming_timeout": max(60.0, settings.boot_delay + 30.0),
                    # a drain waits for the longest TTL handed out, then for requests to end
                    "drain_timeout": settings.policy.ttl_max + 60.0,
                    "describe_interval": 0.5,
                    "reconcile_interval": 30.0,
                },
            }
        ],
    }
    if api_token_file is not None:
        document["auth"] = {"api_tokens": [{"token": f"file:{api_token_file}", "role": "admin"}]}
    header = (
        "# Generated by `dnslb lab` for one run; edits are lost at the next start.\n"
        "# Reference: docs/manager.md. What the lab runs: docs/lab.md.\n"
    )
    import yaml  # noqa: PLC0415 (PyYAML: only when a lab is started, not to build the parser)

    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def with_policy(settings: LabSettings, **changes: Any) -> LabSettings:
    """``settings`` with policy fields changed (``k=1``, ``ttl_max=30``...)."""
    return dataclasses.replace(settings, policy=dataclasses.replace(settings.policy, **changes))
