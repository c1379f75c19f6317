"""Requests in progress as the established TCP connections to a local port.

Two ways to count, the same answer:

- **netlink** (Linux): one ``sock_diag`` dump per address family, filtered in the kernel to
  sockets on the port in state ESTABLISHED or LISTEN, so its cost grows with the connections
  on *this* port only (about 2 ms a read at none, 5 ms at 1,000 on the reference machine);
- **psutil** (elsewhere, or where netlink is refused): ``psutil.net_connections``, which also
  walks every process's file descriptors to find socket owners we do not need (11 ms a read at
  none, 48 ms at 1,000: 1-5 % of a core at one read a second).

Nothing listening on the port means the service is down: the reading says so.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter
from typing import Literal

import psutil

from agents.sources.base import Reading, Source
from dnslb.agent_config import PortSourceConfig
from dnslb.errors import SourceError

Method = Literal["netlink", "psutil"]

TCP_ESTABLISHED = 1
TCP_LISTEN = 10
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_INET_DIAG_REQ_BYTECODE = 1
_INET_DIAG_BC_S_EQ = 11
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_BYTECODE_OP = 4  # struct inet_diag_bc_op: code, yes, no


def diag_request(family: int, port: int, sequence: int = 1) -> bytes:
    """A ``SOCK_DIAG_BY_FAMILY`` dump request for TCP sockets on local ``port`` that are
    established or listening.

    The bytecode is one comparison, ``sport == port``: on a match it jumps to the end of the
    program (accept), otherwise one op past it (reject), as ``ss`` does.
    """
    states = (1 << TCP_ESTABLISHED) | (1 << TCP_LISTEN)
    # struct inet_diag_req_v2, its inet_diag_sockid left zero (no exact-socket lookup)
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, states) + bytes(48)
    # The comparison takes two ops (the second holds the port); the program is those two.
    program_length = 2 * _BYTECODE_OP
    bytecode = struct.pack("=BBH", _INET_DIAG_BC_S_EQ, program_length, program_length + 4)
    bytecode += struct.pack("=BBH", 0, 0, port)
    attribute = struct.pack("=HH", 4 + len(bytecode), _INET_DIAG_REQ_BYTECODE) + bytecode
    body = request + attribute
    header = _HEADER.pack(
        _HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, sequence, 0
    )
    return header + body


def count_diag_states(data: bytes, port: int, counts: Counter[int]) -> bool:
    """Add the TCP states of the ``inet_diag_msg`` records in ``data`` on local ``port`` to
    ``counts``; True when the dump is complete. Raises OSError for a netlink error record."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            raise OSError("malformed netlink message")
        if kind == _NLMSG_DONE:
            return True
        if kind == _NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", data, offset + _HEADER.size)
            raise OSError(-error, f"sock_diag: {_strerror(-error)}")
        if kind == _SOCK_DIAG_BY_FAMILY:
            # struct inet_diag_msg: family, state, timer, retrans, then the sockid whose first
            # field is the source port in network order.
            state = data[offset + _HEADER.size + 1]
            (local_port,) = struct.unpack_from("!H", data, offset + _HEADER.size + 4)
            if local_port == port:
                counts[state] += 1
        offset += (length + 3) & ~3
    return False


def _strerror(code: int) -> str:
    import os  # noqa: PLC0415

    return os.strerror(code)


def netlink_states(port: int, timeout: float = 1.0) -> Counter[int]:
    """TCP states of the sockets on local ``port`` (IPv4 and IPv6), asked of the kernel."""
    counts: Counter[int] = Counter()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as channel:
        channel.settimeout(timeout)
        for sequence, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            channel.sendto(diag_request(family, port, sequence), (0, 0))
            while not count_diag_states(channel.recv(65536), port, counts):
                pass
    return counts


def psutil_states(port: int) -> Counter[int]:
    """TCP states of the sockets on local ``port``, from ``psutil.net_connections``."""
    names = {psutil.CONN_ESTABLISHED: TCP_ESTABLISHED, psutil.CONN_LISTEN: TCP_LISTEN}
    counts: Counter[int] = Counter()
    for connection in psutil.net_connections("tcp"):
        if connection.laddr and connection.laddr.port == port and connection.status in names:
            counts[names[connection.status]] += 1
    return counts


class PortConnectionsSource(Source):
    """Counts the established connections to a local TCP port."""

    name = "port"

    def __init__(self, config: PortSourceConfig, method: Method | None = None) -> None:
        """``method`` None picks netlink where the kernel allows it, psutil otherwise."""
        super().__init__(config.max_concurrency)
        self.config = config
        self.method: Method | None = method

    def states(self) -> Counter[int]:
        """The TCP states on the port now; raises OSError or psutil.Error when it cannot tell."""
        if self.method is None:
            try:
                counts = netlink_states(self.config.port)
            except OSError:
                self.method = "psutil"
            else:
                self.method = "netlink"
                return counts
        if self.method == "netlink":
            return netlink_states(self.config.port)
        return psutil_states(self.config.port)

    async def measure(self) -> Reading:
        # A dump of one port's sockets takes a few ms: not worth a thread.
        try:
            counts = self.states()
        except (OSError, psutil.Error) as exc:
            raise SourceError(f"cannot list TCP sockets ({self.method}): {exc}") from None
        if not counts[TCP_LISTEN]:
            raise SourceError(f"nothing listens on TCP port {self.config.port}")
        return Reading(
            in_progress=counts[TCP_ESTABLISHED], max_concurrency=self.config.max_concurrency
        )

    def describe(self) -> str:
        return f"connections to TCP port {self.config.port}"
