"""How busy a cluster node is: its TCP connections to the VIP, read from ``/proc/net/tcp``.

A node of a single-IP cluster serves whatever listens on the VIP. Its load for the manager is
the number of established connections to the VIP (``in_progress``) over the configured maximum
(``max_concurrency``). When service ports are configured and none has a listening socket, the
node is not serving: the report says so in ``error`` and the manager moves its buckets away.
``/proc/net/tcp`` is per network namespace, so this reads the namespace the agent runs in.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC_NET_TCP = Path("/proc/net/tcp")
TCP_ESTABLISHED = 0x01
TCP_LISTEN = 0x0A
_ANY = "0.0.0.0"  # noqa: S104 - a listener bound to every address, not a bind of ours


@dataclass(frozen=True, slots=True)
class Socket:
    """One line of ``/proc/net/tcp``: local address and port, and the TCP state."""

    address: str
    port: int
    state: int


@dataclass(frozen=True, slots=True)
class VipLoad:
    """What the node reports: connections in progress, and why it is not serving (or None)."""

    in_progress: int
    error: str | None


def _address(hex_word: str) -> str:
    # The kernel prints the address as a 32-bit word in host byte order.
    return str(ipaddress.IPv4Address(struct.pack("=I", int(hex_word, 16))))


def parse_proc_net_tcp(text: str) -> Iterator[Socket]:
    """The sockets listed in a ``/proc/net/tcp`` text; malformed lines are skipped."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or ":" not in fields[1]:
            continue
        address, _, port = fields[1].partition(":")
        try:
            yield Socket(_address(address), int(port, 16), int(fields[3], 16))
        except ValueError:
            continue


def measure(text: str, vip: str, service_ports: tuple[int, ...]) -> VipLoad:
    """The load of the node whose ``/proc/net/tcp`` reads ``text`` (pure)."""
    in_progress = 0
    listening: set[int] = set()
    for sock in parse_proc_net_tcp(text):
        if sock.state == TCP_ESTABLISHED and sock.address == vip:
            if not service_ports or sock.port in service_ports:
                in_progress += 1
        elif sock.state == TCP_LISTEN and sock.address in (vip, _ANY):
            listening.add(sock.port)
    missing = [port for port in service_ports if port not in listening]
    if service_ports and len(missing) == len(service_ports):
        ports = ", ".join(str(port) for port in service_ports)
        return VipLoad(in_progress, f"nothing listens on {vip} port {ports}")
    return VipLoad(in_progress, None)


class VipConnections:
    """Reads the node's load from ``/proc/net/tcp`` on each call."""

    def __init__(
        self, vip: str, service_ports: tuple[int, ...] = (), source: Path = PROC_NET_TCP
    ) -> None:
        self.vip = vip
        self.service_ports = service_ports
        self.source = source

    def __call__(self) -> VipLoad:
        try:
            text = self.source.read_text()
        except OSError as exc:
            return VipLoad(0, f"cannot read {self.source}: {exc.strerror}")
        return measure(text, self.vip, self.service_ports)
