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
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dnslb.config import parse_config, to_document
from dnslb.errors import ConfigError
from dnslb.policy import PoolPolicy
from dnslb.scaling import ScalingPolicy
from lab.objects import ObjectCatalog

LAB_ZONE = "lab.test"
LAB_POOL = "www"


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
        boot_time=10.0,
        max_step=2,
    )


@dataclass(frozen=True, slots=True)
class LabSettings:
    """One lab run. Every address is on loopback; ``workdir`` holds every file it writes."""

    workdir: Path
    dns_port: int = 5300
    api_port: int = 8700
    http_port: int = 8080  # every cache server listens on it, each on its own 127.0.1.x
    origin_port: int = 8000
    network: str = "127.0.1"
    zone: str = LAB_ZONE
    pool: str = LAB_POOL
    boot_delay: float = 10.0
    capacity_rps: float = 20.0
    max_concurrency: int = 12
    send_rate: int = 16384
    send_chunk: int = 2048
    objects: ObjectCatalog = field(default_factory=ObjectCatalog)
    max_age: int = 600
    policy: PoolPolicy = field(default_factory=default_policy)
    scaling: ScalingPolicy = field(default_factory=default_scaling)
    sample_interval: float = 1.0  # seconds between samples of the published plan

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
    def mean_service_time(self) -> float:
        """Seconds a cache server spends on an average object (paced sending)."""
        return max(0.0, self.objects.mean_size - self.send_chunk) / self.send_rate

    def problems(self) -> Iterator[str]:
        """What is wrong with these settings, one line each, naming the option."""
        ports = {
            "--dns-port": self.dns_port,
            "--api-port": self.api_port,
            "--http-port": self.http_port,
            "--origin-port": self.origin_port,
        }
        for option, port in ports.items():
            if not 1 <= port <= 65535:
                yield f"{option} {port}: must be 1 to 65535"
        loopback = {
            option: port
            for option, port in ports.items()
            if option in ("--dns-port", "--api-port", "--origin-port")
        }
        seen: dict[int, str] = {}
        for option, port in loopback.items():
            if port in seen:
                yield f"{option} {port}: the same port as {seen[port]} (both on 127.0.0.1)"
            seen.setdefault(port, option)
        try:
            first = ipaddress.IPv4Address(f"{self.network}.1")
        except ValueError:
            yield f"--network {self.network!r}: must be three octets, like 127.0.1"
        else:
            if not first.is_loopback:
                yield f"--network {self.network}: must be on loopback (127.x.y)"
            elif self.network == "127.0.0":
                yield "--network 127.0.0: taken by the lab's own services; use 127.0.1"
        if self.boot_delay < 0:
            yield f"--boot-delay {self.boot_delay:g}: must be 0 or more"
        if self.capacity_rps <= 0:
            yield f"--capacity-rps {self.capacity_rps:g}: must be above 0"
        if self.max_concurrency < 1:
            yield f"--max-concurrency {self.max_concurrency}: must be at least 1"
        if self.send_rate < 1:
            yield f"--send-rate {self.send_rate}: must be at least 1 byte a second"
        if self.objects.mean_size <= self.send_chunk:
            yield (
                f"object mean size {self.objects.mean_size} must exceed the send chunk "
                f"{self.send_chunk}: smaller responses leave at once"
            )
        yield from self.objects.config_problems()
        for what, value in (("policy", self.policy), ("scaling", self.scaling)):
            yield from _config_problems(what, value)


_OPTIONS = {
    "policy": ("k", "ttl_max", "ttl_min", "th_over"),
    "scaling": ("min_servers", "max_servers"),
}
_PROBLEM = re.compile(r"^(?P<what>\w+)(?:, line \d+)?: (?:(?P<key>\w+): )?(?P<text>.*)$")


def _config_problems(what: str, value: object) -> Iterator[str]:
    """The problems the manager would find in ``value`` (bounds, combinations): built back from
    its document by the same loader as the manager's configuration. A key that ``dnslb lab``
    has an option for is named by the option (``--k: must be at least 1, not 0``)."""
    try:
        parse_config(json.dumps(to_document(value)), type(value), source=what)
    except ConfigError as exc:
        for problem in exc.problems:
            match = _PROBLEM.match(problem)
            if match is None:
                yield problem
                continue
            key, text = match.group("key"), match.group("text")
            if key in _OPTIONS.get(what, ()):
                yield f"--{key.replace('_', '-')}: {text}"
            elif key:
                yield f"{what}.{key}: {text}"
            else:
                yield f"{what}: {text}"


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
    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def with_policy(settings: LabSettings, **changes: Any) -> LabSettings:
    """``settings`` with policy fields changed (``k=1``, ``ttl_max=30``...)."""
    return dataclasses.replace(settings, policy=dataclasses.replace(settings.policy, **changes))
