"""Sends one TCP SYN per JSON ``[saddr, sport]`` pair read on stdin, from any source address.

Run as root inside a network namespace: the packets go to DST:DPORT (argv) through the output
hook, where the test's nftables rules hash them. A rule that drops them makes ``sendto`` fail
with EPERM, which is expected and ignored.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import sys


def syn(saddr: str, daddr: str, sport: int, dport: int) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 5 << 4, 0x02, 1024, 0, 0)
    ip = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        40,
        0,
        0,
        64,
        socket.IPPROTO_TCP,
        0,
        socket.inet_aton(saddr),
        socket.inet_aton(daddr),
    )
    return ip + tcp


def main() -> None:
    daddr, dport = sys.argv[1], int(sys.argv[2])
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as raw:
        for saddr, sport in json.load(sys.stdin):
            with contextlib.suppress(PermissionError):
                raw.sendto(syn(saddr, daddr, sport, dport), (daddr, 0))


if __name__ == "__main__":
    main()
